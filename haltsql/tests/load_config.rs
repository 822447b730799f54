//! Config document rules: for each, a good and a bad document, with the
//! exact located messages.

use std::collections::BTreeMap;
use std::path::PathBuf;

use haltsql::load::{
    self, AuditSink, BundleLocation, ClientAuth, EnvSource, EsTarget, FileOrContent, KafkaTls,
    LoadOptions, LogFormat, LogLevel, MtlsMatch, OidcPolicy, S3Credentials, SaslMechanism,
    SourceAuth, TlsVersion,
};
use sha2::{Digest, Sha256};

const SECRET: &str = "var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256";

struct Fixture {
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
}

fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

const POLICY_ORDERS: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders-agent
tables:
  app.orders:
    columns: [id, status]
";

impl Fixture {
    /// A temp dir laid out like the pod: policy files beside the config,
    /// the token hash Secret under var/run/haltsql/secrets.
    fn pod() -> Self {
        let f = Fixture {
            dir: tempfile::tempdir().unwrap(),
            env: BTreeMap::new(),
        };
        f.write("policy-orders.yaml", POLICY_ORDERS);
        f.write(
            "policy-reports.yaml",
            &POLICY_ORDERS.replace("orders-agent", "reports"),
        );
        f.write(SECRET, &format!("{}\n", token_hash("orders-token")));
        f
    }

    fn write(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        p
    }

    fn opts(&self) -> LoadOptions {
        LoadOptions {
            root: Some(self.dir.path().to_path_buf()),
            env: EnvSource::Map(self.env.clone()),
            ..LoadOptions::default()
        }
    }

    fn errors(&self, file: &str) -> Vec<String> {
        let prefix = format!("{}/", self.dir.path().display());
        let r = load::load_files_with(&[self.dir.path().join(file)], &self.opts());
        r.errors
            .iter()
            .map(|e| e.to_string().replace(&prefix, ""))
            .collect()
    }

