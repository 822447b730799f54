//! `haltsql check`: the SQL comes from the argument (also when it starts
//! with `--`), from --file, or from standard input.

use std::io::Write;
use std::process::{Command, Stdio};

fn pod() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policy.yaml"),
        "apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders-agent
search_path: [app]
tables:
  app.orders:
    columns: [id, status]
",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        "apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: 127.0.0.1:0
  auth:
    allow_unauthenticated: true
policies:
  - file: policy.yaml
default_policy: orders-agent
",
    )
    .unwrap();
    dir
}

fn check(dir: &tempfile::TempDir, args: &[&str], stdin: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_haltsql"))
        .arg("check")
        .arg("--config")
        .arg(dir.path().join("config.yaml"))
        .args(["--policy", "orders-agent"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn sql_starting_with_a_comment_is_sql() {
    let dir = pod();
    let (code, out) = check(&dir, &["-- who\nSELECT id FROM orders"], "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"allowed\":true"), "{out}");
    let (code, out) = check(&dir, &["-- who\nSELECT email FROM orders"], "");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("column_not_allowed"), "{out}");
}

#[test]
fn sql_from_a_file_or_stdin() {
    let dir = pod();
    let file = dir.path().join("q.sql");
    std::fs::write(&file, "SELECT email FROM orders").unwrap();
    let (code, out) = check(&dir, &["--file", file.to_str().unwrap()], "");
    assert_eq!(code, 1, "{out}");
    let (code, out) = check(&dir, &["--file", "-"], "SELECT id FROM orders");
    assert_eq!(code, 0, "{out}");
    let (code, out) = check(&dir, &[], "SELECT status FROM orders");
    assert_eq!(code, 0, "{out}");
    let (code, out) = check(&dir, &["--file", "/nonexistent/q.sql"], "");
    assert_eq!(code, 2, "{out}");
}
