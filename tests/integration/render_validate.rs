//! Every rendered config, with its Secret files laid out as in a pod, is
//! accepted by the real `haltsql validate` (`HALTSQL_BIN`, else
//! `<target dir>/debug/haltsql`; build it with `cargo build -p haltsql`).

use crate::support::render::{
    Fixture, assert_valid_in_pod, haltsql_validate, load_fixture, load_fixture_str,
};
use haltsql_operator::render::validation_document;

#[test]
fn quickstart_config_validates() {
    assert_valid_in_pod(&load_fixture("quickstart"));
}

#[test]
fn every_field_config_validates() {
    assert_valid_in_pod(&load_fixture("every-field"));
}

/// The bundle validation documents pass as they are: no Secret files, no
/// root, an empty environment.
#[test]
fn bundle_validation_documents_validate() {
    let fixture = load_fixture("every-field");
    let mut checked = 0;
    for p in &fixture.policies {
        let name = p.metadata.name.as_deref().unwrap();
        let doc = validation_document(name, &p.spec).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(&doc.file_name);
        std::fs::write(&file, &doc.contents).unwrap();
        let (code, out) = haltsql_validate(None, &file);
        assert_eq!(code, 0, "{name}: {out}\n{}", doc.contents);
        checked += 1;
    }
    assert_eq!(checked, 5);
}

/// A server fixture around the quick-start policy with extra spec YAML.
fn server_with(extra_spec: &str) -> Fixture {
    let base =
        std::fs::read_to_string(crate::support::render::golden_dir().join("quickstart/input.yaml"))
            .unwrap();
    let text = format!("{base}{extra_spec}");
    load_fixture_str(&text)
}

/// Unauthenticated mode, defaults for everything else, no tokens: the
/// smallest config that serves.
#[test]
fn unauthenticated_without_tokens_validates() {
    let base =
        std::fs::read_to_string(crate::support::render::golden_dir().join("quickstart/input.yaml"))
            .unwrap();
    let policy_only = base.split("\n---\n").next().unwrap();
    let fixture = load_fixture_str(&format!(
        "{policy_only}\n---\n{}",
        r#"apiVersion: haltsql.dev/v1alpha1
kind: HaltSQLServer
metadata: {name: dev, namespace: agents}
spec:
  image: haltsql:dev
  policies: [{name: orders}]
  config: {defaultPolicy: orders-agent, allowUnauthenticated: true}
"#
    ));
    assert_valid_in_pod(&fixture);
}

/// TLS without client certificates: no CA file, the health listener on.
#[test]
fn tls_without_client_auth_validates() {
    let fixture = server_with(
        "  tls:\n    secretName: haltsql-tls\n  config:\n    admin: { listen: 127.0.0.1:9090 }\n",
    );
    assert_valid_in_pod(&fixture);
}

/// The audit sinks of the guide's "Secrets" section, verbatim. They must
/// load: the guide is the specification of what users write.
#[test]
fn guide_secrets_example_validates() {
    let fixture = server_with(
        r#"  audit:
    sinks:
      - type: elasticsearch
        url: https://es.logging.svc:9200
        data_stream: logs-haltsql-prod
        auth:
          api_key: { secretKeyRef: { name: es-credentials, key: api-key } }
      - type: kafka
        brokers: [kafka.logging.svc:9093]
        topic: haltsql.audit
        tls: { ca_file: { secretKeyRef: { name: kafka-tls, key: ca.crt } } }
        sasl:
          mechanism: scram-sha-512
          username: haltsql
          password: { secretKeyRef: { name: kafka-credentials, key: password } }
"#,
    );
    assert_valid_in_pod(&fixture);
}
