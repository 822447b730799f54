//! Golden files of the rendered objects for the guide's quick start and for
//! a server using every field. `UPDATE_GOLDEN=1` rewrites them.

use crate::support::render::{assert_golden, load_fixture};
use haltsql_operator::render::{
    CONFIG_CHECKSUM_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, Rendered, SPEC_HASH_ANNOTATION,
    spec_hash_of, validation_document,
};
use serde::Serialize;

fn yaml<T: Serialize>(obj: &T) -> String {
    serde_yaml::to_string(obj).expect("yaml")
}

/// All objects as one multi-document YAML file, in apply order.
fn objects(r: &Rendered) -> String {
    let mut docs = vec![yaml(&r.config_map), yaml(&r.deployment), yaml(&r.service)];
    if let Some(p) = &r.pod_disruption_budget {
        docs.push(yaml(p));
    }
    if let Some(n) = &r.network_policy {
        docs.push(yaml(n));
    }
    let mut out = format!("# checksum: {}\n# mountedSecretKeys:\n", r.checksum);
    for (s, k) in &r.mounted_secret_keys {
        out.push_str(&format!("#   {s}/{k}\n"));
    }
    out.push_str(&docs.join("---\n"));
    out
}

fn check_case(case: &str) -> Rendered {
    let fixture = load_fixture(case);
    let r = fixture.render().expect("render");
    let data = r.config_map.data.as_ref().expect("data");
    assert_golden(&format!("{case}/config.yaml"), &data["config.yaml"]);
    assert_golden(&format!("{case}/objects.yaml"), &objects(&r));
    // Bundle validation documents, as the policy controller hands them to
    // haltsql validate.
    for p in &fixture.policies {
        if p.spec.bundle_source.is_some() {
            let name = p.metadata.name.as_deref().expect("name");
            let doc = validation_document(name, &p.spec).expect("validation document");
            assert_eq!(doc.file_name, "config.yaml");
            assert_golden(&format!("{case}/validation-{name}.yaml"), &doc.contents);
        }
    }
    r
}

/// Properties every owned object has, whatever the golden file says.
fn check_metadata(r: &Rendered, server: &str, uid: &str) {
    let values = [
        serde_json::to_value(&r.config_map).unwrap(),
        serde_json::to_value(&r.deployment).unwrap(),
        serde_json::to_value(&r.service).unwrap(),
        serde_json::to_value(r.pod_disruption_budget.as_ref().unwrap()).unwrap(),
        serde_json::to_value(r.network_policy.as_ref().unwrap()).unwrap(),
    ];
    let hashes = [
        spec_hash_of(&r.config_map),
        spec_hash_of(&r.deployment),
        spec_hash_of(&r.service),
        spec_hash_of(r.pod_disruption_budget.as_ref().unwrap()),
        spec_hash_of(r.network_policy.as_ref().unwrap()),
    ];
    for (v, hash) in values.iter().zip(hashes) {
        assert!(v["apiVersion"].is_string() && v["kind"].is_string(), "{v}");
        let m = &v["metadata"];
        assert_eq!(m["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(m["labels"]["app.kubernetes.io/name"], "haltsql");
        assert_eq!(m["labels"]["app.kubernetes.io/instance"], server);
        let owner = &m["ownerReferences"][0];
        assert_eq!(owner["apiVersion"], "haltsql.dev/v1alpha1");
        assert_eq!(owner["kind"], "HaltSQLServer");
        assert_eq!(owner["name"], server);
        assert_eq!(owner["uid"], uid);
        assert_eq!(owner["controller"], true);
        assert_eq!(owner["blockOwnerDeletion"], true);
        // The annotation is the hash of the object without it.
        assert_eq!(m["annotations"][SPEC_HASH_ANNOTATION], hash.as_str());
        // Only fields the operator sets: no status, no server-owned metadata.
        assert!(v.get("status").is_none());
        assert!(m.get("resourceVersion").is_none() && m.get("uid").is_none());
    }
    let tmpl = &values[1]["spec"]["template"]["metadata"];
    assert_eq!(
        tmpl["annotations"][CONFIG_CHECKSUM_ANNOTATION],
        r.checksum.as_str()
    );
}

#[test]
fn quickstart() {
    let r = check_case("quickstart");
    check_metadata(&r, "haltsql", "6f1c2a9e-0b7d-4c3e-9a51-2d8e4f6a7b10");
    assert_eq!(
        r.mounted_secret_keys,
        vec![(
            "haltsql-tokens".to_owned(),
            "orders-agent.sha256".to_owned()
        )]
    );
}

#[test]
fn every_field() {
    let r = check_case("every-field");
    check_metadata(&r, "haltsql-prod", "0d5e8b3a-7c41-4f2e-b6a9-91c3d5e7f802");
    let tmpl = serde_json::to_value(&r.deployment).unwrap()["spec"]["template"].clone();
    // The operator's labels and checksum win over podLabels/podAnnotations.
    assert_eq!(
        tmpl["metadata"]["labels"]["app.kubernetes.io/instance"],
        "haltsql-prod"
    );
    assert_eq!(tmpl["metadata"]["labels"]["team"], "platform");
    assert_eq!(
        tmpl["metadata"]["annotations"][CONFIG_CHECKSUM_ANNOTATION],
        r.checksum.as_str()
    );
}
