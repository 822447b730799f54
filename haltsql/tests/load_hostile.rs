//! Hostile input: bombs, deep nesting, huge files, binary garbage,
//! non-UTF-8, special files. The loader must answer with a clear error, in
//! bounded time and memory, and never panic. The same inputs also go through
//! the real binary under `ulimit -v` and a wall-clock limit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use haltsql::load::{self, EnvSource, LoadOptions, LoadReport};

const HEADER: &str =
    "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: p\ntables:\n  t: {}\n";

fn opts(root: &Path) -> LoadOptions {
    LoadOptions {
        root: Some(root.to_path_buf()),
        env: EnvSource::Map(BTreeMap::new()),
        ..LoadOptions::default()
    }
}

/// Loads `bytes` as `dir/name` through the file path (size cap included).
fn load(bytes: &[u8]) -> (LoadReport, Duration, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("doc.yaml");
    std::fs::write(&p, bytes).unwrap();
    let start = Instant::now();
    let r = load::load_files_with(&[p], &opts(dir.path()));
    (r, start.elapsed(), dir)
}

fn messages(r: &LoadReport) -> Vec<String> {
    r.errors
        .iter()
        .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
        .collect()
}

fn billion_laughs() -> String {
    let mut s = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for w in names.windows(2) {
        let (prev, next) = (w[0], w[1]);
        s.push_str(&format!(
            "{next}: &{next} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        ));
    }
    s
}

#[test]
fn billion_laughs_fails_fast() {
    let (r, took, _d) = load(billion_laughs().as_bytes());
    assert_eq!(r.exit_code(), 1);
    assert_eq!(
        messages(&r),
        ["6:11: document too large: more than 250000 nodes (aliases count with their expansion)"]
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn alias_of_a_big_string_is_counted_in_bytes() {
    let big = "x".repeat(200 * 1024);
    let mut doc = format!("a: &big \"{big}\"\nb:\n");
    for _ in 0..100 {
        doc.push_str("  - *big\n");
    }
    let (r, took, _d) = load(doc.as_bytes());
    assert_eq!(r.exit_code(), 1);
    let m = messages(&r);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].ends_with("document too large: more than 16777216 bytes of text (aliases count with their expansion)"),
        "{m:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn recursive_alias() {
    let (r, _, _d) = load(b"a: &a [1, *a]\n");
    assert_eq!(
        messages(&r),
        ["1:11: alias refers to an anchor whose node is not complete (recursive alias)"]
    );
}

#[test]
fn aliases_within_budget_are_fine() {
    let doc = format!(
        "{}search_path: &sp [app]\ncatalog:\n  schemas:\n    app:\n      tables:\n        t:\n          columns: &cols [id, name]\n",
        HEADER.replace("name: p", "name: p\n  description: &d shared")
    );
    let (r, _, _d) = load(doc.as_bytes());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let doc = format!("{HEADER}functions:\n  allow: &f [lower]\nstatements: {{allow: *f}}\n");
    let (r, _, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        // Errors inside an alias point at the anchored text.
        ["8:14: unknown statement \"lower\", expected one of: select, insert, update, delete"]
    );
}

#[test]
fn deep_flow_nesting() {
    let doc = "[".repeat(1_000_000);
    let (r, took, _d) = load(doc.as_bytes());
    assert_eq!(messages(&r), ["1:65: nesting deeper than 64 levels"]);
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Not JSON: the YAML scanner's own limit answers first.
    let doc = "{a: ".repeat(500_000);
    let (r, _, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        ["1:1021: YAML syntax error: nesting too deep (recursion limit exceeded)"]
    );
    let doc = format!("a:\n  b: {}", "[".repeat(100_000));
    let (r, _, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        ["2:261: YAML syntax error: nesting too deep (recursion limit exceeded)"]
    );
}

#[test]
fn deep_block_nesting() {
    let mut doc = String::new();
    for i in 0..200 {
        doc.push_str(&" ".repeat(i));
        doc.push_str("a:\n");
    }
    let (r, _, _d) = load(doc.as_bytes());
    assert_eq!(messages(&r), ["65:65: nesting deeper than 64 levels"]);
}

#[test]
fn nesting_through_an_alias_is_counted() {
    let inner = format!("{}1{}", "[".repeat(40), "]".repeat(40));
    let doc = format!("a: &a {inner}\nb: {}*a{}\n", "[".repeat(40), "]".repeat(40));
    let (r, _, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        ["2:44: nesting deeper than 64 levels (through an alias)"]
    );
}

#[test]
fn too_many_nodes() {
    // 3.8 MB of one-digit JSON items: under the size cap, over the node cap.
    let mut doc = String::from("[");
    for _ in 0..1_900_000 {
        doc.push_str("1,");
    }
    doc.push_str("1]");
    let (r, took, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        [
            "1:500001: document too large: more than 250000 nodes (aliases count with their expansion)"
        ]
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // The same in block style.
    let doc = "- a\n".repeat(300_000);
    let (r, took, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        [
            "250000:3: document too large: more than 250000 nodes (aliases count with their expansion)"
        ]
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn long_flow_collections_do_not_buffer_unbounded() {
    // Not JSON, so the YAML scanner reads it; it would buffer the whole
    // collection before the first event.
    let doc = format!("[{}]", "a,".repeat(1_000_000));
    let (r, took, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        [
            "1:262145: a single YAML node spans more than 262144 characters (a flow collection [...] or {...}, or a scalar); write collections in block style, or the whole document as JSON"
        ]
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // A long flow sequence as a mapping value is not buffered (it cannot
    // be a key), and long JSON is fine (the JSON reader does not buffer).
    let mut doc = String::from(HEADER);
    doc.push_str("functions:\n  allow: [");
    for i in 0..40_000 {
        doc.push_str(&format!("f{i}, "));
    }
    doc.push_str("lower]\n");
    let (r, _, _d) = load(doc.as_bytes());
    assert!(doc.len() > 300_000);
    assert!(r.errors.is_empty(), "{:?}", messages(&r));
    assert_eq!(r.policies[0].functions.len(), 40_001);
    let json = format!(
        "{{\"apiVersion\": \"haltsql.dev/v1\", \"kind\": \"Policy\", \"metadata\": {{\"name\": \"p\"}}, \"tables\": {{\"t\": {{}}}}, \"functions\": {{\"allow\": [{}\"lower\"]}}}}",
        (0..40_000)
            .map(|i| format!("\"f{i}\", "))
            .collect::<String>()
    );
    let (r, _, _d) = load(json.as_bytes());
    assert!(r.errors.is_empty(), "{:?}", messages(&r));
    assert_eq!(r.policies[0].functions.len(), 40_001);
}

#[test]
fn huge_file_is_refused_before_parsing() {
    let doc = vec![b'#'; 5 * 1024 * 1024];
    let (r, _, _d) = load(&doc);
    assert_eq!(r.exit_code(), 1);
    assert_eq!(
        messages(&r),
        ["1:1: file is larger than the limit of 4194304 bytes"]
    );
    // A huge scalar under the cap: a clear message, no echo of the value.
    let doc = HEADER.replace(
        "  name: p\n",
        &format!("  name: p\n  description: {}\n", "y".repeat(3_000_000)),
    );
    let (r, took, _d) = load(doc.as_bytes());
    assert_eq!(
        messages(&r),
        [
            "5:262158: a single YAML node spans more than 262144 characters (a flow collection [...] or {...}, or a scalar); write collections in block style, or the whole document as JSON"
        ]
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Under the lookahead, over the description limit.
    let doc = HEADER.replace(
        "  name: p\n",
        &format!("  name: p\n  description: {}\n", "y".repeat(200_000)),
    );
    let (r, _, _d) = load(doc.as_bytes());
    assert_eq!(messages(&r), ["5:16: longer than 4096 characters"]);
}

#[test]
fn binary_garbage_and_bad_encodings() {
    let mut garbage = Vec::new();
    let mut x: u32 = 12345;
    for _ in 0..100_000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        garbage.push((x >> 16) as u8);
    }
    let (r, _, _d) = load(&garbage);
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.errors.len(), 1);
    assert!(
        r.errors[0].message.contains("not valid UTF-8")
            || r.errors[0].message.contains("control character"),
        "{:?}",
        r.errors
    );

    let latin1 = b"apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: caf\xe9\n";
    let (r, _, _d) = load(latin1);
    assert_eq!(
        messages(&r),
        ["4:12: not valid UTF-8 (byte 0xe9); documents must be UTF-8 text"]
    );
    let (r, _, _d) = load(b"a: b\nc: \0\n");
    assert_eq!(
        messages(&r),
        ["2:4: control character U+0000 is not allowed in YAML"]
    );
    let (r, _, _d) = load(b"\xff\xfea\0:\0 \0b\0");
    assert_eq!(
        messages(&r),
        ["1:1: UTF-16 is not supported; save the file as UTF-8"]
    );
    // A UTF-8 byte order mark is fine.
    let (r, _, _d) = load(format!("\u{feff}{HEADER}").as_bytes());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

#[cfg(unix)]
#[test]
fn special_files_never_block() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    // On the command line: could not check (exit 2).
    let r = load::load_files_with(std::slice::from_ref(&fifo), &opts(dir.path()));
    assert_eq!(r.exit_code(), 2);
    assert_eq!(r.errors[0].message, "not a regular file");
    assert_eq!((r.errors[0].line, r.errors[0].column), (0, 0));
    // As a placeholder: a located error.
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\n  auth:\n    tokens: [{name: a, policy: p, sha256: '${file:/fifo}'}]\n    oidc: [{issuer: 'https://x', audience: '${file:/dev/zero}', policy: p}]\npolicies: []\n",
    )
    .unwrap();
    let start = Instant::now();
    let r = load::load_files_with(
        &[cfg],
        &LoadOptions {
            env: EnvSource::Map(BTreeMap::new()),
            ..LoadOptions::default()
        },
    );
    // Without a root, /fifo does not exist; /dev/zero is not a regular file.
    let m = messages(&r);
    assert!(
        m.contains(&"6:43: placeholder file /fifo: file not found".to_string()),
        "{m:?}"
    );
    assert!(
        m.contains(&"7:44: placeholder file /dev/zero: not a regular file".to_string()),
        "{m:?}"
    );
    let r = load::load_files_with(&[dir.path().join("c.yaml")], &opts(dir.path()));
    let m = messages(&r);
    assert!(
        m.contains(&"6:43: placeholder file /fifo: not a regular file".to_string()),
        "{m:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    // A directory.
    let r = load::load_files_with(&[dir.path().to_path_buf()], &opts(dir.path()));
    assert_eq!(r.exit_code(), 2);
    assert_eq!(r.errors[0].message, "not a regular file");
}

#[test]
fn many_errors_are_capped() {
    let mut doc = String::from(HEADER);
    for i in 0..3000 {
        doc.push_str(&format!("  T{i}: {{}}\n"));
    }
    let (r, _, _d) = load(doc.as_bytes());
    assert_eq!(r.errors.len(), load::MAX_ERRORS + 1);
    assert_eq!(
        r.errors.last().unwrap().message,
        "2000 more errors not shown"
    );
}

// --- the real binary under limits -----------------------------------------------

/// Runs `haltsql validate --format json FILE` under `ulimit -v` (256 MiB of
/// address space) and a 30 s wall-clock limit. Returns the exit code and
/// the output.
fn run_limited(file: &Path) -> (i32, String, String) {
    let bin = env!("CARGO_BIN_EXE_haltsql");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 262144 && exec \"$0\" validate --format json \"$1\"")
        .arg(bin)
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!(
                "haltsql validate did not finish within 30 s on {}",
                file.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(unix)]
#[test]
fn binary_under_memory_and_time_limits() {
    let dir = tempfile::tempdir().unwrap();
    let mut garbage = Vec::new();
    let mut x: u32 = 99;
    for _ in 0..3_000_000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        garbage.push((x >> 16) as u8);
    }
    let mut many = String::from("[");
    for _ in 0..1_900_000 {
        many.push_str("a,");
    }
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("laughs.yaml", billion_laughs().into_bytes()),
        ("deep.yaml", "[".repeat(4_000_000).into_bytes()),
        ("deepmap.yaml", "{a: ".repeat(1_000_000).into_bytes()),
        (
            "flow.yaml",
            format!("[{}]", "a,".repeat(1_900_000)).into_bytes(),
        ),
        (
            "json.json",
            format!("[{}1]", "1,".repeat(1_900_000)).into_bytes(),
        ),
        ("many.yaml", many.into_bytes()),
        ("huge.yaml", vec![b'a'; 64 * 1024 * 1024]),
        ("garbage.bin", garbage),
        ("latin1.yaml", b"a: \xe9\n".to_vec()),
    ];
    for (name, bytes) in cases {
        let p: PathBuf = dir.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let (code, out, err) = run_limited(&p);
        assert_eq!(code, 1, "{name}: exit {code}\nstdout: {out}\nstderr: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["valid"], false, "{name}");
        assert!(!v["errors"].as_array().unwrap().is_empty(), "{name}");
    }
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let (code, out, _) = run_limited(&fifo);
    assert_eq!(code, 2);
    assert!(out.contains("not a regular file"), "{out}");
}
