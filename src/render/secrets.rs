//! Secret references: `{secretKeyRef: {name, key}}` objects in raw sections,
//! token hashes and bundle credentials become `${file:...}` placeholders for
//! keys mounted into the pods. The operator never reads a Secret.

use std::collections::BTreeSet;

use haltsql_names::is_dns1123_subdomain;
use serde_json::{Map, Value};

use super::errors::RenderError;

/// Where Secret keys are mounted in the server container, one
/// `<secret>/<key>` file each (one projected volume).
pub const SECRETS_DIR: &str = "/var/run/haltsql/secrets";

/// The key of the reference object in raw sections.
pub const SECRET_KEY_REF: &str = "secretKeyRef";

/// Path of a mounted Secret key inside the pod.
pub fn secret_file_path(secret: &str, key: &str) -> String {
    format!("{SECRETS_DIR}/{secret}/{key}")
}

/// The haltsql placeholder that reads a mounted Secret key.
pub fn placeholder(secret: &str, key: &str) -> String {
    format!("${{file:{}}}", secret_file_path(secret, key))
}

/// A valid Secret data key (Kubernetes' rule): letters, digits, `-`, `_`,
/// `.`, not `.`/`..` or starting with `..`. This also keeps the mount path
/// inside the Secret's folder.
pub fn is_secret_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && s != "."
        && !s.starts_with("..")
}

/// The Secret keys a configuration needs, as `(secret, key)` pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretMounts {
    keys: BTreeSet<(String, String)>,
}

impl SecretMounts {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks the reference, records the key and returns its placeholder.
    /// `field` names the spec field in errors.
    pub fn mount(&mut self, field: &str, secret: &str, key: &str) -> Result<String, RenderError> {
        check_ref(field, secret, key)?;
        self.keys.insert((secret.to_owned(), key.to_owned()));
        Ok(placeholder(secret, key))
    }

    /// The recorded pairs, sorted.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.keys.iter().cloned().collect()
    }

    /// The recorded pairs, sorted, borrowed.
    pub fn iter(&self) -> impl Iterator<Item = &(String, String)> {
        self.keys.iter()
    }

    /// Whether no key is needed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Checks a Secret name and key; the error names `field`.
pub fn check_ref(field: &str, secret: &str, key: &str) -> Result<(), RenderError> {
    if !is_dns1123_subdomain(secret) {
        return Err(RenderError::InvalidSecretRef {
            field: field.to_owned(),
            message: format!(
                "{secret:?} is not a valid Secret name (a lower-case DNS-1123 subdomain)"
            ),
        });
    }
    if !is_secret_key(key) {
        return Err(RenderError::InvalidSecretRef {
            field: field.to_owned(),
            message: format!(
                "{key:?} is not a valid Secret key (letters, digits, '-', '_' and '.', not starting with '..')"
            ),
        });
    }
    Ok(())
}

/// How a reference object is recognised: exactly one key `secretKeyRef`
/// whose value has exactly the string fields `name` and `key`.
fn as_secret_key_ref(map: &Map<String, Value>) -> Option<(&str, &str)> {
    if map.len() != 1 {
        return None;
    }
    let inner = map.get(SECRET_KEY_REF)?.as_object()?;
    if inner.len() != 2 {
        return None;
    }
    let name = inner.get("name")?.as_str()?;
    let key = inner.get("key")?.as_str()?;
    Some((name, key))
}

