//! `reload.watch` and the admin listener against the real `haltsql serve`
//! binary, with the config laid out as Kubernetes mounts a ConfigMap (files
//! that are symbolic links through `..data`, swapped atomically) and the
//! token hash in a Secret file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

#[path = "common/kit.rs"]
mod kit;

use kit::{
    BIN, Proc, free_port, publish, request, run, serve_proc, sha256_hex, swap_data_link, wait_port,
    wait_until, write,
};

const ORDERS: &str = "SELECT id FROM app.orders";
const CUSTOMERS: &str = "SELECT id FROM app.customers";

/// A ConfigMap volume: `..data` links to a timestamped folder, and each
/// file is a link through `..data`. `update` swaps `..data` at once.
struct ConfigMap {
    dir: PathBuf,
    generation: u32,
}

impl ConfigMap {
    fn new(dir: &Path, files: &[(&str, String)]) -> ConfigMap {
        let mut cm = ConfigMap {
            dir: dir.to_path_buf(),
            generation: 0,
        };
        cm.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name))
                .unwrap_or_else(|e| panic!("symlink: {e}"));
        }
        cm
    }

    fn update(&mut self, files: &[(&str, String)]) {
        self.generation += 1;
        let gen_dir = format!("..gen_{}", self.generation);
        for (name, content) in files {
            write(&self.dir.join(&gen_dir).join(name), content);
        }
        swap_data_link(&self.dir, &gen_dir);
    }
}

fn policy(tables: &[&str]) -> String {
    let mut t = String::new();
    for table in tables {
        t.push_str(&format!("  {table}:\n    columns: [id]\n"));
    }
    format!(
        "apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: agent
dialect: postgres
statements:
  allow: [select]
tables:
{t}"
    )
}

fn config(api: SocketAddr, admin: SocketAddr, secrets: &Path, max_request_bytes: u32) -> String {
    format!(
        "apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: {api}
  admin: {{listen: {admin}}}
  auth:
    tokens:
      - name: agent
        policy: agent
        sha256: ${{file:{secrets}/agent.sha256}}
policies:
  - file: policy.yaml
reload: {{watch: true}}
limits: {{max_request_bytes: {max_request_bytes}}}
logging: {{level: info, format: text}}
audit:
  sinks: [{{type: stdout}}]
",
        secrets = secrets.display()
    )
}

/// `haltsql serve`, once it listens on `api`.
fn start_server(config: &Path, log: &Path, api: SocketAddr) -> Proc {
    let mut p = serve_proc(config, log, &[]);
    wait_port(api.port(), &mut p, "haltsql serve", 30);
    p
}

/// `Some(allowed)` for a 200, `None` for any other status.
fn allowed(api: SocketAddr, token: &str, sql: &str) -> Option<bool> {
    let (status, body) = request(
        api,
        "POST",
        "/v1/verify",
        Some(token),
        &serde_json::json!({ "sql": sql }).to_string(),
    );
    if status != 200 {
        return None;
    }
    serde_json::from_str::<Value>(&body)
        .ok()?
        .get("allowed")?
        .as_bool()
}

