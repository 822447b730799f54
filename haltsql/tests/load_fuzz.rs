//! Property tests for the loader: arbitrary bytes, YAML-ish token soup and
//! mutations of valid documents never make it panic, and every answer is
//! well formed (located errors, one line each, exit code 0 or 1, JSON that
//! parses). Bounded: a fixed number of cases per property
//! (`HALTSQL_FUZZ_CASES`, default 256).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use haltsql::load::{self, EnvSource, LoadOptions, LoadReport};
use proptest::prelude::*;

const POLICY: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders-agent
dialect: postgres
search_path: [app]
statements: {allow: [select, update]}
require_limit: {max: 100}
tables:
  app.orders:
    columns: [id, status]
  customers: {}
functions: {allow: [lower]}
catalog:
  schemas:
    app:
      tables:
        orders: {columns: [id, status, {name: total, type: int}]}
        customers: {columns: [id]}
";

const CONFIG: &str = "\
apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: 0.0.0.0:8080
  tls: {cert_file: /c, key_file: /k, client_auth: optional, client_ca_file: /ca}
  auth:
    allow_unauthenticated: true
    tokens:
      - {name: a, policy: orders-agent, sha256: '${file:/secrets/a}'}
    mtls: {identities: [{uri: 'spiffe://x', policy: prod.x}]}
policies:
  - file: policy.yaml
  - bundle_source:
      name: prod
      oci: {ref: 'ghcr.io/corp/p:prod', auth: {type: token, token: '${env:T}'}}
      public_keys: ['11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=']
      name_prefix: prod.
default_policy: orders-agent
audit:
  sinks: [{type: stdout}, {type: kafka, brokers: ['k:9093'], topic: t}]
";

fn cases() -> u32 {
    std::env::var("HALTSQL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

struct World {
    dir: tempfile::TempDir,
    opts: LoadOptions,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
    std::fs::create_dir_all(dir.path().join("secrets")).unwrap();
    std::fs::write(
        dir.path().join("secrets/a"),
        format!("{}\n", "ab".repeat(32)),
    )
    .unwrap();
    let mut env = BTreeMap::new();
    env.insert("T".to_string(), "token".to_string());
    let opts = LoadOptions {
        root: Some(dir.path().to_path_buf()),
        env: EnvSource::Map(env),
        ..LoadOptions::default()
    };
    World { dir, opts }
}

fn check_report(r: &LoadReport, file: &Path) {
    assert!(!r.could_not_check, "{:?}", r.errors);
    assert!(matches!(r.exit_code(), 0 | 1));
    assert_eq!(r.is_valid(), r.errors.is_empty());
    for e in &r.errors {
        assert!(!e.file.is_empty());
        assert!(e.line >= 1 && e.column >= 1, "{e:?}");
        assert!(!e.message.is_empty());
        let text = e.to_string();
        assert!(!text.contains('\n'), "{text:?}");
        assert!(text.starts_with(&load::errors::one_line_pub(&e.file)));
    }
    let v: serde_json::Value = serde_json::from_str(&r.to_json_string()).unwrap();
    assert_eq!(v["valid"], r.is_valid());
    assert_eq!(v["errors"].as_array().unwrap().len(), r.errors.len());
    assert_eq!(r.documents[0].file, file.to_string_lossy());
}

fn run(w: &World, name: &str, bytes: &[u8]) -> LoadReport {
    let path: PathBuf = w.dir.path().join(name);
    let r = load::load_bytes(&path, bytes, &w.opts);
    check_report(&r, &path);
    r
}

#[test]
fn seeds_are_valid() {
    let w = world();
    let r = run(&w, "p.yaml", POLICY.as_bytes());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let r = run(&w, "config.yaml", CONFIG.as_bytes());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

fn token() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "\n",
        " ",
        "  ",
        "\t",
        "-",
        "- ",
        ":",
        ": ",
        "? ",
        ",",
        "[",
        "]",
        "{",
        "}",
        "&a ",
        "*a",
        "&b ",
        "*b",
        "!!str ",
        "!!int ",
        "!x ",
        "|",
        ">",
        "'",
        "\"",
        "#",
        "---",
        "...",
        "%YAML 1.2",
        "apiVersion",
        "haltsql.dev/v1",
        "kind",
        "Policy",
        "Config",
        "metadata",
        "name",
        "tables",
        "columns",
        "server",
        "listen",
        "policies",
        "file",
        "${file:/secrets/a}",
        "${env:T}",
        "${env:NOPE}",
        "${file:x}",
        "0.0.0.0:1",
        "null",
        "~",
        "true",
        "1",
        "1e3",
        "0x1f",
        "a.b",
        "é",
        "\u{feff}",
        "\\",
        "<<",
        "\r\n",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let w = world();
        run(&w, "x.yaml", &bytes);
    }

    #[test]
    fn token_soup(tokens in prop::collection::vec(token(), 0..200)) {
        let w = world();
        let text: String = tokens.concat();
        run(&w, "x.yaml", text.as_bytes());
    }

    #[test]
    fn mutated_policy(edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, token()), 1..8)) {
        let w = world();
        let text = mutate(POLICY, &edits);
        run(&w, "p.yaml", text.as_bytes());
    }

    #[test]
    fn mutated_config(edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, token()), 1..8)) {
        let w = world();
        let text = mutate(CONFIG, &edits);
        run(&w, "config.yaml", text.as_bytes());
    }
}

/// Applies edits: 0 inserts the token, 1 deletes a few characters, 2
/// replaces a character with the token.
fn mutate(seed: &str, edits: &[(prop::sample::Index, u8, &str)]) -> String {
    let mut chars: Vec<char> = seed.chars().collect();
    for (at, op, tok) in edits {
        let i = at.index(chars.len() + 1);
        match op {
            0 => {
                chars.splice(i..i, tok.chars());
            }
            1 => {
                let end = (i + 3).min(chars.len());
                chars.drain(i..end);
            }
            _ => {
                if i < chars.len() {
                    chars.splice(i..=i, tok.chars());
                }
            }
        }
    }
    chars.into_iter().collect()
}
