//! Spec problems are render errors with user-facing messages naming the
//! field (the reconciler reports them as `ConfigRendered=False`,
//! `InvalidConfig`).

use crate::support::render::load_fixture_str;
use haltsql_operator::render::RenderError;

const ORDERS: &str = r#"apiVersion: haltsql.dev/v1alpha1
kind: HaltSQLPolicy
metadata: {name: orders, namespace: ns}
spec:
  policy: |
    apiVersion: haltsql.dev/v1
    kind: Policy
    metadata: {name: orders-agent}
    tables: {app.orders: {columns: [id]}}
"#;

const ORDERS_COPY: &str = r#"apiVersion: haltsql.dev/v1alpha1
kind: HaltSQLPolicy
metadata: {name: orders-v2, namespace: ns}
spec:
  policy: |
    apiVersion: haltsql.dev/v1
    kind: Policy
    metadata: {name: orders-agent}
    tables: {app.orders: {columns: [id, status]}}
"#;

const KEY: &str = "MCowBQYDK2VwAyEAZfQXiZZYaabPaDq7gNR0nL9D+y2POCP/59HCnREfnn8=";

fn bundle(name: &str, prefix: Option<&str>) -> String {
    let prefix = prefix
        .map(|p| format!("    namePrefix: {p}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLPolicy\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  bundleSource:\n    https: {{url: https://example.com/{name}.tar}}\n    publicKeys: [\"{KEY}\"]\n{prefix}"
    )
}

/// Renders the policies plus a server named `hs` with `spec` (YAML, indented
/// two spaces, without `image`), referencing every policy.
fn render_err(policies: &[&str], spec: &str) -> String {
    let names: Vec<String> = policies
        .iter()
        .map(|p| {
            let v: serde_yaml::Value = serde_yaml::from_str(p).unwrap();
            format!("{{name: {}}}", v["metadata"]["name"].as_str().unwrap())
        })
        .collect();
    let server = format!(
        "apiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLServer\nmetadata: {{name: hs, namespace: ns, uid: u-1}}\nspec:\n  image: haltsql:dev\n  policies: [{}]\n{spec}",
        names.join(", ")
    );
    let mut docs: Vec<&str> = policies.to_vec();
    docs.push(&server);
    let fixture = load_fixture_str(&docs.join("\n---\n"));
    match fixture.render() {
        Ok(_) => panic!("rendered, expected an error:\n{}", docs.join("\n---\n")),
        Err(e) => e.to_string(),
    }
}

fn renders(policies: &[&str], spec: &str) {
    let names: Vec<String> = policies
        .iter()
        .map(|p| {
            let v: serde_yaml::Value = serde_yaml::from_str(p).unwrap();
            format!("{{name: {}}}", v["metadata"]["name"].as_str().unwrap())
        })
        .collect();
    let server = format!(
        "apiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLServer\nmetadata: {{name: hs, namespace: ns}}\nspec:\n  image: haltsql:dev\n  policies: [{}]\n{spec}",
        names.join(", ")
    );
    let mut docs: Vec<&str> = policies.to_vec();
    docs.push(&server);
    let fixture = load_fixture_str(&docs.join("\n---\n"));
    if let Err(e) = fixture.render() {
        panic!("{e}");
    }
}

const TOKEN_ORDERS: &str =
    "  auth:\n    tokens:\n      - {name: a, policy: orders, sha256SecretRef: {name: t, key: a}}\n";

#[test]
fn token_policy_not_defined() {
    assert_eq!(
        render_err(&[ORDERS], TOKEN_ORDERS),
        r#"spec.auth.tokens[0].policy: "orders" is not defined by any referenced HaltSQLPolicy (defined: orders-agent)"#
    );
}

#[test]
fn default_policy_not_defined() {
    assert_eq!(
        render_err(&[ORDERS], "  config: {defaultPolicy: nope}\n"),
        r#"spec.config.defaultPolicy: "nope" is not defined by any referenced HaltSQLPolicy (defined: orders-agent)"#
    );
}

#[test]
fn oidc_policy_not_defined() {
    assert_eq!(
        render_err(
            &[ORDERS],
            "  auth:\n    oidc:\n      - {issuer: https://id.example.com, audience: a, policy_claim: p}\n      - {issuer: https://id.example.com, audience: b, policy: billing}\n"
        ),
        r#"spec.auth.oidc[1].policy: "billing" is not defined by any referenced HaltSQLPolicy (defined: orders-agent)"#
    );
}

#[test]
fn mtls_policy_not_defined() {
    assert_eq!(
        render_err(
            &[ORDERS],
            "  tls: {secretName: tls, clientAuth: optional}\n  auth:\n    mtls:\n      identities:\n        - {subject: CN=x, policy: orders-agent}\n        - {uri: 'spiffe://x/y', policy: x}\n"
        ),
        r#"spec.auth.mtls.identities[1].policy: "x" is not defined by any referenced HaltSQLPolicy (defined: orders-agent)"#
    );
}

#[test]
fn bundle_prefixes_limit_references_when_every_bundle_has_one() {
    let prod = bundle("prod-bundle", Some("prod."));
    let web = bundle("web-bundle", Some("web-"));
    let spec = |policy: &str| {
        format!(
            "  auth:\n    tokens:\n      - {{name: a, policy: {policy}, sha256SecretRef: {{name: t, key: a}}}}\n"
        )
    };
    assert_eq!(
        render_err(&[ORDERS, &prod, &web], &spec("staging.reports")),
        r#"spec.auth.tokens[0].policy: "staging.reports" is not defined by any referenced HaltSQLPolicy (defined: orders-agent, prod.*, web-*)"#
    );
    // The bare prefix names no policy.
    assert_eq!(
        render_err(&[&prod], &spec("prod.")),
        r#"spec.auth.tokens[0].policy: "prod." is not defined by any referenced HaltSQLPolicy (defined: prod.*)"#
    );
    renders(&[ORDERS, &prod, &web], &spec("prod.reports"));
    renders(&[ORDERS, &prod, &web], &spec("web-dashboard"));
    renders(&[ORDERS, &prod, &web], &spec("orders-agent"));
}

#[test]
fn a_bundle_without_prefix_may_define_any_name() {
    let any = bundle("any-bundle", None);
    let prod = bundle("prod-bundle", Some("prod."));
    renders(
        &[ORDERS, &any, &prod],
        "  config: {defaultPolicy: whatever}\n",
    );
}

#[test]
fn no_policy_defined_at_all() {
    // Every referenced policy is a prefixed bundle; an unprefixed name has
    // nowhere to come from.
    let prod = bundle("prod-bundle", Some("prod."));
    assert_eq!(
        render_err(&[&prod], "  config: {defaultPolicy: orders-agent}\n"),
        r#"spec.config.defaultPolicy: "orders-agent" is not defined by any referenced HaltSQLPolicy (defined: prod.*)"#
    );
}

#[test]
fn two_policies_with_one_name() {
    assert_eq!(
        render_err(&[ORDERS, ORDERS_COPY], ""),
        r#"spec.policies: HaltSQLPolicy "orders" and HaltSQLPolicy "orders-v2" both define the policy "orders-agent""#
    );
}

#[test]
fn mtls_needs_client_auth() {
    let ids = "  auth:\n    mtls:\n      identities: [{subject: CN=x, policy: orders-agent}]\n";
    let expected = "spec.auth.mtls.identities: mTLS identities need spec.tls with clientAuth optional or required";
    assert_eq!(render_err(&[ORDERS], ids), expected);
    assert_eq!(
        render_err(&[ORDERS], &format!("{ids}  tls: {{secretName: tls}}\n")),
        expected
    );
    assert_eq!(
        render_err(
            &[ORDERS],
            &format!("{ids}  tls: {{secretName: tls, clientAuth: none}}\n")
        ),
        expected
    );
    renders(
        &[ORDERS],
        &format!("{ids}  tls: {{secretName: tls, clientAuth: required}}\n"),
    );
    // An empty list needs nothing.
    renders(&[ORDERS], "  auth: {mtls: {identities: []}}\n");
}

#[test]
fn unauthenticated_needs_default_policy() {
    assert_eq!(
        render_err(&[ORDERS], "  config: {allowUnauthenticated: true}\n"),
        "spec.config.allowUnauthenticated: true needs spec.config.defaultPolicy (the policy for requests without a token)"
    );
    renders(
        &[ORDERS],
        "  config: {allowUnauthenticated: true, defaultPolicy: orders-agent}\n",
    );
}

#[test]
fn config_map_over_900_kib() {
    // Four policies of 240 KiB each: each within the 256 KiB policy limit,
    // together over the ConfigMap limit.
    let filler = "x".repeat(240 * 1024);
    let policies: Vec<String> = (0..4)
        .map(|i| {
            format!(
                "apiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLPolicy\nmetadata: {{name: big-{i}, namespace: ns}}\nspec:\n  policy: |\n    apiVersion: haltsql.dev/v1\n    kind: Policy\n    metadata: {{name: big-{i}, description: {filler}}}\n    tables: {{t: {{columns: [id]}}}}\n"
            )
        })
        .collect();
    let refs: Vec<&str> = policies.iter().map(String::as_str).collect();
    let msg = render_err(&refs, "");
    assert!(
        msg.starts_with("the rendered ConfigMap hs-haltsql-config-"),
        "{msg}"
    );
    assert!(msg.contains(" holds 98"), "{msg}");
    assert!(
        msg.ends_with("bytes, over the limit of 921600 bytes (900 KiB); reference fewer or smaller inline policies, or use a bundleSource for large policy sets"),
        "{msg}"
    );
    // Three fit.
    renders(&refs[..3], "");
}

#[test]
fn malformed_secret_references() {
    assert_eq!(
        render_err(
            &[ORDERS],
            "  audit:\n    sinks:\n      - type: elasticsearch\n        url: https://es:9200\n        index: i\n        auth: {type: basic, username: u, password: {secretKeyRef: {name: es}}}\n"
        ),
        "spec.audit.sinks[0].auth.password.secretKeyRef: a Secret reference must be an object of exactly the form {secretKeyRef: {name: <secret>, key: <key>}} (string name and key, nothing else)"
    );
    assert_eq!(
        render_err(
            &[ORDERS],
            "  config:\n    opa: {token: {secretKeyRef: {name: opa, key: ../../etc/passwd}}}\n"
        ),
        r#"spec.config.opa.token.secretKeyRef: "../../etc/passwd" is not a valid Secret key (letters, digits, '-', '_' and '.', not starting with '..')"#
    );
    assert_eq!(
        render_err(
            &[ORDERS],
            "  auth:\n    tokens:\n      - {name: a, policy: orders-agent, sha256SecretRef: {name: Tokens, key: a}}\n"
        ),
        r#"spec.auth.tokens[0].sha256SecretRef: "Tokens" is not a valid Secret name (a lower-case DNS-1123 subdomain)"#
    );
    assert_eq!(
        render_err(&[ORDERS], "  tls: {secretName: My_TLS}\n"),
        r#"spec.tls.secretName: "My_TLS" is not a valid Secret name (a lower-case DNS-1123 subdomain)"#
    );
}

#[test]
fn bundle_credentials_reference_checked() {
    let oci = format!(
        "apiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLPolicy\nmetadata: {{name: reg, namespace: ns}}\nspec:\n  bundleSource:\n    oci: {{ref: 'ghcr.io/a/b:c', auth: {{type: basic, secretName: reg, passwordKey: 'p/w'}}}}\n    publicKeys: [\"{KEY}\"]\n"
    );
    assert_eq!(
        render_err(&[&oci], ""),
        r#"HaltSQLPolicy "reg" spec.bundleSource.oci.auth.passwordKey: "p/w" is not a valid Secret key (letters, digits, '-', '_' and '.', not starting with '..')"#
    );
}

#[test]
fn duplicate_tokens() {
    assert_eq!(
        render_err(
            &[ORDERS],
            "  auth:\n    tokens:\n      - {name: a, policy: orders-agent, sha256SecretRef: {name: t, key: a}}\n      - {name: a, policy: orders-agent, sha256SecretRef: {name: t, key: b}}\n"
        ),
        r#"spec.auth.tokens[1].name: "a" is already used by spec.auth.tokens[0]"#
    );
    assert_eq!(
        render_err(
            &[ORDERS],
            "  auth:\n    tokens:\n      - {name: a, policy: orders-agent, sha256SecretRef: {name: t, key: a}}\n      - {name: b, policy: orders-agent, sha256SecretRef: {name: t, key: a}}\n"
        ),
        "spec.auth.tokens[1].sha256SecretRef: the same Secret key as spec.auth.tokens[0] (a token hash must select exactly one policy)"
    );
}

#[test]
fn empty_audit_sinks() {
    assert_eq!(
        render_err(&[ORDERS], "  audit: {sinks: []}\n"),
        "spec.audit.sinks: must list at least one sink (every decision is audited); leave it unset for [{type: stdout}]"
    );
}

#[test]
fn both_pdb_budgets() {
    assert_eq!(
        render_err(
            &[ORDERS],
            "  podDisruptionBudget: {enabled: true, minAvailable: 1, maxUnavailable: 1}\n"
        ),
        "spec.podDisruptionBudget: set at most one of minAvailable and maxUnavailable"
    );
}

#[test]
fn server_name_must_fit_service_and_label() {
    let policy = load_fixture_str(&format!(
        "{ORDERS}\n---\napiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLServer\nmetadata: {{name: placeholder}}\nspec: {{image: i, policies: [{{name: orders}}]}}\n"
    ));
    for name in ["1st", &"a".repeat(64), "a.b"] {
        let mut f = load_fixture_str(&format!(
            "{ORDERS}\n---\napiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLServer\nmetadata: {{name: placeholder}}\nspec: {{image: i, policies: [{{name: orders}}]}}\n"
        ));
        f.server.metadata.name = Some(name.to_owned());
        assert_eq!(
            f.render().unwrap_err().to_string(),
            format!(
                "metadata.name: {name:?} must be a DNS-1035 label (at most 63 lower-case letters, digits and '-', starting with a letter): it names the Service and is the app.kubernetes.io/instance label"
            )
        );
    }
    let mut f = policy;
    f.server.metadata.name = None;
    assert_eq!(f.render().unwrap_err(), RenderError::MissingName);
    assert_eq!(
        RenderError::MissingName.to_string(),
        "metadata.name is not set"
    );
}

#[test]
fn malformed_policy_spec() {
    let neither = "apiVersion: haltsql.dev/v1alpha1\nkind: HaltSQLPolicy\nmetadata: {name: empty, namespace: ns}\nspec: {}\n";
    assert_eq!(
        render_err(&[neither], ""),
        r#"HaltSQLPolicy "empty": exactly one of spec.policy or spec.bundleSource must be set"#
    );
}