fn admin_json(admin: SocketAddr, path: &str) -> Value {
    let (status, body) = request(admin, "GET", path, None, "");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

fn metric(admin: SocketAddr, line_prefix: &str) -> f64 {
    let (_, body) = request(admin, "GET", "/metrics", None, "");
    body.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[test]
fn reload_watch_applies_configmap_and_secret_changes_and_keeps_the_old_config_on_errors() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let secrets = d.join("secrets");
    write(
        &secrets.join("agent.sha256"),
        format!("{}\n", sha256_hex(b"token-one")),
    );
    let cm_dir = d.join("config");
    let mut cm = ConfigMap::new(
        &cm_dir,
        &[
            ("config.yaml", config(api, admin, &secrets, 65536)),
            ("policy.yaml", policy(&["app.orders"])),
        ],
    );
    let mut srv = start_server(&cm_dir.join("config.yaml"), &d.join("haltsql.log"), api);
    let ok = "haltsql_config_reloads_total{result=\"success\"}";
    let failed = "haltsql_config_reloads_total{result=\"failure\"}";
    assert_eq!(allowed(api, "token-one", ORDERS), Some(true));
    assert_eq!(allowed(api, "token-one", CUSTOMERS), Some(false));
    assert_eq!(metric(admin, ok), 0.0);

    // A ConfigMap update (the ..data swap) that widens the policy.
    cm.update(&[
        ("config.yaml", config(api, admin, &secrets, 65536)),
        ("policy.yaml", policy(&["app.orders", "app.customers"])),
    ]);
    wait_until("the widened policy", 30, || {
        allowed(api, "token-one", CUSTOMERS) == Some(true)
    });
    assert_eq!(metric(admin, ok), 1.0);

    // A Secret update: the token is rotated.
    publish(
        &secrets.join("agent.sha256"),
        format!("{}\n", sha256_hex(b"token-two")),
    );
    wait_until("the rotated token", 30, || {
        allowed(api, "token-two", ORDERS) == Some(true)
    });
    assert_eq!(
        allowed(api, "token-one", ORDERS),
        None,
        "the old token still works"
    );

    // A broken policy: logged with its location, counted, the old config kept.
    cm.update(&[
        ("config.yaml", config(api, admin, &secrets, 65536)),
        (
            "policy.yaml",
            policy(&["app.orders"]).replace("statements:", "statement:"),
        ),
    ]);
    wait_until("the failed reload to be counted", 30, || {
        metric(admin, failed) == 1.0
    });
    assert_eq!(allowed(api, "token-two", CUSTOMERS), Some(true));
    let log = srv.log();
    assert!(
        log.contains("config reload failed") && log.contains("policy.yaml:6:1"),
        "{log}"
    );
    let summary = admin_json(admin, "/config");
    assert_eq!(summary["reload"]["failures"], 1);
    assert!(
        summary["reload"]["last_errors"][0]
            .as_str()
            .unwrap_or_default()
            .contains("policy.yaml:6:1"),
        "{summary}"
    );

    // Fixed, with a setting only a restart applies.
    cm.update(&[
        ("config.yaml", config(api, admin, &secrets, 4096)),
        ("policy.yaml", policy(&["app.orders"])),
    ]);
    wait_until("the fixed config", 30, || {
        allowed(api, "token-two", CUSTOMERS) == Some(false)
    });
    assert_eq!(metric(admin, ok), 3.0);
    assert_eq!(metric(admin, failed), 1.0);
    let summary = admin_json(admin, "/config");
    assert_eq!(
        summary["reload"]["restart_required"],
        serde_json::json!(["limits"])
    );
    assert_eq!(summary["reload"]["last_errors"], serde_json::json!([]));
    srv.assert_running("haltsql serve");
}

#[test]
fn admin_listener_shows_state_but_no_secret() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let secrets = d.join("secrets");
    let token_hash = sha256_hex(b"the-secret-token");
    write(&secrets.join("agent.sha256"), &token_hash);
    // A JWKS given as content through a placeholder, as the operator does.
    let marker = "kid-that-must-not-leak";
    write(
        &secrets.join("jwks.json"),
        format!(
            r#"{{"keys": [{{"kty": "OKP", "crv": "Ed25519", "kid": "{marker}", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}}]}}"#
        ),
    );
    write(&d.join("policy.yaml"), policy(&["app.orders"]));
    let config = config(api, admin, &secrets, 65536).replace(
        "policies:",
        &format!(
            "    oidc:\n      - {{issuer: 'https://id.example', audience: haltsql, policy: agent, jwks_file: '${{file:{}/jwks.json}}'}}\npolicies:",
            secrets.display()
        ),
    );
    write(&d.join("config.yaml"), &config);
    let mut srv = start_server(&d.join("config.yaml"), &d.join("haltsql.log"), api);

    let (status, body) = request(admin, "GET", "/config", None, "");
    assert_eq!(status, 200);
    let summary: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(summary["auth"]["tokens"][0]["name"], "agent");
    assert_eq!(summary["auth"]["oidc"][0]["keys"], "content");
    assert_eq!(summary["policies"], serde_json::json!(["agent"]));
    assert_eq!(summary["listeners"]["admin"], admin.to_string());
    assert_eq!(summary["reload"]["watch"], true);
    for secret in [token_hash.as_str(), "the-secret-token", marker] {
        assert!(!body.contains(secret), "/config shows {secret}: {body}");
    }
    assert_eq!(admin_json(admin, "/bundles"), serde_json::json!([]));
    let (status, metrics) = request(admin, "GET", "/metrics", None, "");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("haltsql_config_info{sha256=\""),
        "{metrics}"
    );
    assert!(!metrics.contains(&token_hash));
    assert_eq!(request(admin, "GET", "/readyz", None, "").0, 200);
    // The admin routes are not on the API listener.
    assert_eq!(request(api, "GET", "/config", None, "").0, 404);
    srv.assert_running("haltsql serve");
}