/// Copies a raw section, replacing every `{secretKeyRef: {name, key}}`
/// object with the placeholder of that key and recording the key in
/// `mounts`. `field` is the section's spec path (for error messages).
///
/// A `secretKeyRef` key in any other shape is an error rather than a value
/// passed through: haltsql has no such key, and a half-written reference
/// must not turn into a literal credential.
pub fn substitute(
    value: &Value,
    field: &str,
    mounts: &mut SecretMounts,
) -> Result<Value, RenderError> {
    match value {
        Value::Object(map) => {
            if let Some((name, key)) = as_secret_key_ref(map) {
                let path = format!("{field}.{SECRET_KEY_REF}");
                return mounts.mount(&path, name, key).map(Value::String);
            }
            if map.contains_key(SECRET_KEY_REF) {
                return Err(RenderError::InvalidSecretRef {
                    field: format!("{field}.{SECRET_KEY_REF}"),
                    message: "a Secret reference must be an object of exactly the form {secretKeyRef: {name: <secret>, key: <key>}} (string name and key, nothing else)".to_owned(),
                });
            }
            let mut out = Map::new();
            for (k, v) in map {
                out.insert(k.clone(), substitute(v, &join(field, k), mounts)?);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| substitute(v, &format!("{field}[{i}]"), mounts))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other.clone()),
    }
}

/// Substitutes in a raw object (a `RawObject` section).
pub fn substitute_object(
    object: &Map<String, Value>,
    field: &str,
    mounts: &mut SecretMounts,
) -> Result<Value, RenderError> {
    substitute(&Value::Object(object.clone()), field, mounts)
}

/// `a.b`, or `a["b.c"]` when the key would not read as one path segment.
fn join(field: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
    if plain {
        format!("{field}.{key}")
    } else {
        format!("{field}[{key:?}]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replaces_exact_references_anywhere() {
        let mut mounts = SecretMounts::new();
        let raw = json!({
            "type": "kafka",
            "sasl": {"username": "u", "password": {"secretKeyRef": {"name": "kafka-credentials", "key": "password"}}},
            "list": [{"secretKeyRef": {"name": "a", "key": "k.1"}}, "plain"],
        });
        let out = substitute(&raw, "spec.audit.sinks[0]", &mut mounts).unwrap();
        assert_eq!(
            out,
            json!({
                "type": "kafka",
                "sasl": {"username": "u", "password": "${file:/var/run/haltsql/secrets/kafka-credentials/password}"},
                "list": ["${file:/var/run/haltsql/secrets/a/k.1}", "plain"],
            })
        );
        assert_eq!(
            mounts.pairs(),
            vec![
                ("a".to_owned(), "k.1".to_owned()),
                ("kafka-credentials".to_owned(), "password".to_owned())
            ]
        );
    }

    #[test]
    fn rejects_malformed_references() {
        for (raw, msg) in [
            (
                json!({"p": {"secretKeyRef": {"name": "a"}}}),
                "spec.x.p.secretKeyRef: a Secret reference must be an object of exactly the form",
            ),
            (
                json!({"p": {"secretKeyRef": {"name": "a", "key": "k"}, "other": 1}}),
                "spec.x.p.secretKeyRef: a Secret reference must be",
            ),
            (
                json!({"p": {"secretKeyRef": {"name": "a", "key": 1}}}),
                "spec.x.p.secretKeyRef: a Secret reference must be",
            ),
            (
                json!({"p": {"secretKeyRef": {"name": "A_b", "key": "k"}}}),
                "spec.x.p.secretKeyRef: \"A_b\" is not a valid Secret name",
            ),
            (
                json!({"p": {"secretKeyRef": {"name": "a", "key": "../etc"}}}),
                "spec.x.p.secretKeyRef: \"../etc\" is not a valid Secret key",
            ),
            (
                json!({"p": [{"secretKeyRef": {"name": "a", "key": ".."}}]}),
                "spec.x.p[0].secretKeyRef: \"..\" is not a valid Secret key",
            ),
        ] {
            let err = substitute(&raw, "spec.x", &mut SecretMounts::new()).unwrap_err();
            assert!(err.to_string().starts_with(msg), "{err} / {msg}");
        }
    }

    #[test]
    fn keys_and_names() {
        assert!(is_secret_key("orders-agent.sha256"));
        assert!(is_secret_key(".dotfile"));
        assert!(!is_secret_key("a/b"));
        assert!(!is_secret_key("..a"));
        assert!(!is_secret_key(""));
        assert!(is_dns1123_subdomain("haltsql-tokens"));
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain("-a"));
    }
}
