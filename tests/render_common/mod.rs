//! Shared helpers of the render tests: fixtures, golden files, and running
//! the real `haltsql validate` on a rendered pod file layout.
#![allow(dead_code)] // each test crate uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLPolicySpec, HaltSQLServer};
use haltsql_operator::render::{self, PolicyInput, Rendered, content_hash};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// `tests/golden/render`.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/render")
}

/// A fixture: the server and the policies it references.
pub struct Fixture {
    pub server: HaltSQLServer,
    pub policies: Vec<HaltSQLPolicy>,
}

/// Reads a multi-document YAML fixture (HaltSQLPolicy and HaltSQLServer).
pub fn load_fixture_str(text: &str) -> Fixture {
    let mut server = None;
    let mut policies = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(doc).expect("fixture YAML");
        match value.get("kind").and_then(|k| k.as_str()) {
            Some("HaltSQLServer") => {
                server = Some(serde_yaml::from_value(value).expect("HaltSQLServer fixture"))
            }
            Some("HaltSQLPolicy") => {
                policies.push(serde_yaml::from_value(value).expect("HaltSQLPolicy fixture"))
            }
            other => panic!("unexpected fixture kind {other:?}"),
        }
    }
    Fixture {
        server: server.expect("a HaltSQLServer in the fixture"),
        policies,
    }
}

/// Reads `tests/golden/render/<case>/input.yaml`.
pub fn load_fixture(case: &str) -> Fixture {
    let path = golden_dir().join(case).join("input.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    load_fixture_str(&text)
}

/// What the policy controller reports as `status.policyName`: the inline
/// document's `metadata.name`; for a bundle, the object name.
pub fn policy_name_of(object_name: &str, spec: &HaltSQLPolicySpec) -> String {
    match &spec.policy {
        Some(doc) => {
            let v: serde_yaml::Value = serde_yaml::from_str(doc).expect("inline policy YAML");
            v["metadata"]["name"]
                .as_str()
                .expect("metadata.name in the policy")
                .to_owned()
        }
        None => object_name.to_owned(),
    }
}

/// Owned copies of the fields of a [`PolicyInput`].
pub struct Inputs {
    rows: Vec<(String, String, String, HaltSQLPolicySpec)>,
}

impl Inputs {
    pub fn new(policies: &[HaltSQLPolicy]) -> Self {
        let rows = policies
            .iter()
            .map(|p| {
                let name = p.metadata.name.clone().expect("policy name");
                let policy_name = policy_name_of(&name, &p.spec);
                (name, policy_name, content_hash(&p.spec), p.spec.clone())
            })
            .collect();
        Self { rows }
    }

    pub fn get(&self) -> Vec<PolicyInput<'_>> {
        self.rows
            .iter()
            .map(|(o, n, h, s)| PolicyInput {
                object_name: o,
                policy_name: n,
                content_hash: h,
                spec: s,
            })
            .collect()
    }
}

impl Fixture {
    pub fn render(&self) -> Result<Rendered, render::RenderError> {
        let inputs = Inputs::new(&self.policies);
        render::render(&self.server, &inputs.get())
    }
}

/// Compares `actual` with the golden file, or rewrites it with
/// `UPDATE_GOLDEN=1`.
pub fn assert_golden(rel: &str, actual: &str) {
    let path = golden_dir().join(rel);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path:?}: {e} (run with UPDATE_GOLDEN=1 to create it)"));
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "{path:?} differs from the rendered output, first at line {}:\n  golden:   {:?}\n  rendered: {:?}\nRun with UPDATE_GOLDEN=1 to accept the new output.",
            first + 1,
            expected.lines().nth(first),
            actual.lines().nth(first),
        );
    }
}

/// The `haltsql` CLI: `$HALTSQL_BIN`, else `<target dir>/debug/haltsql`.
pub fn haltsql_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HALTSQL_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let bin = target.join("debug/haltsql");
    assert!(
        bin.is_file(),
        "{bin:?} is missing: build it with `cargo build -p haltsql` or set HALTSQL_BIN"
    );
    bin
}

/// A plausible value for a mounted Secret key: 64 hex digits for token
/// hashes (distinct per key), PEM-looking text for TLS files, a word
/// otherwise.
pub fn secret_value(secret: &str, key: &str) -> String {
    if key == "sha256" || key.ends_with(".sha256") {
        // As `kubectl create secret --from-literal` would store it, plus
        // the trailing newline a hand-made Secret often has.
        let token = format!("token-of-{secret}-{key}");
        format!("{}\n", hex::encode(Sha256::digest(token.as_bytes())))
    } else if key.ends_with(".crt") {
        "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n".to_owned()
    } else if key.ends_with(".key") {
        "-----BEGIN PRIVATE KEY-----\nMC4Cfake\n-----END PRIVATE KEY-----\n".to_owned()
    } else {
        format!("{secret}-{key}-value")
    }
}

/// Lays the rendered files out as in a pod under `root`: the ConfigMap in
/// `etc/haltsql`, every mounted Secret key in `var/run/haltsql/secrets`
/// (TLS keys in `var/run/haltsql/tls`). Returns the config file's path.
pub fn write_pod_layout(root: &Path, rendered: &Rendered, tls_secret: Option<&str>) -> PathBuf {
    let etc = root.join("etc/haltsql");
    std::fs::create_dir_all(&etc).expect("mkdir etc");
    for (k, v) in rendered.config_map.data.as_ref().expect("ConfigMap data") {
        std::fs::write(etc.join(k), v).expect("write config file");
    }
    for (secret, key) in &rendered.mounted_secret_keys {
        let dir = if Some(secret.as_str()) == tls_secret
            && ["tls.crt", "tls.key", "ca.crt"].contains(&key.as_str())
        {
            root.join("var/run/haltsql/tls")
        } else {
            root.join("var/run/haltsql/secrets").join(secret)
        };
        std::fs::create_dir_all(&dir).expect("mkdir secret");
        std::fs::write(dir.join(key), secret_value(secret, key)).expect("write secret");
    }
    etc.join("config.yaml")
}

/// Runs `haltsql validate [--root ROOT] FILE` with an empty environment and
/// returns (exit code, stdout + stderr).
pub fn haltsql_validate(root: Option<&Path>, file: &Path) -> (i32, String) {
    let mut cmd = Command::new(haltsql_bin());
    cmd.env_clear().arg("validate");
    if let Some(r) = root {
        cmd.arg("--root").arg(r);
    }
    let out = cmd.arg(file).output().expect("run haltsql validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Renders, lays out and validates; asserts exit 0.
pub fn assert_valid_in_pod(fixture: &Fixture) {
    let rendered = fixture.render().expect("render");
    let dir = tempfile::tempdir().expect("tempdir");
    let tls = fixture
        .server
        .spec
        .tls
        .as_ref()
        .map(|t| t.secret_name.as_str());
    let config = write_pod_layout(dir.path(), &rendered, tls);
    let (code, out) = haltsql_validate(Some(dir.path()), &config);
    assert_eq!(
        code,
        0,
        "haltsql validate rejected the rendered config:\n{out}\n--- config.yaml ---\n{}",
        std::fs::read_to_string(&config).unwrap_or_default()
    );
}
