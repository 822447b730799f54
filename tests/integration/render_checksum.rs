//! The config checksum follows the configuration (policies, spec fields that
//! reach config.yaml, mounted Secret keys) and nothing else; the content
//! hash and the spec hashes are stable.

use std::collections::BTreeMap;

use crate::support::render::{Fixture, load_fixture};
use haltsql_operator::api::{
    ClientAuth, HaltSQLPolicySpec, LogLevel, SecretKeyRef, ServerConfig, ServerTls,
};
use haltsql_operator::render::{content_hash, spec_hash_of, validation_document};
use sha2::{Digest, Sha256};

fn quickstart() -> Fixture {
    load_fixture("quickstart")
}

fn checksum(f: &Fixture) -> String {
    f.render().expect("render").checksum
}

#[test]
fn changes_with_the_policy_content() {
    let base = quickstart();
    let mut f = quickstart();
    let doc = f.policies[0].spec.policy.as_mut().unwrap();
    *doc = doc.replace("max: 100", "max: 50");
    assert_ne!(checksum(&base), checksum(&f));
}

#[test]
fn changes_with_config_fields() {
    let base = checksum(&quickstart());
    let mut f = quickstart();
    f.server.spec.config = Some(ServerConfig {
        log_level: Some(LogLevel::Debug),
        ..Default::default()
    });
    assert_ne!(base, checksum(&f));

    let mut f = quickstart();
    f.server.spec.config = Some(ServerConfig {
        default_policy: Some("orders-agent".to_owned()),
        ..Default::default()
    });
    assert_ne!(base, checksum(&f));

    let mut f = quickstart();
    f.server
        .spec
        .auth
        .as_mut()
        .unwrap()
        .tokens
        .as_mut()
        .unwrap()[0]
        .name = "other".to_owned();
    assert_ne!(base, checksum(&f));
}

#[test]
fn changes_with_the_mounted_keys() {
    let base = checksum(&quickstart());
    // Another key of the same Secret: config.yaml changes with it.
    let mut f = quickstart();
    f.server
        .spec
        .auth
        .as_mut()
        .unwrap()
        .tokens
        .as_mut()
        .unwrap()[0]
        .sha256_secret_ref = SecretKeyRef {
        name: "haltsql-tokens".to_owned(),
        key: "orders-agent.v2.sha256".to_owned(),
    };
    assert_ne!(base, checksum(&f));

    // The TLS Secret's name appears only in the mounted keys, not in
    // config.yaml (its paths are fixed): the checksum still follows it.
    let tls = |name: &str| {
        let mut f = quickstart();
        f.server.spec.tls = Some(ServerTls {
            secret_name: name.to_owned(),
            client_auth: Some(ClientAuth::None),
            min_version: None,
        });
        f
    };
    let a = tls("tls-a").render().unwrap();
    let b = tls("tls-b").render().unwrap();
    assert_eq!(
        a.config_map.data, b.config_map.data,
        "same files, only the Secret differs"
    );
    assert_ne!(a.checksum, b.checksum);
    assert!(
        a.mounted_secret_keys
            .contains(&("tls-a".to_owned(), "tls.key".to_owned()))
    );
}

#[test]
fn ignores_server_metadata_and_unrelated_spec() {
    let base = quickstart().render().unwrap();
    let mut f = quickstart();
    let m = &mut f.server.metadata;
    m.labels = Some(BTreeMap::from([("team".to_owned(), "x".to_owned())]));
    m.annotations = Some(BTreeMap::from([(
        "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
        "{}".to_owned(),
    )]));
    m.resource_version = Some("12345".to_owned());
    m.generation = Some(7);
    m.finalizers = Some(vec!["x".to_owned()]);
    f.server.status = Some(Default::default());
    let same = f.render().unwrap();
    assert_eq!(base, same, "every rendered object is identical");

    // Spec fields that do not reach config.yaml roll the pods through the
    // pod template, not through the checksum.
    let mut f = quickstart();
    f.server.spec.replicas = Some(5);
    f.server.spec.image = "ghcr.io/haltsql/haltsql:0.0.2".to_owned();
    let other = f.render().unwrap();
    assert_eq!(base.checksum, other.checksum);
    assert_eq!(base.config_map, other.config_map);
    assert_ne!(base.deployment, other.deployment);
}

#[test]
fn policy_order_does_not_matter() {
    let f = load_fixture("every-field");
    let base = f.render().unwrap();
    let mut g = load_fixture("every-field");
    g.policies.reverse();
    g.server.spec.policies.reverse();
    assert_eq!(base, g.render().unwrap());
}

#[test]
fn spec_hash_tracks_each_object() {
    let base = quickstart().render().unwrap();
    let mut f = quickstart();
    f.server.spec.replicas = Some(3);
    let r = f.render().unwrap();
    // Only the Deployment changed.
    assert_eq!(spec_hash_of(&base.config_map), spec_hash_of(&r.config_map));
    assert_eq!(spec_hash_of(&base.service), spec_hash_of(&r.service));
    assert_ne!(spec_hash_of(&base.deployment), spec_hash_of(&r.deployment));
}

#[test]
fn content_hash_of_inline_and_bundle() {
    let f = load_fixture("every-field");
    for p in &f.policies {
        let name = p.metadata.name.as_deref().unwrap();
        match &p.spec.policy {
            Some(doc) => {
                assert_eq!(
                    content_hash(&p.spec),
                    hex::encode(Sha256::digest(doc.as_bytes()))
                );
                let v = validation_document(name, &p.spec).unwrap();
                assert_eq!(
                    (v.file_name.as_str(), v.contents.as_str()),
                    ("policy.yaml", doc.as_str())
                );
            }
            None => {
                // The same bundle written with other key order and spacing
                // hashes the same; any value change does not.
                let json = serde_json::to_string(&p.spec).unwrap();
                let reparsed: HaltSQLPolicySpec = serde_yaml::from_str(&json).unwrap();
                assert_eq!(content_hash(&reparsed), content_hash(&p.spec));
                let mut changed = p.spec.clone();
                changed
                    .bundle_source
                    .as_mut()
                    .unwrap()
                    .poll_interval_seconds = Some(11);
                assert_ne!(content_hash(&changed), content_hash(&p.spec));
            }
        }
    }
    let a: HaltSQLPolicySpec = serde_json::from_str(
        r#"{"bundleSource": {"publicKeys": ["k"], "https": {"url": "https://x/b"}, "namePrefix": "p."}}"#,
    )
    .unwrap();
    let b: HaltSQLPolicySpec = serde_json::from_str(
        r#"{"bundleSource": {"namePrefix": "p.", "https": {"url": "https://x/b"}, "publicKeys": ["k"]}}"#,
    )
    .unwrap();
    assert_eq!(content_hash(&a), content_hash(&b));
    assert_eq!(
        content_hash(&a),
        hex::encode(Sha256::digest(
            br#"{"https":{"url":"https://x/b"},"namePrefix":"p.","publicKeys":["k"]}"#
        ))
    );
}