    fn config(&self, doc: &str) -> load::LoadedConfig {
        let p = self.write("config.yaml", doc);
        match load::load_config_with(&p, &self.opts()) {
            Ok(c) => c,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// Lines 1-11; tests append from line 12 (two spaces: inside `server`,
/// four: inside `server.auth`, none: top level).
const BASE: &str = "\
apiVersion: haltsql.dev/v1
kind: Config
policies:
  - file: policy-orders.yaml
server:
  listen: 0.0.0.0:8080
  auth:
    tokens:
      - name: orders-agent
        policy: orders-agent
        sha256: ${file:/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256}
";

fn with(extra: &str) -> String {
    format!("{BASE}{extra}")
}

fn check(doc: &str, expected: &[&str]) {
    check_in(&Fixture::pod(), doc, expected);
}

/// [`check`] in a given fixture (with extra files).
fn check_in(f: &Fixture, doc: &str, expected: &[&str]) {
    f.write("config.yaml", doc);
    assert_eq!(f.errors("config.yaml"), expected, "document:\n{doc}");
}

#[test]
fn base_config_loads_resolved() {
    let f = Fixture::pod();
    let c = f.config(BASE);
    assert_eq!(c.server.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.server.health_listen, None);
    assert!(c.server.tls.is_none());
    assert!(!c.server.auth.allow_unauthenticated);
    assert_eq!(c.server.auth.tokens.len(), 1);
    let t = &c.server.auth.tokens[0];
    assert_eq!(t.name, "orders-agent");
    assert_eq!(t.policy, "orders-agent");
    // One trailing newline was removed from the Secret file.
    assert_eq!(t.sha256_hex(), token_hash("orders-token"));
    assert_eq!(c.policies.len(), 1);
    assert_eq!(c.policies[0].name, "orders-agent");
    assert!(c.policy("orders-agent").is_some());
    assert_eq!(c.default_policy, None);
    assert_eq!(c.limits.max_request_bytes, 65536);
    assert_eq!(c.logging.level, LogLevel::Info);
    assert_eq!(c.logging.format, LogFormat::Json);
    assert!(!c.audit.log_raw_sql);
    assert_eq!(c.audit.sinks, vec![AuditSink::Stdout]);
    assert!(!c.reload.watch);
    assert!(c.bundle_sources.is_empty());
}

const PEM_KEY: &str = "-----BEGIN PUBLIC KEY-----\n          MCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n          -----END PUBLIC KEY-----";
const B64_KEY: &str = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
const B64_KEY2: &str = "PUAXw+hDiVqStwqnTRt+vJyYLM8uxJaMwM1V8Sr0Zgw=";

#[test]
fn contract_example_config_loads() {
    let f = Fixture::pod();
    let doc = format!(
        "\
apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: 0.0.0.0:8080
  health_listen: 0.0.0.0:8081
  tls:
    cert_file: /var/run/haltsql/tls/tls.crt
    key_file: /var/run/haltsql/tls/tls.key
    client_ca_file: /var/run/haltsql/tls/ca.crt
    client_auth: optional
    min_version: \"1.3\"
  auth:
    allow_unauthenticated: true
    tokens:
      - name: orders-agent
        policy: orders-agent
        sha256: ${{file:/{SECRET}}}
    oidc:
      - {{issuer: https://issuer.example.com, audience: haltsql, policy_claim: haltsql_policy}}
      - {{issuer: https://other.example.com, audience: haltsql, policy: reports, jwks_file: /etc/jwks.json}}
    mtls:
      identities:
        - {{uri: spiffe://corp/ns/app/sa/agent, policy: prod.orders}}
        - {{subject: CN=agent, policy: orders-agent}}
  admin: {{listen: 127.0.0.1:9090}}
policies:
  - file: policy-orders.yaml
  - file: policy-reports.yaml
  - bundle_source:
      name: prod
      oci: {{ref: ghcr.io/corp/p:prod, plain_http: false, auth: {{type: basic, username: bot, password: '${{env:REGISTRY_PASSWORD}}'}}}}
      public_keys:
        - |
          {PEM_KEY}
        - {B64_KEY2}
      name_prefix: prod.
      poll_interval_seconds: 60
      cache_dir: /var/cache/haltsql/bundles/prod
  - bundle_source:
      name: staging
      s3: {{bucket: corp-policies, key: staging/bundle.tar, region: eu-west-1, credentials: {{source: web_identity}}}}
      public_keys: [\"{B64_KEY}\"]
      name_prefix: staging.
default_policy: orders-agent
reload: {{watch: true}}
limits: {{max_request_bytes: 1024}}
logging: {{level: debug, format: text}}
telemetry: {{}}
opa: {{}}
secrets: {{}}
audit:
  log_raw_sql: true
  sinks: [{{type: stdout}}, {{type: file, path: /var/log/haltsql/audit.jsonl}}]
"
    );
    let mut f = f;
    f.env.insert("REGISTRY_PASSWORD".into(), "hunter2".into());
    let c = f.config(&doc);
    let tls = c.server.tls.as_ref().unwrap();
    // Absolute paths are rooted like the placeholder files.
    assert_eq!(
        tls.cert_file,
        f.dir.path().join("var/run/haltsql/tls/tls.crt")
    );
    assert_eq!(tls.client_auth, ClientAuth::Optional);
    assert_eq!(tls.min_version, TlsVersion::Tls13);
    assert_eq!(c.server.health_listen.unwrap().port(), 8081);
    assert_eq!(c.server.admin.listen.unwrap().port(), 9090);
    assert!(c.server.auth.allow_unauthenticated);
    assert_eq!(
        c.server.auth.oidc[0].policy,
        OidcPolicy::Claim("haltsql_policy".into())
    );
    assert_eq!(
        c.server.auth.mtls_identities[0].matcher,
        MtlsMatch::Uri("spiffe://corp/ns/app/sa/agent".into())
    );
    assert_eq!(c.policies.len(), 2);
    assert_eq!(c.bundle_sources.len(), 2);
    let prod = &c.bundle_sources[0];
    assert_eq!(prod.public_keys.len(), 2);
    assert_eq!(
        hex::encode(prod.public_keys[0]),
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    );
    assert_eq!(prod.name_prefix.as_deref(), Some("prod."));
    assert_eq!(prod.poll_interval_seconds, 60);
    match &prod.location {
        BundleLocation::Oci {
            reference, auth, ..
        } => {
            assert_eq!(reference, "ghcr.io/corp/p:prod");
            match auth {
                SourceAuth::Basic { password, .. } => assert_eq!(password.expose(), "hunter2"),
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    // Secrets do not show in Debug output.
    assert!(!format!("{c:?}").contains("hunter2"));
    match &c.bundle_sources[1].location {
        BundleLocation::S3 { credentials, .. } => {
            assert_eq!(*credentials, S3Credentials::WebIdentity)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.default_policy.as_deref(), Some("orders-agent"));
    assert!(c.reload.watch);
    assert_eq!(c.limits.max_request_bytes, 1024);
    assert_eq!(c.logging.level, LogLevel::Debug);
    assert_eq!(c.logging.format, LogFormat::Text);
    assert!(c.audit.log_raw_sql);
    assert_eq!(c.audit.sinks.len(), 2);
}

// --- placeholders -----------------------------------------------------------

#[test]
fn missing_secret_file_is_located_at_the_placeholder() {
    let f = Fixture::pod();
    f.write("config.yaml", BASE);
    assert!(f.errors("config.yaml").is_empty());
    std::fs::remove_file(f.dir.path().join(SECRET)).unwrap();
    assert_eq!(
        f.errors("config.yaml"),
        [
            "config.yaml:11:17: server.auth.tokens[0].sha256: placeholder file /var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256: file not found"
        ]
    );
}

#[test]
fn env_placeholder() {
    let doc = BASE.replace(
        "${file:/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256}",
        "${env:ORDERS_HASH}",
    );
    let mut f = Fixture::pod();
    f.write("config.yaml", &doc);
    assert_eq!(
        f.errors("config.yaml"),
        [
            "config.yaml:11:17: server.auth.tokens[0].sha256: environment variable ORDERS_HASH is not set"
        ]
    );
    f.env.insert("ORDERS_HASH".into(), token_hash("t"));
    assert!(f.errors("config.yaml").is_empty());
}

#[test]
fn malformed_placeholders() {
    check(
        &BASE.replace("${file:/var/run", "${file:var/run"),
        &[
            "config.yaml:11:17: server.auth.tokens[0].sha256: a ${file:...} placeholder needs an absolute path",
        ],
    );
    check(
        &BASE.replace(
            "${file:/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256}",
            "${vault:x}",
        ),
        &[
            "config.yaml:11:17: server.auth.tokens[0].sha256: unknown placeholder, expected ${file:/absolute/path} or ${env:NAME}",
        ],
    );
    check(
        &BASE.replace(
            "${file:/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256}",
            "${env:A-B}",
        ),
        &[
            "config.yaml:11:17: server.auth.tokens[0].sha256: a ${env:...} placeholder needs a variable name of letters, digits and _",
        ],
    );
}

#[test]
fn token_hash_must_be_lower_case_hex_and_is_never_shown() {
    let f = Fixture::pod();
    let upper = token_hash("x").to_uppercase();
    f.write(SECRET, &upper);
    f.write("config.yaml", BASE);
    let errs = f.errors("config.yaml");
    assert_eq!(
        errs,
        [
            "config.yaml:11:17: server.auth.tokens[0].sha256: must be 64 lower-case hex digits (the SHA-256 of the token, as printed by haltsql hash-token)"
        ]
    );
    assert!(!errs[0].contains(&upper));
    // The raw token instead of its hash.
    f.write(SECRET, "orders-token\n");
    assert_eq!(f.errors("config.yaml").len(), 1);
    // Literal values are checked the same way.
    check(
        &BASE.replace(
            "${file:/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256}",
            "abc",
        ),
        &[
            "config.yaml:11:17: server.auth.tokens[0].sha256: must be 64 lower-case hex digits (the SHA-256 of the token, as printed by haltsql hash-token)",
        ],
    );
    check(
        &BASE.replace(
            "${file:/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256}",
            &token_hash("literal"),
        ),
        &[],
    );
}

// --- tokens and references --------------------------------------------------

#[test]
fn token_policy_must_be_loaded() {
    check(
        &BASE.replace("policy: orders-agent", "policy: nobody"),
        &[
            "config.yaml:10:17: server.auth.tokens[0].policy: policy \"nobody\" is not loaded by this config (loaded: \"orders-agent\")",
        ],
    );
    check(
        &BASE.replace("policy: orders-agent", "policy: Nobody"),
        &[
            "config.yaml:10:17: server.auth.tokens[0].policy: invalid policy name \"Nobody\": must be a lower-case DNS-1123 subdomain",
        ],
    );
}

#[test]
fn duplicate_token_names_and_hashes() {
    let h = token_hash("orders-token");
    check(
        &with(&format!(
            "      - name: orders-agent\n        policy: orders-agent\n        sha256: {h}\n"
        )),
        &[
            "config.yaml:12:15: server.auth.tokens[1].name: token name \"orders-agent\" is already used by server.auth.tokens[0]",
            "config.yaml:14:17: server.auth.tokens[1].sha256: the same token hash as server.auth.tokens[0]: a token must select exactly one policy",
        ],
    );
    check(
        &with(&format!(
            "      - name: second\n        policy: orders-agent\n        sha256: {}\n",
            token_hash("other")
        )),
        &[],
    );
    check(
        &with(
            "      - name: 'bad name'\n        policy: orders-agent\n        sha256: x\n      - {}\n",
        ),
        &[
            "config.yaml:12:15: server.auth.tokens[1].name: invalid token name \"bad name\": letters, digits, '.', '_' and '-', starting with a letter or digit, at most 253 characters",
            "config.yaml:14:17: server.auth.tokens[1].sha256: must be 64 lower-case hex digits (the SHA-256 of the token, as printed by haltsql hash-token)",
            "config.yaml:15:9: server.auth.tokens[2].name: required key is missing",
            "config.yaml:15:9: server.auth.tokens[2].policy: required key is missing",
            "config.yaml:15:9: server.auth.tokens[2].sha256: required key is missing",
        ],
    );
}

#[test]
fn default_policy_and_unauthenticated() {
    check(
        &with("    allow_unauthenticated: true\ndefault_policy: orders-agent\n"),
        &[],
    );
    check(
        &with("    allow_unauthenticated: true\n"),
        &[
            "config.yaml:12:28: server.auth.allow_unauthenticated: allow_unauthenticated needs default_policy (the policy for requests without a token)",
        ],
    );
    check(
        &with("default_policy: reports\n"),
        &[
            "config.yaml:12:17: default_policy: policy \"reports\" is not loaded by this config (loaded: \"orders-agent\")",
        ],
    );
    check(
        &with("    allow_unauthenticated: \"true\"\n"),
        &[
            "config.yaml:12:28: server.auth.allow_unauthenticated: expected true or false, found a string",
        ],
    );
    check(
        &with("    allow_unauthenticated: yes\n"),
        &[
            "config.yaml:12:28: server.auth.allow_unauthenticated: expected true or false, found a string",
        ],
    );
}

// --- policies ------------------------------------------------------------------

#[test]
fn policy_entries() {
    check(
        &BASE.replace(
            "  - file: policy-orders.yaml\n",
            "  - file: policy-orders.yaml\n  - file: ./policy-orders.yaml\n",
        ),
        &[
            "config.yaml:5:11: policies[1].file: policy name \"orders-agent\" is already loaded by policies[0].file (two policies with one name)",
        ],
    );
    check(
        &BASE.replace("file: policy-orders.yaml", "file: missing.yaml"),
        &[
            "config.yaml:4:11: policies[0].file: cannot read policy file \"missing.yaml\": file not found",
        ],
    );
    check(
        &BASE.replace(
            "policies:\n  - file: policy-orders.yaml\n",
            "policies: []\n",
        ),
        &[
            "config.yaml:3:11: policies: must list at least one policy",
            "config.yaml:9:17: server.auth.tokens[0].policy: policy \"orders-agent\" is not loaded by this config (loaded: none)",
        ],
    );
    check(
        &BASE.replace(
            "  - file: policy-orders.yaml\n",
            "  - file: policy-orders.yaml\n    bundle_source: {}\n",
        ),
        &["config.yaml:4:5: policies[0]: exactly one of file or bundle_source is required"],
    );
    check(
        &BASE.replace(
            "  - file: policy-orders.yaml\n",
            "  - file: policy-orders.yaml\n  - path: x.yaml\n",
        ),
        &[
            "config.yaml:5:5: policies[1].path: unknown key, expected one of: file, bundle_source",
            "config.yaml:5:5: policies[1]: exactly one of file or bundle_source is required",
        ],
    );
}

#[test]
fn policy_file_errors_are_located_in_the_policy_file() {
    let f = Fixture::pod();
    f.write(
        "policies/orders.yaml",
        &POLICY_ORDERS.replace("columns:", "colums:"),
    );
    f.write(
        "config.yaml",
        &BASE.replace("file: policy-orders.yaml", "file: policies/orders.yaml"),
    );
    assert_eq!(
        f.errors("config.yaml"),
        [
            "policies/orders.yaml:7:5: tables.app.orders.colums: unknown key, expected one of: columns"
        ]
    );
    // A Config where a Policy belongs.
    f.write("policies/orders.yaml", BASE);
    assert_eq!(
        f.errors("config.yaml"),
        ["policies/orders.yaml:2:7: kind: a policy file must hold a kind: Policy document"]
    );
}

// --- server ------------------------------------------------------------------------

#[test]
fn listeners() {
    check(
        &BASE.replace("0.0.0.0:8080", "localhost:8080"),
        &[
            "config.yaml:6:11: server.listen: invalid address \"localhost:8080\": expected IP:PORT, for example 0.0.0.0:8080 or [::]:8080",
        ],
    );
    check(
        &BASE.replace("  listen: 0.0.0.0:8080\n", ""),
        &["config.yaml:6:3: server.listen: required key is missing"],
    );
    check(
        &with("  health_listen: 0.0.0.0:8080\n"),
        &["config.yaml:12:18: server.health_listen: must differ from server.listen"],
    );
    check(
        &with("  health_listen: \"[::]:8081\"\n  admin: {listen: 127.0.0.1:0}\n"),
        &[],
    );
    check(
        &with("  admin: {port: 1}\n"),
        &["config.yaml:12:11: server.admin.port: unknown key, expected one of: listen"],
    );
}

#[test]
fn tls_rules() {
    let tls = "  tls:\n    cert_file: /tls/tls.crt\n    key_file: /tls/tls.key\n";
    check(&with(tls), &[]);
    check(&with(&format!("{tls}    client_auth: none\n")), &[]);
    check(
        &with(&format!("{tls}    client_auth: required\n")),
        &["config.yaml:13:5: server.tls.client_ca_file: required unless client_auth is none"],
    );
    check(
        &with(&format!(
            "{tls}    client_auth: optional\n    client_ca_file: /tls/ca.crt\n"
        )),
        &[],
    );
    check(
        &with(&format!("{tls}    client_auth: sometimes\n")),
        &[
            "config.yaml:15:18: server.tls.client_auth: unknown value \"sometimes\", expected one of: none, optional, required",
        ],
    );
    check(
        &with("  tls:\n    cert_file: tls.crt\n"),
        &[
            "config.yaml:13:5: server.tls.key_file: required key is missing",
            "config.yaml:13:16: server.tls.cert_file: \"tls.crt\" must be an absolute path",
        ],
    );
    check(&with(&format!("{tls}    min_version: 1.3\n")), &[]);
    check(
        &with(&format!("{tls}    min_version: \"1.1\"\n")),
        &[
            "config.yaml:15:18: server.tls.min_version: unknown value \"1.1\", expected one of: 1.2, 1.3",
        ],
    );
}

#[test]
fn mtls_identities_need_client_auth() {
    let ids =
        "    mtls:\n      identities:\n        - {dns_name: agent.corp, policy: orders-agent}\n";
    check(
        &with(ids),
        &[
            "config.yaml:14:9: server.auth.mtls.identities: mTLS identities need server.tls with client_auth optional or required",
        ],
    );
    let tls_none = "  tls:\n    cert_file: /c\n    key_file: /k\n";
    check(
        &with(&format!("{ids}{tls_none}")),
        &[
            "config.yaml:14:9: server.auth.mtls.identities: mTLS identities need server.tls with client_auth optional or required",
        ],
    );
    check(
        &with(&format!(
            "{ids}{tls_none}    client_auth: required\n    client_ca_file: /ca\n"
        )),
        &[],
    );
    check(
        &with(&format!(
            "    mtls:\n      identities:\n        - {{uri: spiffe://a, subject: CN=a, policy: orders-agent}}\n{tls_none}    client_auth: required\n    client_ca_file: /ca\n"
        )),
        &[
            "config.yaml:14:11: server.auth.mtls.identities[0]: exactly one of subject, dns_name or uri is required",
        ],
    );
    check(
        &with(&format!(
            "    mtls:\n      identities:\n        - {{uri: spiffe://a, policy: nobody}}\n{tls_none}    client_auth: required\n    client_ca_file: /ca\n"
        )),
        &[
            "config.yaml:14:37: server.auth.mtls.identities[0].policy: policy \"nobody\" is not loaded by this config (loaded: \"orders-agent\")",
        ],
    );
}

#[test]
fn oidc_jwks_file_is_a_path_or_the_jwks_itself() {
    let f = Fixture::pod();
    let c = f.config(&with(
        "    oidc:\n      - {issuer: https://id.corp, audience: haltsql, policy: orders-agent, jwks_file: '{\"keys\": []}'}\n",
    ));
    assert!(matches!(
        &c.server.auth.oidc[0].jwks_file,
        Some(haltsql::load::FileOrContent::Content(s)) if s.expose() == "{\"keys\": []}"
    ));
    let c = f.config(&with(
        "    oidc:\n      - {issuer: https://id.corp, audience: haltsql, policy: orders-agent, jwks_file: /etc/jwks.json}\n",
    ));
    assert!(matches!(
        &c.server.auth.oidc[0].jwks_file,
        Some(haltsql::load::FileOrContent::Path(p)) if p.ends_with("etc/jwks.json")
    ));
    // Content that is not a JWKS is refused without being shown.
    check(
        &with(
            "    oidc:\n      - {issuer: https://id.corp, audience: haltsql, policy: orders-agent, jwks_file: '{\"kty\": \"RSA\", \"d\": \"private\"}'}\n",
        ),
        &[
            "config.yaml:13:87: server.auth.oidc[0].jwks_file: the content is not a JWKS JSON document ({\"keys\": [...]}); expected an absolute path or a JWKS JSON document ({\"keys\": [...]})",
        ],
    );
}

#[test]
fn oidc_rules() {
    check(
        &with(
            "    oidc:\n      - {issuer: https://id.corp, audience: haltsql, policy: orders-agent}\n",
        ),
        &[],
    );
    check(
        &with(
            "    oidc:\n      - {issuer: http://id.corp, audience: haltsql, policy: orders-agent}\n",
        ),
        &[
            "config.yaml:13:18: server.auth.oidc[0].issuer: invalid issuer \"http://id.corp\": expected a https:// URL",
        ],
    );
    check(
        &with(
            "    oidc:\n      - {issuer: https://id.corp, audience: haltsql, policy: orders-agent, policy_claim: p}\n",
        ),
        &[
            "config.yaml:13:9: server.auth.oidc[0]: exactly one of policy or policy_claim is required",
        ],
    );
    check(
        &with("    oidc:\n      - {issuer: https://id.corp, audience: haltsql, policy: reports}\n"),
        &[
            "config.yaml:13:62: server.auth.oidc[0].policy: policy \"reports\" is not loaded by this config (loaded: \"orders-agent\")",
        ],
    );
    check(
        &with(
            "    oidc:\n      - {issuer: https://id.corp, policy_claim: p, jwks_file: jwks.json}\n",
        ),
        &[
            "config.yaml:13:9: server.auth.oidc[0].audience: required key is missing",
            "config.yaml:13:63: server.auth.oidc[0].jwks_file: \"jwks.json\" is not an absolute path; expected an absolute path or a JWKS JSON document ({\"keys\": [...]})",
        ],
    );
}

// --- bundle sources ----------------------------------------------------------------

fn bundle(body: &str) -> String {
    BASE.replace(
        "  - file: policy-orders.yaml\n",
        "  - file: policy-orders.yaml\n  - bundle_source:\n      name: prod\n",
    )
    .replace("server:\n", &format!("{body}server:\n"))
}

// In `bundle(...)` documents the config is: lines 1-4 as BASE, 5 `  -
// bundle_source:`, 6 `name: prod`, then the body from line 7, then the
// `server` section of BASE.
const OCI: &str = "      oci: {ref: ghcr.io/corp/p:prod}\n";

fn keys(k: &str) -> String {
    format!("      public_keys: [\"{k}\"]\n")
}

#[test]
fn bundle_source_good_forms() {
    check(&bundle(&format!("{OCI}{}", keys(B64_KEY))), &[]);
    check(
        &bundle(&format!(
            "      https: {{url: https://policies.corp/prod.tar, auth: {{type: token, token: abc}}}}\n{}",
            keys(B64_KEY)
        )),
        &[],
    );
    check(
        &bundle(&format!(
            "      s3: {{bucket: corp-policies, key: prod.tar, endpoint: http://minio:9000, credentials: {{source: static, access_key_id: AK, secret_access_key: SK}}}}\n{}",
            keys(B64_KEY)
        )),
        &[],
    );
    check(
        &bundle(&format!(
            "{OCI}      public_keys:\n        - |\n          {PEM_KEY}\n"
        )),
        &[],
    );
}

#[test]
fn bundle_source_form_rules() {
    let k = keys(B64_KEY);
    check(
        &bundle(&k),
        &[
            "config.yaml:6:7: policies[1].bundle_source: exactly one of oci, https or s3 is required",
        ],
    );
    check(
        &bundle(&format!("{OCI}      https: {{url: https://a}}\n{k}")),
        &[
            "config.yaml:6:7: policies[1].bundle_source: exactly one of oci, https or s3 is required",
        ],
    );
    check(
        &bundle(&format!("      oci: {{ref: ghcr.io/corp/p}}\n{k}")),
        &[
            "config.yaml:7:18: policies[1].bundle_source.oci.ref: invalid OCI reference \"ghcr.io/corp/p\": a tag or a digest is required, for example :prod or @sha256:...",
        ],
    );
    check(
        &bundle(&format!(
            "      oci: {{ref: ghcr.io/corp/p:prod, plain_http: true, auth: {{type: basic, username: u, password: p}}}}\n{k}"
        )),
        &[
            "config.yaml:7:63: policies[1].bundle_source.oci.auth: credentials would be sent in clear text with plain_http: true",
        ],
    );
    check(
        &bundle(&format!(
            "      https: {{url: http://policies.corp/p.tar}}\n{k}"
        )),
        &[
            "config.yaml:7:20: policies[1].bundle_source.https.url: invalid URL \"http://policies.corp/p.tar\": expected a https:// URL",
        ],
    );
    check(
        &bundle(&format!(
            "      https: {{url: https://p.corp/x, auth: {{type: token, password: p}}}}\n{k}"
        )),
        &[
            "config.yaml:7:44: policies[1].bundle_source.https.auth.token: required key is missing",
            "config.yaml:7:58: policies[1].bundle_source.https.auth.password: unknown key, expected one of: type, token",
        ],
    );
    check(
        &bundle(&format!(
            "      https: {{url: https://p.corp/x, auth: {{type: basic, username: u}}}}\n{k}"
        )),
        &[
            "config.yaml:7:44: policies[1].bundle_source.https.auth.password: required key is missing",
        ],
    );
    check(
        &bundle(&format!(
            "      https: {{url: https://p.corp/x, auth: {{type: oauth}}}}\n{k}"
        )),
        &[
            "config.yaml:7:51: policies[1].bundle_source.https.auth.type: unknown value \"oauth\", expected one of: none, basic, token",
        ],
    );
}

#[test]
fn bundle_source_s3_credentials() {
    let k = keys(B64_KEY);
    check(
        &bundle(&format!(
            "      s3: {{bucket: corp-policies, key: p.tar, credentials: {{source: static, access_key_id: AK}}}}\n{k}"
        )),
        &[
            "config.yaml:7:60: policies[1].bundle_source.s3.credentials.secret_access_key: required key is missing",
        ],
    );
    check(
        &bundle(&format!(
            "      s3: {{bucket: corp-policies, key: p.tar, credentials: {{source: env, access_key_id: AK}}}}\n{k}"
        )),
        &[
            "config.yaml:7:74: policies[1].bundle_source.s3.credentials.access_key_id: unknown key, expected one of: source",
        ],
    );
    check(
        &bundle(&format!(
            "      s3: {{bucket: corp-policies, key: p.tar, credentials: {{source: magic}}}}\n{k}"
        )),
        &[
            "config.yaml:7:69: policies[1].bundle_source.s3.credentials.source: unknown value \"magic\", expected one of: env, static, web_identity, instance",
        ],
    );
    check(
        &bundle(&format!("      s3: {{bucket: Corp_Policies}}\n{k}")),
        &[
            "config.yaml:7:11: policies[1].bundle_source.s3.key: required key is missing",
            "config.yaml:7:20: policies[1].bundle_source.s3.bucket: invalid bucket name \"Corp_Policies\": 3 to 63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit",
        ],
    );
}

#[test]
fn bundle_source_public_keys() {
    check(
        &bundle(&format!("{OCI}      public_keys: []\n")),
        &[
            "config.yaml:8:20: policies[1].bundle_source.public_keys: must list at least one Ed25519 public key",
        ],
    );
    check(
        &bundle(OCI),
        &["config.yaml:6:7: policies[1].bundle_source.public_keys: required key is missing"],
    );
    check(
        &bundle(&format!(
            "{OCI}{}",
            keys("11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHUQ==")
        )),
        &[
            "config.yaml:8:21: policies[1].bundle_source.public_keys[0]: invalid public key: base64 of 31 bytes; an Ed25519 public key has 32",
        ],
    );
    check(
        &bundle(&format!(
            "{OCI}{}",
            keys("AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
        )),
        &[
            "config.yaml:8:21: policies[1].bundle_source.public_keys[0]: invalid public key: not a valid Ed25519 public key (not a curve point)",
        ],
    );
    check(
        &bundle(&format!(
            "{OCI}{}",
            keys("AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
        )),
        &[
            "config.yaml:8:21: policies[1].bundle_source.public_keys[0]: invalid public key: a weak (small-order) Ed25519 key",
        ],
    );
    check(
        &bundle(&format!("{OCI}{}", keys("not a key!"))),
        &[
            "config.yaml:8:21: policies[1].bundle_source.public_keys[0]: invalid public key: neither PEM nor base64",
        ],
    );
    check(
        &bundle(&format!(
            "{OCI}      public_keys:\n        - |\n          -----BEGIN PUBLIC KEY-----\n          MCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHUR==\n          -----END PUBLIC KEY-----\n"
        )),
        &[
            "config.yaml:10:11: policies[1].bundle_source.public_keys[0]: invalid public key: not an Ed25519 public key in PEM (SubjectPublicKeyInfo) form",
        ],
    );
    check(
        &bundle(&format!(
            "{OCI}      public_keys: [\"{B64_KEY}\", \"{B64_KEY}\"]\n"
        )),
        &[
            "config.yaml:8:69: policies[1].bundle_source.public_keys[1]: duplicate key (same as policies[1].bundle_source.public_keys[0])",
        ],
    );
}

#[test]
fn bundle_source_poll_interval_and_paths() {
    let k = keys(B64_KEY);
    check(
        &bundle(&format!("{OCI}{k}      poll_interval_seconds: 10\n")),
        &[],
    );
    check(
        &bundle(&format!("{OCI}{k}      poll_interval_seconds: 86400\n")),
        &[],
    );
    check(
        &bundle(&format!("{OCI}{k}      poll_interval_seconds: 9\n")),
        &[
            "config.yaml:9:30: policies[1].bundle_source.poll_interval_seconds: out of range, expected 10 to 86400",
        ],
    );
    check(
        &bundle(&format!("{OCI}{k}      poll_interval_seconds: 86401\n")),
        &[
            "config.yaml:9:30: policies[1].bundle_source.poll_interval_seconds: out of range, expected 10 to 86400",
        ],
    );
    check(
        &bundle(&format!("{OCI}{k}      cache_dir: cache\n")),
        &[
            "config.yaml:9:18: policies[1].bundle_source.cache_dir: \"cache\" must be an absolute path",
        ],
    );
    check(
        &bundle(&format!("{OCI}{k}      fetch: now\n")),
        &[
            "config.yaml:9:7: policies[1].bundle_source.fetch: unknown key, expected one of: name, oci, https, s3, public_keys, name_prefix, poll_interval_seconds, cache_dir",
        ],
    );
}

#[test]
fn bundle_name_prefix_rules() {
    let k = keys(B64_KEY);
    // A reference to a bundle policy must carry the prefix.
    let refs_bundle = |prefix: &str, policy: &str| {
        bundle(&format!("{OCI}{k}{prefix}"))
            .replace("policy: orders-agent", &format!("policy: {policy}"))
    };
    check(
        &refs_bundle("      name_prefix: prod.\n", "prod.orders"),
        &[],
    );
    check(
        &refs_bundle("      name_prefix: prod.\n", "orders"),
        &[
            "config.yaml:15:17: server.auth.tokens[0].policy: policy \"orders\" is not loaded by this config (loaded: \"orders-agent\", \"prod.\"*)",
        ],
    );
    // Without a prefix, any name may come from the bundle: checked when fetched.
    check(&refs_bundle("", "orders"), &[]);
    check(
        &refs_bundle("      name_prefix: prod\n", "prod.orders"),
        &[
            "config.yaml:9:20: policies[1].bundle_source.name_prefix: invalid name_prefix \"prod\": lower-case letters, digits, '-' and '.', ending with '.' or '-' (for example \"prod.\"), at most 200 characters",
        ],
    );
    // The contract reserves nothing for a prefix: a file policy may start
    // with it, and a reference to it names the file policy.
    check(
        &refs_bundle("      name_prefix: orders-\n", "orders-agent"),
        &[],
    );
    // Two bundle sources: prefixes are optional and may overlap; the names
    // must differ.
    let two = |p1: &str, p2: &str, name2: &str, policy: &str| {
        BASE.replace(
            "  - file: policy-orders.yaml\n",
            &format!(
                "  - file: policy-orders.yaml\n  - bundle_source:\n      name: prod\n{OCI}{k}{p1}  - bundle_source:\n      name: {name2}\n{OCI}{k}{p2}"
            ),
        )
        .replace("policy: orders-agent", &format!("policy: {policy}"))
    };
    let (prod, stage, prod_eu) = (
        "      name_prefix: prod.\n",
        "      name_prefix: stage.\n",
        "      name_prefix: prod.eu.\n",
    );
    check(&two(prod, stage, "stage", "stage.orders"), &[]);
    check(&two(prod, prod_eu, "stage", "prod.eu.orders"), &[]);
    check(&two(prod, prod, "stage", "prod.orders"), &[]);
    check(&two("", "", "stage", "orders"), &[]);
    // One bundle without a prefix: any name may come from it.
    check(&two(prod, "", "stage", "orders"), &[]);
    // Every bundle has a prefix: a name that is no file policy needs one.
    check(
        &two(prod, stage, "stage", "orders"),
        &[
            "config.yaml:20:17: server.auth.tokens[0].policy: policy \"orders\" is not loaded by this config (loaded: \"orders-agent\", \"prod.\"*, \"stage.\"*)",
        ],
    );
    check(
        &two(prod, stage, "prod", "prod.orders"),
        &[
            "config.yaml:11:13: policies[2].bundle_source.name: bundle source name \"prod\" is already used by policies[1].bundle_source",
        ],
    );
}

/// The operator names a bundle source after its HaltSQLPolicy object: a
/// DNS-1123 subdomain of up to 253 characters.
#[test]
fn bundle_source_name_is_a_dns1123_subdomain() {
    let k = keys(B64_KEY);
    let named = |name: &str| {
        bundle(&format!("{OCI}{k}")).replace("      name: prod\n", &format!("      name: {name}\n"))
    };
    check(&named("orders.prod.v2"), &[]);
    let long = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(long.len(), 253);
    let f = Fixture::pod();
    let c = f.config(&named(&long));
    assert_eq!(c.bundle_sources[0].name, long);
    let too_long = format!("{long}d");
    check(
        &named(&too_long),
        &[&format!(
            "config.yaml:6:13: policies[1].bundle_source.name: invalid name \"{}...\": must be a lower-case DNS-1123 subdomain (at most 253 characters)",
            &too_long[..80]
        )],
    );
    for bad in ["Orders", "a..b", "-a", "a.", "a_b"] {
        check(
            &named(&format!("\"{bad}\"")),
            &[&format!(
                "config.yaml:6:13: policies[1].bundle_source.name: invalid name \"{bad}\": must be a lower-case DNS-1123 subdomain (at most 253 characters)"
            )],
        );
    }
}

#[test]
fn bundle_source_short_auth_forms() {
    let k = keys(B64_KEY);
    let f = Fixture::pod();
    let c = f.config(&bundle(&format!(
        "      https: {{url: https://p.corp/x, auth: {{token: abc}}}}\n{k}"
    )));
    match &c.bundle_sources[0].location {
        BundleLocation::Https {
            auth: SourceAuth::Token { token },
            ..
        } => assert_eq!(token.expose(), "abc"),
        other => panic!("{other:?}"),
    }
    let c = f.config(&bundle(&format!(
        "      oci: {{ref: ghcr.io/corp/p:prod, auth: {{username: u, password: p}}}}\n{k}"
    )));
    match &c.bundle_sources[0].location {
        BundleLocation::Oci {
            auth: SourceAuth::Basic { username, password },
            ..
        } => assert_eq!((username.as_str(), password.expose()), ("u", "p")),
        other => panic!("{other:?}"),
    }
    check(
        &bundle(&format!(
            "      https: {{url: https://p.corp/x, auth: {{api_key: abc}}}}\n{k}"
        )),
        &[
            "config.yaml:7:45: policies[1].bundle_source.https.auth.api_key: unknown key, expected one of: username, password, token, type",
        ],
    );
    check(
        &bundle(&format!(
            "      https: {{url: https://p.corp/x, auth: {{token: abc, username: u, password: p}}}}\n{k}"
        )),
        &[
            "config.yaml:7:44: policies[1].bundle_source.https.auth: exactly one of token, or username with password is required (or a type: none|basic|token)",
        ],
    );
    check(
        &bundle(&format!(
            "      https: {{url: https://p.corp/x, auth: {{username: u}}}}\n{k}"
        )),
        &[
            "config.yaml:7:44: policies[1].bundle_source.https.auth.password: required key is missing",
        ],
    );
    check(
        &bundle(&format!(
            "      https: {{url: https://p.corp/x, auth: {{}}}}\n{k}"
        )),
        &[
            "config.yaml:7:44: policies[1].bundle_source.https.auth: exactly one of token, or username with password is required (or a type: none|basic|token)",
        ],
    );
    check(
        &bundle(&format!(
            "      oci: {{ref: ghcr.io/corp/p:prod, plain_http: true, auth: {{token: t}}}}\n{k}"
        )),
        &[
            "config.yaml:7:63: policies[1].bundle_source.oci.auth: credentials would be sent in clear text with plain_http: true",
        ],
    );
}

// --- limits, logging, reload, reserved sections -------------------------------------

#[test]
fn limits_range() {
    check(&with("limits: {max_request_bytes: 1024}\n"), &[]);
    check(&with("limits: {max_request_bytes: 16777216}\n"), &[]);
    check(
        &with("limits: {max_request_bytes: 1023}\n"),
        &["config.yaml:12:29: limits.max_request_bytes: out of range, expected 1024 to 16777216"],
    );
    check(
        &with("limits: {max_request_bytes: 16777217}\n"),
        &["config.yaml:12:29: limits.max_request_bytes: out of range, expected 1024 to 16777216"],
    );
    check(
        &with("limits: {max_body: 1}\n"),
        &[
            "config.yaml:12:10: limits.max_body: unknown key, expected one of: max_request_bytes, header_read_timeout_seconds, idle_timeout_seconds, max_connections, max_requests_in_flight",
        ],
    );
}

#[test]
fn logging_reload_and_reserved() {
    check(
        &with("logging: {level: trace, format: text}\nreload: {watch: true}\n"),
        &[],
    );
    check(
        &with("logging: {level: verbose, format: xml}\n"),
        &[
            "config.yaml:12:18: logging.level: unknown value \"verbose\", expected one of: error, warn, info, debug, trace",
            "config.yaml:12:35: logging.format: unknown value \"xml\", expected one of: json, text",
        ],
    );
    check(
        &with("reload: {watch: 1}\n"),
        &["config.yaml:12:17: reload.watch: expected true or false, found an integer"],
    );
    check(
        &with("telemetry: {otlp: x}\nopa: {}\nsecrets: {}\n"),
        &["config.yaml:12:13: telemetry.otlp: unknown key, this mapping takes no keys"],
    );
    check(
        &with("metadata: {name: x}\n"),
        &[
            "config.yaml:12:1: metadata: unknown key, expected one of: apiVersion, kind, server, policies, default_policy, reload, limits, logging, telemetry, opa, secrets, audit",
        ],
    );
}

// --- audit sinks -------------------------------------------------------------------

fn sinks(list: &str) -> String {
    with(&format!("audit:\n  sinks:\n{list}"))
}

#[test]
fn audit_sinks_good() {
    let f = Fixture::pod();
    let c = f.config(&sinks(
        "  - {type: stdout}
  - {type: file, path: /var/log/audit.jsonl}
  - {type: s3, bucket: corp-audit, prefix: haltsql/, region: eu-west-1}
  - {type: gcs, bucket: corp_audit, credentials_file: /var/run/gcs/key.json}
  - {type: elasticsearch, url: https://es.corp:9200, index: haltsql-audit, auth: {type: basic, username: u, password: p}}
  - {type: kafka, brokers: [kafka-0.corp:9093, \"[::1]:9093\"], topic: haltsql.audit, sasl: {mechanism: scram-sha-512, username: u, password: p}}
",
    ));
    let types: Vec<&str> = c.audit.sinks.iter().map(|s| s.type_name()).collect();
    assert_eq!(
        types,
        ["stdout", "file", "s3", "gcs", "elasticsearch", "kafka"]
    );
    match &c.audit.sinks[5] {
        AuditSink::Kafka { tls, brokers, .. } => {
            assert_eq!(tls.as_ref(), Some(&KafkaTls::default()));
            assert_eq!(brokers.len(), 2);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn audit_sink_required_keys() {
    check(
        &sinks(
            "  - {type: file}\n  - {type: s3}\n  - {type: gcs}\n  - {type: elasticsearch}\n  - {type: kafka}\n",
        ),
        &[
            "config.yaml:14:5: audit.sinks[0].path: required key is missing",
            "config.yaml:15:5: audit.sinks[1].bucket: required key is missing",
            "config.yaml:16:5: audit.sinks[2].bucket: required key is missing",
            "config.yaml:17:5: audit.sinks[3].url: required key is missing",
            "config.yaml:17:5: audit.sinks[3]: exactly one of index or data_stream is required",
            "config.yaml:18:5: audit.sinks[4].brokers: required key is missing",
            "config.yaml:18:5: audit.sinks[4].topic: required key is missing",
        ],
    );
}

#[test]
fn audit_sink_rules() {
    check(
        &sinks("  - {type: syslog}\n"),
        &[
            "config.yaml:14:12: audit.sinks[0].type: unknown value \"syslog\", expected one of: stdout, file, s3, gcs, elasticsearch, kafka",
        ],
    );
    check(
        &sinks("  - {type: stdout, path: /x}\n"),
        &["config.yaml:14:20: audit.sinks[0].path: unknown key, expected one of: type"],
    );
    check(
        &sinks("  - {type: file, path: audit.log}\n"),
        &["config.yaml:14:24: audit.sinks[0].path: \"audit.log\" must be an absolute path"],
    );
    check(
        &with("audit:\n  sinks: []\n"),
        &[
            "config.yaml:13:10: audit.sinks: must list at least one sink (every decision is audited)",
        ],
    );
    check(
        &sinks("  - {type: stdout}\n  - {type: stdout}\n"),
        &["config.yaml:15:5: audit.sinks[1]: duplicate sink"],
    );
    check(
        &sinks(
            "  - {type: elasticsearch, url: http://es:9200, index: a, auth: {type: token, token: t}}\n",
        ),
        &[
            "config.yaml:14:64: audit.sinks[0].auth: credentials would be sent in clear text over http://; use an https:// URL",
        ],
    );
    check(
        &sinks(
            "  - {type: kafka, brokers: [kafka], topic: a, tls: false, sasl: {mechanism: plain, username: u, password: p}}\n",
        ),
        &[
            "config.yaml:14:29: audit.sinks[0].brokers[0]: invalid broker \"kafka\": expected HOST:PORT",
            "config.yaml:14:65: audit.sinks[0].sasl: SASL PLAIN without TLS would send the password in clear text",
        ],
    );
    check(
        &with("audit:\n  log_raw_sql: maybe\n"),
        &["config.yaml:13:16: audit.log_raw_sql: expected true or false, found a string"],
    );
}

// --- audit sinks as the operator guide writes them ----------------------------------

const CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUfake\n-----END CERTIFICATE-----\n";
const KEY_PEM: &str =
    "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIfake\n-----END PRIVATE KEY-----\n";

/// The guide's "Secrets" example after the operator's secretKeyRef
/// substitution, with the Secret keys mounted as in the pod. (Inside a flow
/// mapping `{ ... }` the placeholder must be quoted: YAML ends a plain
/// scalar at `{` and `}` there.)
#[test]
fn guide_secrets_example_sinks_load() {
    let f = Fixture::pod();
    f.write(
        "var/run/haltsql/secrets/es-credentials/api-key",
        "VnVhQ2ZHY0JDZGJrUW0tZTVhT3g6dWkybHAyYXhUTm1zeWFrdzl0dk5udw==\n",
    );
    f.write("var/run/haltsql/secrets/kafka-tls/ca.crt", CA_PEM);
    f.write(
        "var/run/haltsql/secrets/kafka-credentials/password",
        "s3cret\n",
    );
    let c = f.config(&with(
        "audit:
  sinks:
    - type: elasticsearch
      url: https://es.logging.svc:9200
      data_stream: logs-haltsql-prod
      auth:
        api_key: ${file:/var/run/haltsql/secrets/es-credentials/api-key}
    - type: kafka
      brokers: [kafka.logging.svc:9093]
      topic: haltsql.audit
      tls: { ca_file: \"${file:/var/run/haltsql/secrets/kafka-tls/ca.crt}\" }
      sasl:
        mechanism: scram-sha-512
        username: haltsql
        password: ${file:/var/run/haltsql/secrets/kafka-credentials/password}
",
    ));
    match &c.audit.sinks[0] {
        AuditSink::Elasticsearch { url, target, auth } => {
            assert_eq!(url, "https://es.logging.svc:9200");
            assert_eq!(target, &EsTarget::DataStream("logs-haltsql-prod".into()));
            assert!(
                matches!(auth, SourceAuth::ApiKey { api_key } if api_key.expose().starts_with("VnVh"))
            );
        }
        other => panic!("{other:?}"),
    }
    match &c.audit.sinks[1] {
        AuditSink::Kafka { tls, sasl, .. } => {
            let tls = tls.as_ref().unwrap();
            // The placeholder resolves to the PEM content (one trailing
            // newline removed).
            assert_eq!(
                tls.ca,
                Some(FileOrContent::Content(load::Secret::new(
                    CA_PEM.trim_end_matches('\n')
                )))
            );
            assert_eq!(tls.cert, None);
            let sasl = sasl.as_ref().unwrap();
            assert_eq!(sasl.mechanism, SaslMechanism::ScramSha512);
            assert_eq!(sasl.password.expose(), "s3cret");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn elasticsearch_sink_forms() {
    let f = Fixture::pod();
    let c = f.config(&sinks(
        "  - {type: elasticsearch, url: https://es:9200, index: haltsql-audit}
  - {type: elasticsearch, url: https://es:9200, data_stream: logs-haltsql-prod, auth: {api_key: k}}
  - {type: elasticsearch, url: https://es:9200, index: b, auth: {username: u, password: p}}
  - {type: elasticsearch, url: https://es:9200, index: c, auth: {type: api_key, api_key: k}}
  - {type: elasticsearch, url: https://es:9200, index: d, auth: {token: t}}
  - {type: elasticsearch, url: http://es:9200, index: e, auth: {type: none}}
",
    ));
    let auths: Vec<&SourceAuth> = c
        .audit
        .sinks
        .iter()
        .map(|s| match s {
            AuditSink::Elasticsearch { auth, .. } => auth,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(matches!(auths[0], SourceAuth::None));
    assert!(matches!(auths[1], SourceAuth::ApiKey { .. }));
    assert!(matches!(auths[2], SourceAuth::Basic { .. }));
    assert!(matches!(auths[3], SourceAuth::ApiKey { .. }));
    assert!(matches!(auths[4], SourceAuth::Token { .. }));
    assert!(matches!(auths[5], SourceAuth::None));

    check(
        &sinks("  - {type: elasticsearch, url: https://es:9200, index: a, data_stream: b}\n"),
        &["config.yaml:14:5: audit.sinks[0]: exactly one of index or data_stream is required"],
    );
    check(
        &sinks("  - {type: elasticsearch, url: https://es:9200, data_stream: Logs}\n"),
        &[
            "config.yaml:14:62: audit.sinks[0].data_stream: invalid data stream name \"Logs\": at most 255 lower-case letters, digits, '-', '_', '.', '+', not starting with '-', '_', '+' or '.'",
        ],
    );
    check(
        &sinks(
            "  - {type: elasticsearch, url: https://es:9200, index: a, auth: {api_key: k, username: u, password: p}}\n",
        ),
        &[
            "config.yaml:14:65: audit.sinks[0].auth: exactly one of api_key, token, or username with password is required (or a type: none|basic|token|api_key)",
        ],
    );
    check(
        &sinks("  - {type: elasticsearch, url: https://es:9200, index: a, auth: {apikey: k}}\n"),
        &[
            "config.yaml:14:66: audit.sinks[0].auth.apikey: unknown key, expected one of: api_key, username, password, token, type",
        ],
    );
    check(
        &sinks(
            "  - {type: elasticsearch, url: https://es:9200, index: a, auth: {type: api_key, token: k}}\n",
        ),
        &[
            "config.yaml:14:65: audit.sinks[0].auth.api_key: required key is missing",
            "config.yaml:14:81: audit.sinks[0].auth.token: unknown key, expected one of: type, api_key",
        ],
    );
    check(
        &sinks("  - {type: elasticsearch, url: http://es:9200, index: a, auth: {api_key: k}}\n"),
        &[
            "config.yaml:14:64: audit.sinks[0].auth: credentials would be sent in clear text over http://; use an https:// URL",
        ],
    );
}

#[test]
fn kafka_sink_tls_forms() {
    let f = Fixture::pod();
    f.write("var/run/haltsql/secrets/kafka-tls/ca.crt", CA_PEM);
    f.write("var/run/haltsql/secrets/kafka-tls/tls.crt", CA_PEM);
    f.write("var/run/haltsql/secrets/kafka-tls/tls.key", KEY_PEM);
    let kafka = |tls: &str| {
        sinks(&format!(
            "  - {{type: kafka, brokers: [k:9093], topic: a, tls: {tls}}}\n"
        ))
    };
    let tls_of = |c: &load::LoadedConfig| match &c.audit.sinks[0] {
        AuditSink::Kafka { tls, .. } => tls.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(tls_of(&f.config(&kafka("true"))), Some(KafkaTls::default()));
    assert_eq!(tls_of(&f.config(&kafka("false"))), None);
    assert_eq!(tls_of(&f.config(&kafka("{}"))), Some(KafkaTls::default()));
    // A path is a path (rooted like every absolute path).
    let t = tls_of(&f.config(&kafka("{ca_file: /etc/kafka/ca.crt}"))).unwrap();
    assert_eq!(
        t.ca,
        Some(FileOrContent::Path(f.dir.path().join("etc/kafka/ca.crt")))
    );
    // Placeholders resolve to content: PEM is accepted as such.
    let t = tls_of(&f.config(&kafka(
        "{ca_file: \"${file:/var/run/haltsql/secrets/kafka-tls/ca.crt}\", cert_file: \"${file:/var/run/haltsql/secrets/kafka-tls/tls.crt}\", key_file: \"${file:/var/run/haltsql/secrets/kafka-tls/tls.key}\"}",
    )))
    .unwrap();
    assert!(matches!(t.ca, Some(FileOrContent::Content(_))));
    assert!(matches!(t.cert, Some(FileOrContent::Content(_))));
    assert!(matches!(t.key, Some(FileOrContent::Content(_))));

    check(
        &kafka("\"true\""),
        &[
            "config.yaml:14:53: audit.sinks[0].tls: expected true, false or a mapping {ca_file, cert_file, key_file}, found a string",
        ],
    );
    check(
        &kafka("{insecure_skip_verify: true}"),
        &[
            "config.yaml:14:54: audit.sinks[0].tls.insecure_skip_verify: unknown key, expected one of: ca_file, cert_file, key_file",
        ],
    );
    check(
        &kafka("{ca_file: ca.crt}"),
        &[
            "config.yaml:14:63: audit.sinks[0].tls.ca_file: \"ca.crt\" is not an absolute path; expected an absolute path or PEM certificates (-----BEGIN CERTIFICATE-----)",
        ],
    );
    check(
        &kafka("{cert_file: /c.crt}"),
        &[
            "config.yaml:14:53: audit.sinks[0].tls.key_file: required with cert_file (a client certificate needs both)",
        ],
    );
    // Content of the wrong kind is reported without showing it.
    check_in(
        &f,
        &kafka("{ca_file: \"${file:/var/run/haltsql/secrets/kafka-tls/tls.key}\"}"),
        &[
            "config.yaml:14:63: audit.sinks[0].tls.ca_file: the content is not PEM certificates (-----BEGIN CERTIFICATE-----); expected an absolute path or PEM certificates (-----BEGIN CERTIFICATE-----)",
        ],
    );
    check_in(
        &f,
        &kafka(
            "{cert_file: /c.crt, key_file: \"${file:/var/run/haltsql/secrets/kafka-tls/ca.crt}\"}",
        ),
        &[
            "config.yaml:14:83: audit.sinks[0].tls.key_file: the content is not a PEM private key (-----BEGIN PRIVATE KEY-----); expected an absolute path or a PEM private key (-----BEGIN PRIVATE KEY-----)",
        ],
    );
    check_in(
        &f,
        &kafka("{ca_file: \"-----BEGIN CERTIFICATE-----\\nMIIB\\n\"}"),
        &[
            "config.yaml:14:63: audit.sinks[0].tls.ca_file: the content is not PEM certificates (-----BEGIN CERTIFICATE-----); expected an absolute path or PEM certificates (-----BEGIN CERTIFICATE-----)",
        ],
    );
    // SASL PLAIN needs TLS; SCRAM does not send the password.
    check(
        &sinks(
            "  - {type: kafka, brokers: [k:9093], topic: a, tls: false, sasl: {mechanism: scram-sha-256, username: u, password: p}}\n",
        ),
        &[],
    );
    check(
        &sinks(
            "  - {type: kafka, brokers: [k:9093], topic: a, tls: {}, sasl: {mechanism: plain, username: u, password: p}}\n",
        ),
        &[],
    );
    check(
        &sinks(
            "  - {type: kafka, brokers: [k:9093], topic: a, tls: false, sasl: {mechanism: plain, username: u, password: p}}\n",
        ),
        &[
            "config.yaml:14:66: audit.sinks[0].sasl: SASL PLAIN without TLS would send the password in clear text",
        ],
    );
    check(
        &sinks(
            "  - {type: kafka, brokers: [k:9093], topic: a, sasl: {mechanism: scram-sha-1, username: u}}\n",
        ),
        &[
            "config.yaml:14:54: audit.sinks[0].sasl.password: required key is missing",
            "config.yaml:14:66: audit.sinks[0].sasl.mechanism: unknown value \"scram-sha-1\", expected one of: plain, scram-sha-256, scram-sha-512",
        ],
    );
}

#[test]
fn s3_and_gcs_sink_forms() {
    let f = Fixture::pod();
    f.write(
        "var/run/haltsql/secrets/gcs-sa/key.json",
        "{\"type\": \"service_account\", \"project_id\": \"p\"}\n",
    );
    f.write("var/run/haltsql/secrets/aws/secret", "SK\n");
    let c = f.config(&sinks(
        "  - type: s3
    bucket: corp-audit
    prefix: haltsql/prod/
    region: eu-west-1
    endpoint: https://s3.eu-west-1.amazonaws.com
    credentials: {source: static, access_key_id: AKIA1, secret_access_key: \"${file:/var/run/haltsql/secrets/aws/secret}\"}
  - {type: s3, bucket: corp-audit-2, credentials: {source: web_identity}}
  - {type: gcs, bucket: corp-audit, prefix: haltsql/, credentials_file: /var/run/gcs/key.json}
  - {type: gcs, bucket: corp-audit-2, credentials_file: \"${file:/var/run/haltsql/secrets/gcs-sa/key.json}\"}
",
    ));
    match &c.audit.sinks[0] {
        AuditSink::S3 {
            prefix,
            credentials: S3Credentials::Static {
                secret_access_key, ..
            },
            ..
        } => {
            assert_eq!(prefix.as_deref(), Some("haltsql/prod/"));
            assert_eq!(secret_access_key.expose(), "SK");
        }
        other => panic!("{other:?}"),
    }
    match (&c.audit.sinks[2], &c.audit.sinks[3]) {
        (
            AuditSink::Gcs {
                credentials_file: Some(FileOrContent::Path(p)),
                ..
            },
            AuditSink::Gcs {
                credentials_file: Some(FileOrContent::Content(_)),
                ..
            },
        ) => assert_eq!(p, &f.dir.path().join("var/run/gcs/key.json")),
        other => panic!("{other:?}"),
    }
    check(
        &sinks("  - {type: s3, bucket: corp-audit, key: x, endpoint: minio:9000}\n"),
        &[
            "config.yaml:14:36: audit.sinks[0].key: unknown key, expected one of: type, bucket, prefix, region, endpoint, credentials",
            "config.yaml:14:54: audit.sinks[0].endpoint: invalid URL \"minio:9000\": expected a https:// or http:// URL",
        ],
    );
    check(
        &sinks("  - {type: gcs, bucket: corp-audit, credentials_file: \"{not json\"}\n"),
        &[
            "config.yaml:14:55: audit.sinks[0].credentials_file: the content is not the service account key JSON; expected an absolute path or the service account key JSON",
        ],
    );
    check(
        &sinks("  - {type: gcs, bucket: corp-audit, credentials_file: key.json}\n"),
        &[
            "config.yaml:14:55: audit.sinks[0].credentials_file: \"key.json\" is not an absolute path; expected an absolute path or the service account key JSON",
        ],
    );
}

#[test]
fn audit_delivery_defaults_and_ranges() {
    let f = Fixture::pod();
    let c = f.config(&sinks("  - {type: stdout}\n"));
    assert_eq!(c.audit.delivery, load::DeliveryConfig::default());
    assert_eq!(
        (
            c.audit.delivery.queue_events,
            c.audit.delivery.batch_events,
            c.audit.delivery.flush_interval_ms
        ),
        (10_000, 500, 1000)
    );
    let c = f.config(&with(
        "audit:\n  delivery: {queue_events: 50, batch_events: 10, flush_interval_ms: 200}\n",
    ));
    assert_eq!(
        c.audit.delivery,
        load::DeliveryConfig {
            queue_events: 50,
            batch_events: 10,
            flush_interval_ms: 200,
        }
    );
    check(
        &with(
            "audit:\n  delivery: {queue_events: 0, batch_events: 10001, flush_interval_ms: 5, batch: 1}\n",
        ),
        &[
            "config.yaml:13:28: audit.delivery.queue_events: out of range, expected 1 to 1000000",
            "config.yaml:13:45: audit.delivery.batch_events: out of range, expected 1 to 10000",
            "config.yaml:13:71: audit.delivery.flush_interval_ms: out of range, expected 10 to 60000",
            "config.yaml:13:74: audit.delivery.batch: unknown key, expected one of: queue_events, batch_events, flush_interval_ms",
        ],
    );
}
