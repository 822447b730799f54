//! The `haltsql validate` and `haltsql hash-token` command lines: exit
//! codes, text and JSON output, help, and a Config with its policy and
//! Secret files laid out as in the pod.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use sha2::{Digest, Sha256};

fn haltsql() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_haltsql"));
    c.env_clear();
    c
}

fn run(args: &[&str], cwd: &Path) -> Output {
    haltsql().args(args).current_dir(cwd).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const POLICY: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders-agent
search_path: [app]
tables:
  app.orders:
    columns: [id, status, total_cents]
";

#[test]
fn valid_policy_text_and_json() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("policy.yaml"), POLICY).unwrap();
    let o = run(&["validate", "policy.yaml"], d.path());
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "policy.yaml: ok (Policy orders-agent)\n");

    let o = run(&["validate", "--format", "json", "policy.yaml"], d.path());
    assert_eq!(o.status.code(), Some(0));
    let sha = hex::encode(Sha256::digest(POLICY.as_bytes()));
    assert_eq!(
        stdout(&o),
        format!(
            "{{\"valid\":true,\"documents\":[{{\"file\":\"policy.yaml\",\"kind\":\"Policy\",\"name\":\"orders-agent\",\"sha256\":\"{sha}\"}}],\"errors\":[]}}\n"
        )
    );
}

#[test]
fn invalid_policy_exit_1_with_located_errors() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("policy.yaml"),
        POLICY
            .replace("columns:", "colums:")
            .replace("[app]", "[App]"),
    )
    .unwrap();
    let o = run(&["validate", "policy.yaml"], d.path());
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout(&o),
        "policy.yaml:5:15: search_path[0]: invalid name \"App\": must be a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)\n\
         policy.yaml:8:5: tables.app.orders.colums: unknown key, expected one of: columns\n"
    );
    let o = run(&["validate", "--format", "json", "policy.yaml"], d.path());
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["documents"][0]["name"], "orders-agent");
    assert_eq!(v["documents"][0]["kind"], "Policy");
    assert_eq!(v["errors"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["errors"][1],
        serde_json::json!({
            "file": "policy.yaml", "line": 8, "column": 5,
            "path": "tables.app.orders.colums",
            "message": "unknown key, expected one of: columns"
        })
    );
}

#[test]
fn unreadable_file_exit_2_and_json_still_printed() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("policy.yaml"), POLICY).unwrap();
    let o = run(
        &[
            "validate",
            "--format",
            "json",
            "policy.yaml",
            "missing.yaml",
        ],
        d.path(),
    );
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["documents"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["errors"][0],
        serde_json::json!({"file": "missing.yaml", "line": 0, "column": 0, "path": "", "message": "file not found"})
    );
    let o = run(&["validate", "missing.yaml"], d.path());
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "missing.yaml:0:0: file not found\n");
    // A folder.
    let o = run(&["validate", "."], d.path());
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), ".:0:0: not a regular file\n");
}

#[test]
fn usage_errors_exit_2() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        &["validate"][..],
        &["validate", "--format", "yaml", "x.yaml"][..],
        &["validate", "--bogus", "x.yaml"][..],
        &["frobnicate"][..],
        &[][..],
    ] {
        let o = run(args, d.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert!(!o.stderr.is_empty(), "{args:?}");
    }
}

#[test]
fn help_documents_the_cli() {
    let d = tempfile::tempdir().unwrap();
    let o = run(&["validate", "--help"], d.path());
    assert_eq!(o.status.code(), Some(0));
    let h = stdout(&o);
    for needle in [
        "Usage: haltsql validate [OPTIONS] <FILE>...",
        "--format <FORMAT>",
        "--root <DIR>",
        "FILE:LINE:COLUMN: KEY.PATH: message",
        "${file:/absolute/path}",
        "${env:NAME}",
        "0  every document is valid",
        "1  invalid",
        "2  could not check",
        "\"valid\"",
        "4 MiB per file",
    ] {
        assert!(h.contains(needle), "help lacks {needle:?}:\n{h}");
    }
    let o = run(&["hash-token", "--help"], d.path());
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("SHA-256"));
    let o = run(&["--help"], d.path());
    assert!(stdout(&o).contains("validate"));
    assert!(stdout(&o).contains("hash-token"));
}

