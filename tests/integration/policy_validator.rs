//! The validator against the real `haltsql` binary of this workspace, and
//! against small fake validators (shell scripts) for the failure modes the
//! real one should never show: hanging, crashing, garbage output.
//!
//! Every test gives the validator a temp root of its own and checks that it
//! is empty afterwards: no run leaves its private directory behind.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use haltsql_operator::api::{
    BundleAuth, BundleAuthType, BundleSource, HaltSQLPolicySpec, OciSource, S3Credentials,
    S3CredentialsSource, S3Source,
};
use haltsql_operator::controllers::metrics::Metrics;
use haltsql_operator::controllers::policy::{Validator, Verdict};
use haltsql_operator::render::{ValidationDocument, validation_document};

/// The quick-start policy document of config/samples.
fn valid_policy() -> String {
    support::quick_start_policy_document(&["id", "status", "total_cents"])
}

/// RFC 8032 test key 1, as PEM.
const PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n-----END PUBLIC KEY-----\n";

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    scripts: PathBuf,
    metrics: Metrics,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("tmp");
        let scripts = dir.path().join("bin");
        std::fs::create_dir(&root).expect("temp root");
        std::fs::create_dir(&scripts).expect("script dir");
        Self {
            _dir: dir,
            root,
            scripts,
            metrics: Metrics::new().expect("metrics"),
        }
    }

    fn validator(&self, binary: PathBuf, timeout: Duration) -> Validator {
        Validator::new(binary, timeout, 2, self.metrics.clone()).with_temp_root(self.root.clone())
    }

    fn real(&self) -> Validator {
        self.validator(support::haltsql_bin(), Duration::from_secs(30))
    }

    /// A fake validator: a `/bin/sh` script with `body`.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.scripts.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    fn assert_clean(&self) {
        let left: Vec<_> = std::fs::read_dir(&self.root)
            .expect("read temp root")
            .map(|e| e.map(|e| e.path()))
            .collect();
        assert!(left.is_empty(), "private directories left behind: {left:?}");
    }

    fn runs(&self, outcome: &str) -> u64 {
        self.metrics
            .validator_runs
            .with_label_values(&[outcome])
            .get()
    }

    fn hits(&self, outcome: &str) -> u64 {
        self.metrics
            .validator_cache_hits
            .with_label_values(&[outcome])
            .get()
    }
}

fn inline(text: &str) -> ValidationDocument {
    ValidationDocument {
        file_name: "policy.yaml".into(),
        contents: text.into(),
    }
}

fn error_message(verdict: Verdict) -> String {
    match verdict {
        Verdict::Error { message } => message,
        other => panic!("expected an error verdict, got {other:?}"),
    }
}

#[tokio::test]
async fn valid_policy_reports_its_name_and_is_cached() {
    let f = Fixture::new();
    let v = f.real();
    let expected = Verdict::Valid {
        policy_name: Some("orders-agent".into()),
    };
    assert_eq!(v.validate(&inline(&valid_policy())).await, expected);
    f.assert_clean();
    assert_eq!(v.validate(&inline(&valid_policy())).await, expected);
    assert_eq!(
        f.runs("valid"),
        1,
        "the second verdict comes from the cache"
    );
    assert_eq!(f.hits("valid"), 1);
    f.assert_clean();
}

#[tokio::test]
async fn the_same_document_asked_for_at_once_is_judged_once() {
    let f = Fixture::new();
    let v = f.real();
    let expected = Verdict::Valid {
        policy_name: Some("orders-agent".into()),
    };
    // Two runs may go at once, so without the shared flight each call would
    // start its own run.
    let doc = inline(&valid_policy());
    let (first, second, third) = tokio::join!(v.validate(&doc), v.validate(&doc), v.validate(&doc));
    assert_eq!(first, expected);
    assert_eq!(second, expected);
    assert_eq!(third, expected);
    assert_eq!(
        f.runs("valid"),
        1,
        "one run for one content asked for three times"
    );
    f.assert_clean();
}

#[tokio::test]
async fn invalid_policy_has_located_errors_without_temp_paths() {
    let f = Fixture::new();
    let v = f.real();
    let text = valid_policy().replace("columns:", "colums:");
    let Verdict::Invalid { message } = v.validate(&inline(&text)).await else {
        panic!("expected invalid");
    };
    assert_eq!(
        message,
        "policy.yaml:13:5: tables.app.orders.colums: unknown key, expected one of: columns"
    );
    assert!(!message.contains(f.root.to_str().unwrap_or("/")));
    f.assert_clean();
    // Invalid verdicts are cached too.
    assert!(matches!(
        v.validate(&inline(&text)).await,
        Verdict::Invalid { .. }
    ));
    assert_eq!((f.runs("invalid"), f.hits("invalid")), (1, 1));
}

