//! The committed generated manifests (CRDs, RBAC roles, their Helm copies)
//! must equal what the code generates. Fails when someone edits an API type
//! or the RBAC list without running `make manifests`.

use std::path::PathBuf;

#[test]
fn committed_manifests_are_up_to_date() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = match haltsql_operator::manifests::generated_files() {
        Ok(files) => files,
        Err(err) => panic!("cannot generate manifests: {err}"),
    };
    assert!(!files.is_empty());
    let mut stale = Vec::new();
    for (rel, want) in &files {
        match std::fs::read_to_string(root.join(rel)) {
            Ok(have) if &have == want => {}
            Ok(_) => stale.push(format!("{} differs", rel.display())),
            Err(err) => stale.push(format!("{} cannot be read: {err}", rel.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "generated manifests are stale; run `make manifests` and commit the result:\n  {}",
        stale.join("\n  ")
    );
}

#[test]
fn crds_are_identical_in_crds_and_config() {
    for plural in ["haltsqlpolicies", "haltsqlservers"] {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let a = std::fs::read_to_string(root.join(format!("crds/{plural}.yaml")));
        let b = std::fs::read_to_string(
            root.join(format!("config/crd/bases/haltsql.dev_{plural}.yaml")),
        );
        match (a, b) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{plural}"),
            (a, b) => panic!("{plural}: {a:?} / {b:?}"),
        }
    }
}