fn hash_token(input: &[u8]) -> Output {
    let mut child = haltsql()
        .arg("hash-token")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn hash_token_cli() {
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n";
    let o = hash_token(b"abc");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), abc);
    assert_eq!(stdout(&hash_token(b"abc\n")), abc);
    let o = hash_token(b"");
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
    let o = hash_token(&vec![b'a'; 70 * 1024]);
    assert_eq!(o.status.code(), Some(2));
}

/// Writes a file as Kubernetes mounts a Secret key: `DIR/KEY` is a link to
/// `..data/KEY`, `..data` a link to a timestamped folder.
#[cfg(unix)]
fn write_secret(root: &Path, secret: &str, key: &str, content: &str) {
    use std::os::unix::fs::symlink;
    let dir = root.join("var/run/haltsql/secrets").join(secret);
    let stamp = dir.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir_all(&stamp).unwrap();
    std::fs::write(stamp.join(key), content).unwrap();
    if !dir.join("..data").exists() {
        symlink("..2026_01_01_00_00_00.000000001", dir.join("..data")).unwrap();
    }
    symlink(format!("..data/{key}"), dir.join(key)).unwrap();
}

fn token_hash(t: &str) -> String {
    hex::encode(Sha256::digest(t.as_bytes()))
}

const POD_CONFIG: &str = "\
apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: 0.0.0.0:8080
  health_listen: 0.0.0.0:8081
  auth:
    allow_unauthenticated: false
    tokens:
      - name: orders-agent
        policy: orders-agent
        sha256: ${file:/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256}
      - name: reports
        policy: reports
        sha256: ${file:/var/run/haltsql/secrets/haltsql-tokens/reports.sha256}
policies:
  - file: policy-orders-agent.yaml
  - file: policy-reports.yaml
audit:
  sinks:
    - type: s3
      bucket: corp-audit
      credentials:
        source: static
        access_key_id: ${env:AUDIT_KEY_ID}
        secret_access_key: ${file:/var/run/haltsql/secrets/audit/secret-access-key}
";