#[tokio::test]
async fn unparseable_yaml_is_invalid_with_a_location() {
    let f = Fixture::new();
    let Verdict::Invalid { message } = f.real().validate(&inline("tables: [\n")).await else {
        panic!("expected invalid");
    };
    assert!(message.starts_with("policy.yaml:2:1: "), "{message}");
    assert!(message.contains("YAML syntax error"), "{message}");
    f.assert_clean();
}

#[tokio::test]
async fn many_errors_are_trimmed() {
    let f = Fixture::new();
    let mut text = valid_policy();
    for i in 0..200 {
        text.push_str(&format!("unknown_key_{i}: x\n"));
    }
    let Verdict::Invalid { message } = f.real().validate(&inline(&text)).await else {
        panic!("expected invalid");
    };
    assert!(message.len() <= 4096, "{}", message.len());
    assert!(message.ends_with("more)"), "{message}");
    f.assert_clean();
}

fn bundle_spec() -> HaltSQLPolicySpec {
    HaltSQLPolicySpec {
        policy: None,
        bundle_source: Some(BundleSource {
            oci: Some(OciSource {
                r#ref: "ghcr.io/corp/haltsql-policies:prod".into(),
                plain_http: None,
                auth: Some(BundleAuth {
                    r#type: BundleAuthType::Basic,
                    secret_name: "registry-credentials".into(),
                    ..Default::default()
                }),
            }),
            public_keys: vec![PUBLIC_KEY.into()],
            name_prefix: Some("prod.".into()),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn bundle_source_config_is_valid_without_secrets() {
    let f = Fixture::new();
    let v = f.real();
    for spec in [
        bundle_spec(),
        HaltSQLPolicySpec {
            policy: None,
            bundle_source: Some(BundleSource {
                s3: Some(S3Source {
                    bucket: "policies".into(),
                    key: "prod/bundle.tar".into(),
                    region: Some("eu-west-1".into()),
                    endpoint: None,
                    credentials: Some(S3Credentials {
                        source: S3CredentialsSource::Static,
                        secret_name: Some("aws".into()),
                        session_token_key: Some("session".into()),
                        ..Default::default()
                    }),
                }),
                public_keys: vec![PUBLIC_KEY.into()],
                ..Default::default()
            }),
        },
    ] {
        let doc = validation_document("prod", &spec).expect("validation document");
        assert_eq!(
            v.validate(&doc).await,
            Verdict::Valid { policy_name: None },
            "{}",
            doc.contents
        );
    }
    f.assert_clean();
}

/// The guide's rule: `plainHTTP` only for a loopback registry, reported
/// by haltsql validate with the field's location.
#[tokio::test]
async fn plain_http_is_valid_only_for_loopback_registries() {
    let f = Fixture::new();
    let v = f.real();
    let spec = |registry: &str| {
        let mut spec = bundle_spec();
        if let Some(oci) = spec.bundle_source.as_mut().and_then(|b| b.oci.as_mut()) {
            oci.r#ref = format!("{registry}/haltsql-policies:prod");
            oci.plain_http = Some(true);
            oci.auth = None;
        }
        spec
    };
    let doc = validation_document("prod", &spec("registry.corp.example:5000"))
        .expect("validation document");
    let Verdict::Invalid { message } = v.validate(&doc).await else {
        panic!("expected invalid: {}", doc.contents);
    };
    assert!(
        message.contains("oci.plain_http: plain_http is only allowed for loopback registries"),
        "{message}"
    );
    for registry in ["localhost:5000", "127.0.0.1:5000"] {
        let doc = validation_document("prod", &spec(registry)).expect("validation document");
        assert_eq!(
            v.validate(&doc).await,
            Verdict::Valid { policy_name: None },
            "{}",
            doc.contents
        );
    }
    f.assert_clean();
}

#[tokio::test]
async fn child_sees_no_environment_and_a_private_directory() {
    let f = Fixture::new();
    let capture = f.scripts.join("capture");
    std::fs::create_dir(&capture).expect("capture dir");
    // /proc/$$/environ is the environment the shell was started with,
    // before it sets any variable of its own.
    let script = f.script(
        "capture-validator",
        &format!(
            "/bin/cat /proc/$$/environ > {c}/environ\n\
             /usr/bin/stat -c %a . > {c}/dir-mode\n\
             /usr/bin/stat -c %a \"$6\" > {c}/file-mode\n\
             /bin/pwd > {c}/cwd\n\
             /bin/echo \"$@\" > {c}/args\n\
             /bin/cat \"$6\" > {c}/document\n\
             exec {haltsql} \"$@\"",
            c = capture.display(),
            haltsql = support::haltsql_bin().display()
        ),
    );
    // The test process has PATH, HOME, CARGO_* and more: none may reach the child.
    assert!(std::env::vars_os().next().is_some());
    let doc = validation_document("prod", &bundle_spec()).expect("document");
    let verdict = f
        .validator(script, Duration::from_secs(30))
        .validate(&doc)
        .await;
    assert_eq!(verdict, Verdict::Valid { policy_name: None });
    let read = |name: &str| std::fs::read_to_string(capture.join(name)).expect("captured");
    assert_eq!(read("environ"), "", "the child's environment must be empty");
    assert_eq!(read("dir-mode").trim(), "700");
    assert_eq!(read("file-mode").trim(), "600");
    assert!(
        Path::new(read("cwd").trim()).starts_with(&f.root),
        "{}",
        read("cwd")
    );
    assert_eq!(
        read("args").trim(),
        "validate --sealed --format json -- config.yaml"
    );
    let document = read("document");
    assert!(document.contains("kind: Config"), "{document}");
    assert!(!document.contains("${file:"), "{document}");
    assert!(!document.contains("registry-credentials"), "{document}");
    f.assert_clean();
}

#[tokio::test]
async fn missing_binary_is_an_error_and_not_cached() {
    let f = Fixture::new();
    let v = f.validator(f.scripts.join("does-not-exist"), Duration::from_secs(5));
    let message = error_message(v.validate(&inline(&valid_policy())).await);
    assert!(message.starts_with("cannot run "), "{message}");
    error_message(v.validate(&inline(&valid_policy())).await);
    assert_eq!((f.runs("error"), f.hits("error")), (2, 0));
    f.assert_clean();
}

#[tokio::test]
async fn hanging_validator_times_out_and_cleans_up() {
    let f = Fixture::new();
    let v = f.validator(
        f.script("hang", "exec /bin/sleep 60"),
        Duration::from_millis(500),
    );
    let started = Instant::now();
    let message = error_message(v.validate(&inline(&valid_policy())).await);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(message, "haltsql validate did not finish within 0.5s");
    f.assert_clean();
}

/// Processes whose command line is exactly `sleep <arg>`.
fn sleeping(arg: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
                args.len() == 2 && args[0].ends_with(b"sleep") && args[1] == arg.as_bytes()
            })
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test]
async fn processes_the_validator_starts_go_with_it() {
    let f = Fixture::new();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    // A child that hangs holding the output (not exec'd), and one left
    // running in the background by a validator that exits at once.
    let hanging = format!("3597.{nanos:09}");
    let background = format!("3596.{nanos:09}");
    let v = f.validator(
        f.script("hang-child", &format!("sleep {hanging}")),
        Duration::from_millis(500),
    );
    let message = error_message(v.validate(&inline(&valid_policy())).await);
    assert_eq!(message, "haltsql validate did not finish within 0.5s");
    let v = f.validator(
        f.script(
            "daemon",
            &format!("sleep {background} >/dev/null 2>&1 </dev/null &\nexit 2"),
        ),
        Duration::from_secs(5),
    );
    error_message(v.validate(&inline(&valid_policy())).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sleeping(&hanging),
        Vec::<String>::new(),
        "hanging child left"
    );
    assert_eq!(
        sleeping(&background),
        Vec::<String>::new(),
        "background child left"
    );
    f.assert_clean();
}

#[test]
fn directories_of_a_killed_run_are_removed_at_start() {
    let f = Fixture::new();
    // A pid nobody has: above every pid in /proc.
    let dead = (1..=4_194_304u32)
        .rev()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let own = std::process::id();
    let mk = |name: &str| {
        let p = f.root.join(name);
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("policy.yaml"), "x").unwrap();
        p
    };
    let stale = mk(&format!("haltsql-validate-{dead}-0-0"));
    let earlier_self = mk(&format!("haltsql-validate-{own}-3-1f"));
    let live = mk("haltsql-validate-1-0-0");
    let other = mk("something-else");
    let target = mk("target");
    std::os::unix::fs::symlink(&target, f.root.join(format!("haltsql-validate-{dead}-9-9")))
        .unwrap();
    assert_eq!(
        haltsql_operator::controllers::policy::remove_stale_private_dirs(&f.root),
        2
    );
    assert!(!stale.exists() && !earlier_self.exists());
    assert!(live.exists(), "a running process's directory stays");
    assert!(other.exists() && target.join("policy.yaml").exists());
}

#[tokio::test]
async fn exit_2_signal_and_garbage_are_errors() {
    let f = Fixture::new();
    let cases = [
        (
            "exit2",
            r#"echo '{"valid":false,"documents":[],"errors":[{"file":"policy.yaml","line":0,"column":0,"path":"","message":"permission denied"}]}'; exit 2"#,
            "could not check the document (exit code 2):\npolicy.yaml:0:0: permission denied",
        ),
        ("exit3", "echo oops >&2; exit 3", "exited with code 3: oops"),
        ("signal", "kill -9 $$", "killed by signal 9"),
        ("garbage", "echo 'not json'; exit 0", "unparseable output"),
        (
            "disagree",
            r#"echo '{"valid":false,"documents":[],"errors":[]}'; exit 0"#,
            "report disagrees",
        ),
        (
            "invalid-without-errors",
            r#"echo '{"valid":false,"documents":[],"errors":[]}'; exit 1"#,
            "report disagrees",
        ),
        (
            "flood",
            "exec /usr/bin/head -c 3000000 /dev/zero",
            "printed more than",
        ),
    ];
    for (name, body, expected) in cases {
        let v = f.validator(f.script(name, body), Duration::from_secs(10));
        let message = error_message(v.validate(&inline(&valid_policy())).await);
        assert!(message.contains(expected), "{name}: {message}");
        f.assert_clean();
    }
    assert_eq!(f.runs("error"), cases.len() as u64);
}

#[tokio::test]
async fn chatty_stderr_does_not_block_the_child() {
    let f = Fixture::new();
    let script = f.script(
        "chatty",
        &format!(
            "/usr/bin/head -c 2000000 /dev/zero | /usr/bin/tr '\\0' x >&2\nexec {} \"$@\"",
            support::haltsql_bin().display()
        ),
    );
    let verdict = f
        .validator(script, Duration::from_secs(20))
        .validate(&inline(&valid_policy()))
        .await;
    assert_eq!(
        verdict,
        Verdict::Valid {
            policy_name: Some("orders-agent".into())
        }
    );
    f.assert_clean();
}

#[tokio::test]
async fn recovers_when_the_validator_comes_back() {
    let f = Fixture::new();
    let path = f.scripts.join("haltsql");
    let v = f.validator(path.clone(), Duration::from_secs(30));
    error_message(v.validate(&inline(&valid_policy())).await);
    std::os::unix::fs::symlink(support::haltsql_bin(), &path).expect("symlink");
    assert_eq!(
        v.validate(&inline(&valid_policy())).await,
        Verdict::Valid {
            policy_name: Some("orders-agent".into())
        }
    );
    f.assert_clean();
}

/// Documents that would make an unsealed validator read a canary file of
/// the operator's file system: the verdict names the refusal, and it is the
/// same whether the canary exists or not, and whatever it holds.
#[tokio::test]
async fn the_validator_reads_no_file_a_document_names() {
    let f = Fixture::new();
    let canary_dir = tempfile::tempdir().expect("canary dir");
    let canary = canary_dir.path().join("token");
    let canary_text = canary.display().to_string();
    let cases = [
        (
            "config.yaml",
            format!(
                "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\n  auth:\n    tokens: [{{name: a, policy: p, sha256: '${{file:{canary_text}}}'}}]\npolicies: [{{file: {canary_text}}}]\n"
            ),
            vec!["placeholders are not resolved in sealed mode", "is not read in sealed mode"],
        ),
        (
            "config.yaml",
            "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\n  auth:\n    tokens: [{name: a, policy: p, sha256: '${env:HOME}'}]\npolicies: [{file: ../../etc/passwd}]\n".to_owned(),
            vec!["placeholders are not resolved in sealed mode", "is not read in sealed mode"],
        ),
        (
            "policy.yaml",
            format!("{}catalog: {canary_text}\n", valid_policy()),
            vec!["catalog file", "is not read in sealed mode"],
        ),
    ];
    for (i, (file_name, contents, expected)) in cases.iter().enumerate() {
        let doc = ValidationDocument {
            file_name: (*file_name).to_owned(),
            contents: contents.clone(),
        };
        // A fresh validator each time: its cache must not answer.
        let mut verdicts = vec![f.real().validate(&doc).await];
        std::fs::write(&canary, valid_policy()).expect("canary");
        verdicts.push(f.real().validate(&doc).await);
        std::fs::write(&canary, "0".repeat(64)).expect("canary");
        verdicts.push(f.real().validate(&doc).await);
        std::fs::remove_file(&canary).expect("remove canary");
        let Verdict::Invalid { message } = &verdicts[0] else {
            panic!("case {i}: {:?}", verdicts[0]);
        };
        for e in expected {
            assert!(message.contains(e), "case {i}: {message}");
        }
        assert!(
            verdicts.iter().all(|v| v == &verdicts[0]),
            "case {i}: {verdicts:?}"
        );
    }
    f.assert_clean();
}

fn named(name: &str) -> String {
    valid_policy().replace("name: orders-agent", &format!("name: {name}"))
}

#[tokio::test]
async fn waiting_documents_share_a_run_and_each_keeps_its_own_verdict() {
    let f = Fixture::new();
    let v = Validator::new(
        support::haltsql_bin(),
        Duration::from_secs(30),
        1,
        f.metrics.clone(),
    )
    .with_temp_root(f.root.clone());
    let mut docs: Vec<String> = (0..24).map(|i| named(&format!("agent-{i}"))).collect();
    // Two documents with one policy name: separate HaltSQLPolicies, no conflict.
    docs.push(named("agent-3").replace("max: 100", "max: 50"));
    docs.push(valid_policy().replace("columns:", "colums:"));
    docs.push("tables: [\n".to_owned());
    docs.push(named("agent-7")); // the same bytes as a document above: judged once
    let inputs: Vec<ValidationDocument> = docs.iter().map(|d| inline(d)).collect();
    let verdicts = futures::future::join_all(inputs.iter().map(|d| v.validate(d))).await;

    // What each document gets when it is judged alone, by a validator of its own.
    let alone = Fixture::new();
    for (doc, verdict) in docs.iter().zip(&verdicts) {
        assert_eq!(
            verdict,
            &alone.real().validate(&inline(doc)).await,
            "document {doc:?}"
        );
    }
    assert!(matches!(&verdicts[0], Verdict::Valid { policy_name: Some(n) } if n == "agent-0"));
    assert!(
        matches!(&verdicts[25], Verdict::Invalid { message } if message.starts_with("policy.yaml:13:5: ")),
        "{:?}",
        verdicts[25]
    );
    let processes: u64 = ["valid", "invalid", "error", "batch"]
        .iter()
        .map(|o| f.metrics.validator_processes.with_label_values(&[o]).get())
        .sum();
    let batches = f
        .metrics
        .validator_processes
        .with_label_values(&["batch"])
        .get();
    assert!(batches >= 1, "no document waited for a run");
    assert!(
        processes <= 6,
        "{processes} processes for 28 documents (one run at a time)"
    );
    // Judged: 27 distinct documents; the invalid ones alone again.
    assert_eq!(f.runs("valid") + f.runs("invalid"), 27);
    f.assert_clean();
}

#[tokio::test]
async fn a_hanging_batch_costs_one_timeout_then_each_document_is_judged_alone() {
    let f = Fixture::new();
    // Sleeps half a second for a document with "slow" (so the others wait and
    // are batched), hangs on "hang", else finds the last file valid.
    let script = f.script(
        "fake",
        r#"for a in "$@"; do case "$a" in --*|validate) ;; *) last="$a"
  if grep -q hang "$a"; then exec /bin/sleep 60; fi
  if grep -q slow "$a"; then /bin/sleep 0.5; fi ;; esac; done
printf '{"valid":true,"documents":[{"file":"%s","kind":"Policy","name":"p"}],"errors":[]}\n' "$last""#,
    );
    let v = Validator::new(script, Duration::from_secs(1), 1, f.metrics.clone())
        .with_temp_root(f.root.clone());
    let started = Instant::now();
    let docs = ["slow", "hang", "ok one", "ok two"].map(inline);
    let slow = v.validate(&docs[0]);
    let rest = async {
        // Queued while the slow run holds the only permit.
        tokio::time::sleep(Duration::from_millis(200)).await;
        futures::future::join3(
            v.validate(&docs[1]),
            v.validate(&docs[2]),
            v.validate(&docs[3]),
        )
        .await
    };
    let (slow, (hang, one, two)) = futures::future::join(slow, rest).await;
    let valid = Verdict::Valid {
        policy_name: Some("p".into()),
    };
    assert_eq!((&slow, &one, &two), (&valid, &valid, &valid));
    assert_eq!(
        error_message(hang),
        "haltsql validate did not finish within 1s"
    );
    let batch = f
        .metrics
        .validator_processes
        .with_label_values(&["batch"])
        .get();
    assert_eq!(batch, 1, "the three waiting documents ran together first");
    // slow 0.5 s, the batch's timeout 1 s, the hang's own timeout 1 s.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    f.assert_clean();
}
