//! Hashes: the config checksum that rolls the pods, the per-object spec hash
//! that lets the reconciler skip unchanged objects, and canonical JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Hash of an owned object as rendered (without this annotation).
pub const SPEC_HASH_ANNOTATION: &str = "haltsql.dev/spec-hash";

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes.as_ref()))
}

/// The config checksum: SHA-256 over the rendered files (in sorted key order)
/// and the sorted set of mounted `<secret>/<key>` pairs (names only: the
/// operator never sees the values).
///
/// Every part is length-prefixed, so no two different inputs share a byte
/// stream (a file name cannot run into its content, a file list cannot pass
/// for a secret list).
pub fn config_checksum(files: &BTreeMap<String, String>, mounted: &[(String, String)]) -> String {
    let mut h = Sha256::new();
    h.update(b"haltsql-config-checksum/v1\n");
    let mut mounted: Vec<&(String, String)> = mounted.iter().collect();
    mounted.sort();
    mounted.dedup();
    for (name, content) in files {
        frame(&mut h, b"file", &[name.as_bytes(), content.as_bytes()]);
    }
    for (secret, key) in mounted {
        frame(&mut h, b"secret", &[secret.as_bytes(), key.as_bytes()]);
    }
    hex::encode(h.finalize())
}

fn frame(h: &mut Sha256, tag: &[u8], parts: &[&[u8]]) {
    h.update(tag);
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
}

/// JSON with object keys sorted at every level and no insignificant
/// whitespace, so equal values always give equal bytes (whatever the map
/// type or serde_json's features).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(k) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        // Scalars: serde_json's own rendering is already canonical.
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

/// SHA-256 of an object as rendered, without the `haltsql.dev/spec-hash`
/// annotation (and without an annotation map that only held it).
pub fn spec_hash_of<K: Serialize>(obj: &K) -> String {
    let mut value = match serde_json::to_value(obj) {
        Ok(v) => v,
        // Not reachable for Kubernetes objects (string keys only); hash the
        // error so the result is still a well-formed digest.
        Err(e) => return sha256_hex(format!("unserializable object: {e}")),
    };
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        let now_empty = match meta.get_mut("annotations").and_then(Value::as_object_mut) {
            Some(annotations) => {
                annotations.remove(SPEC_HASH_ANNOTATION);
                annotations.is_empty()
            }
            None => false,
        };
        if now_empty {
            meta.remove("annotations");
        }
    }
    sha256_hex(canonical_json(&value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let v = json!({"b": [{"z": 1, "a": "x\"y"}], "a": null, "c": 1.5});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":null,"b":[{"a":"x\"y","z":1}],"c":1.5}"#
        );
    }

    #[test]
    fn checksum_frames_parts() {
        let files = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        // Moving bytes between a file name and its content changes the sum.
        assert_ne!(
            config_checksum(&files("ab", "c"), &[]),
            config_checksum(&files("a", "bc"), &[])
        );
        let m = |s: &str, k: &str| vec![(s.to_owned(), k.to_owned())];
        assert_ne!(
            config_checksum(&files("a", "b"), &m("s", "k1")),
            config_checksum(&files("a", "b"), &m("s", "k2"))
        );
        // Order and duplicates of the mounted pairs do not matter.
        let two = vec![
            ("b".to_owned(), "k".to_owned()),
            ("a".to_owned(), "k".to_owned()),
            ("a".to_owned(), "k".to_owned()),
        ];
        let sorted = vec![
            ("a".to_owned(), "k".to_owned()),
            ("b".to_owned(), "k".to_owned()),
        ];
        assert_eq!(
            config_checksum(&files("a", "b"), &two),
            config_checksum(&files("a", "b"), &sorted)
        );
    }

    #[test]
    fn spec_hash_ignores_only_its_own_annotation() {
        let bare = json!({"metadata": {"name": "x"}, "spec": {"a": 1}});
        let with_hash = json!({"metadata": {"name": "x", "annotations": {SPEC_HASH_ANNOTATION: "old"}}, "spec": {"a": 1}});
        let with_other =
            json!({"metadata": {"name": "x", "annotations": {"o": "1"}}, "spec": {"a": 1}});
        assert_eq!(spec_hash_of(&bare), spec_hash_of(&with_hash));
        assert_ne!(spec_hash_of(&bare), spec_hash_of(&with_other));
    }
}