#[cfg(unix)]
#[test]
fn pod_layout_loads_and_a_missing_secret_is_located() {
    let root = tempfile::tempdir().unwrap();
    let cfg_dir = root.path().join("etc/haltsql");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    std::fs::write(cfg_dir.join("config.yaml"), POD_CONFIG).unwrap();
    std::fs::write(cfg_dir.join("policy-orders-agent.yaml"), POLICY).unwrap();
    std::fs::write(
        cfg_dir.join("policy-reports.yaml"),
        POLICY.replace("orders-agent", "reports"),
    )
    .unwrap();
    write_secret(
        root.path(),
        "haltsql-tokens",
        "orders-agent.sha256",
        &format!("{}\n", token_hash("t1")),
    );
    write_secret(
        root.path(),
        "haltsql-tokens",
        "reports.sha256",
        &token_hash("t2"),
    );
    write_secret(root.path(), "audit", "secret-access-key", "s3cr3t\n");

    let validate = |extra_env: &[(&str, &str)]| {
        let mut c = haltsql();
        c.args(["validate", "--format", "json", "--root"])
            .arg(root.path())
            .arg("config.yaml")
            .current_dir(&cfg_dir);
        for (k, v) in extra_env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (o.status.code(), v)
    };

    let (code, v) = validate(&[("AUDIT_KEY_ID", "AKIA1")]);
    assert_eq!(code, Some(0), "{v}");
    let docs: Vec<(&str, &str)> = v["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["file"].as_str().unwrap(), d["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        docs,
        [
            ("config.yaml", "Config"),
            ("policy-orders-agent.yaml", "Policy"),
            ("policy-reports.yaml", "Policy"),
        ]
    );

    // The environment variable is missing: located at the placeholder.
    let (code, v) = validate(&[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        v["errors"],
        serde_json::json!([{"file": "config.yaml", "line": 24, "column": 24,
            "path": "audit.sinks[0].credentials.access_key_id",
            "message": "environment variable AUDIT_KEY_ID is not set"}])
    );

    // Remove one Secret key: the error names the placeholder's location.
    std::fs::remove_file(
        root.path()
            .join("var/run/haltsql/secrets/haltsql-tokens/..data/reports.sha256"),
    )
    .unwrap();
    let (code, v) = validate(&[("AUDIT_KEY_ID", "AKIA1")]);
    assert_eq!(code, Some(1));
    assert_eq!(
        v["errors"],
        serde_json::json!([{"file": "config.yaml", "line": 14, "column": 17,
            "path": "server.auth.tokens[1].sha256",
            "message": "placeholder file /var/run/haltsql/secrets/haltsql-tokens/reports.sha256: file not found"}])
    );
    // The secret's content never shows, even when wrong.
    write_secret(root.path(), "bad", "k", "s3cr3t-not-a-hash\n");
    std::fs::write(
        cfg_dir.join("config.yaml"),
        POD_CONFIG.replace("haltsql-tokens/reports.sha256", "bad/k"),
    )
    .unwrap();
    let o = haltsql()
        .args(["validate", "--root"])
        .arg(root.path())
        .arg("config.yaml")
        .env("AUDIT_KEY_ID", "x")
        .current_dir(&cfg_dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout(&o),
        "config.yaml:14:17: server.auth.tokens[1].sha256: must be 64 lower-case hex digits (the SHA-256 of the token, as printed by haltsql hash-token)\n"
    );
    assert!(!stdout(&o).contains("s3cr3t"));
}

#[test]
fn real_absolute_paths_without_root() {
    let d = tempfile::tempdir().unwrap();
    let secret = d.path().join("token.sha256");
    std::fs::write(&secret, format!("{}\n", token_hash("t"))).unwrap();
    std::fs::write(d.path().join("policy.yaml"), POLICY).unwrap();
    let cfg = format!(
        "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\n  auth:\n    tokens: [{{name: a, policy: orders-agent, sha256: '${{file:{}}}'}}]\npolicies: [{{file: policy.yaml}}]\n",
        secret.display()
    );
    std::fs::write(d.path().join("config.yaml"), cfg).unwrap();
    let o = run(&["validate", "config.yaml"], d.path());
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_eq!(
        stdout(&o),
        "config.yaml: ok (Config)\npolicy.yaml: ok (Policy orders-agent)\n"
    );
    std::fs::remove_file(&secret).unwrap();
    let o = run(&["validate", "config.yaml"], d.path());
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout(&o),
        format!(
            "config.yaml:6:54: server.auth.tokens[0].sha256: placeholder file {}: file not found\n",
            secret.display()
        )
    );
}

#[test]
fn several_files_are_all_checked() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("a.yaml"),
        POLICY.replace("orders-agent", "Bad"),
    )
    .unwrap();
    std::fs::write(
        d.path().join("b.yaml"),
        POLICY.replace(
            "  app.orders:\n    columns: [id, status, total_cents]\n",
            "",
        ),
    )
    .unwrap();
    std::fs::write(d.path().join("c.yaml"), POLICY).unwrap();
    let o = run(&["validate", "a.yaml", "b.yaml", "c.yaml"], d.path());
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout(&o),
        "a.yaml:4:9: metadata.name: invalid name \"Bad\": must be a lower-case DNS-1123 subdomain (a-z, 0-9, '-' and '.', starting and ending with a letter or digit, at most 253 characters)\n\
         b.yaml:6:7: tables: required, found null\n"
    );
}

#[test]
fn example_documents_in_testdata() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/load/example");
    let o = haltsql()
        .args(["validate", "--format", "json", "--root"])
        .arg(data.join("root"))
        .arg(data.join("config.yaml"))
        .arg(data.join("policy-orders.yaml"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{v}");
    let kinds: Vec<&str> = v["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["Config", "Policy", "Catalog", "Policy", "Catalog"]);
    // Without the pod layout the Secret is missing.
    let o = haltsql()
        .arg("validate")
        .arg(data.join("config.yaml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).ends_with("config.yaml:13:17: server.auth.tokens[0].sha256: placeholder file /var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256: file not found\n"),
        "{}",
        stdout(&o)
    );
}
