//! The render tests' helpers: fixtures, golden files, and running the real
//! `haltsql validate` on a rendered configuration laid out as a pod sees it.

use std::path::{Path, PathBuf};
use std::process::Command;

use haltsql_operator::api::{HaltSQLPolicy, HaltSQLPolicySpec, HaltSQLServer};
use haltsql_operator::render::{self, PolicyInput, Rendered, content_hash};
use haltsql_testkit::paths::haltsql_bin;
use haltsql_testkit::pod_files::PodFiles;
use serde::Deserialize;

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

/// Lays the rendered files out as in a pod under `root` (see
/// [`PodFiles`]). Returns the config file's path.
pub fn write_pod_layout(root: &Path, rendered: &Rendered, tls_secret: Option<&str>) -> PathBuf {
    let config_map = rendered.config_map.data.clone().unwrap_or_default();
    PodFiles {
        config_map: &config_map,
        secret_keys: &rendered.mounted_secret_keys,
        tls_secret,
    }
    .write(root)
    .expect("write the pod's files")
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