#[test]
fn serve_refuses_settings_in_the_reserved_sections() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let secrets = d.join("secrets");
    write(&secrets.join("agent.sha256"), sha256_hex(b"t"));
    write(&d.join("policy.yaml"), policy(&["app.orders"]));
    for (section, key) in [("telemetry", "otlp"), ("opa", "url"), ("secrets", "vault")] {
        let config = format!(
            "{}{section}: {{{key}: x}}\n",
            config(api, admin, &secrets, 65536)
        );
        write(&d.join("config.yaml"), &config);
        let out = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(d.join("config.yaml"))
            .output()
            .unwrap_or_else(|e| panic!("spawn: {e}"));
        assert_eq!(out.status.code(), Some(2), "{section}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "{section}.{key}: unknown key, this mapping takes no keys"
            )),
            "{err}"
        );
    }
}

fn policy_of(api: SocketAddr, token: &str) -> Option<String> {
    let (status, body) = request(
        api,
        "POST",
        "/v1/verify",
        Some(token),
        &serde_json::json!({ "sql": ORDERS }).to_string(),
    );
    (status == 200)
        .then(|| serde_json::from_str::<Value>(&body).ok())
        .flatten()
        .and_then(|v| v.get("policy")?.as_str().map(str::to_string))
}

#[test]
fn reload_with_a_bundle_source_composes_the_new_config_with_the_bundle_in_use() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let d = dir.path();
    // A signed bundle in the source's cache; the source itself never answers.
    run(Command::new(BIN)
        .args(["bundle", "keygen", "--private-key"])
        .arg(d.join("k"))
        .arg("--public-key")
        .arg(d.join("k.pub")));
    write(
        &d.join("bundle/orders.yaml"),
        policy(&["app.orders"]).replace("name: agent", "name: orders"),
    );
    run(Command::new(BIN)
        .args(["bundle", "build"])
        .arg(d.join("bundle"))
        .arg("-o")
        .arg(d.join("b.tar.gz")));
    run(Command::new(BIN)
        .args(["bundle", "sign", "--key"])
        .arg(d.join("k"))
        .arg(d.join("b.tar.gz")));
    let read = |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    haltsql::bundle::cache::write(
        &d.join("cache"),
        &haltsql::bundle::cache::Cached {
            version: None,
            bundle: read(d.join("b.tar.gz")),
            signature: read(d.join("b.tar.gz.sig")),
        },
    )
    .unwrap_or_else(|e| panic!("cache: {e}"));
    let public = haltsql::bundle::sign::read_public(&d.join("k.pub"))
        .unwrap_or_else(|e| panic!("public key: {e}"));
    let public = base64::engine::general_purpose::STANDARD.encode(public);

    let api: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let secrets = d.join("secrets");
    write(&secrets.join("agent.sha256"), sha256_hex(b"t"));
    write(&d.join("policy.yaml"), policy(&["app.orders"]));
    let with_token_policy = |p: &str| {
        config(api, admin, &secrets, 65536)
            .replace("        policy: agent\n", &format!("        policy: {p}\n"))
            .replace(
                "  - file: policy.yaml\n",
                &format!(
                    "  - file: policy.yaml\n  - bundle_source:\n      name: b\n      https: {{url: 'https://127.0.0.1:1/b.tar.gz'}}\n      public_keys: ['{public}']\n      name_prefix: b.\n      poll_interval_seconds: 3600\n      cache_dir: {}\n",
                    d.join("cache").display()
                ),
            )
    };
    write(&d.join("config.yaml"), with_token_policy("b.orders"));
    let mut srv = start_server(&d.join("config.yaml"), &d.join("haltsql.log"), api);
    assert_eq!(policy_of(api, "t").as_deref(), Some("b.orders"));
    let bundles = admin_json(admin, "/bundles");
    assert_eq!(bundles[0]["current"]["origin"], "cache", "{bundles}");
    assert_eq!(
        bundles[0]["current"]["policies"],
        serde_json::json!(["b.orders"])
    );

    // The token moves to the file policy: composed with the cached bundle.
    publish(&d.join("config.yaml"), with_token_policy("agent"));
    wait_until("the token on the file policy", 30, || {
        policy_of(api, "t").as_deref() == Some("agent")
    });
    // A bundle policy the bundle does not have: refused, the old set stays.
    publish(&d.join("config.yaml"), with_token_policy("b.missing"));
    let failed = "haltsql_config_reloads_total{result=\"failure\"}";
    wait_until("the failed reload", 30, || metric(admin, failed) == 1.0);
    assert_eq!(policy_of(api, "t").as_deref(), Some("agent"));
    let summary = admin_json(admin, "/config");
    assert!(
        summary["reload"]["last_errors"][0]
            .as_str()
            .unwrap_or_default()
            .contains("b.missing"),
        "{summary}"
    );
    srv.assert_running("haltsql serve");
}
