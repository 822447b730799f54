//! Docker is not available on the build machines, so the Dockerfiles are
//! checked statically: the operator image starts from the haltsql image given
//! by HALTSQL_IMAGE (default: built from ./haltsql), puts the binaries where
//! the manifests expect them and runs as 65532.

mod support;

fn read(rel: &str) -> String {
    let path = support::repo_root().join(rel);
    match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) => panic!("{}: {err}", path.display()),
    }
}

/// Instructions without comments and line continuations.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        if let Some(part) = trimmed.strip_suffix('\\') {
            current.push_str(part);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

fn stages(instrs: &[String]) -> Vec<Vec<String>> {
    let mut stages: Vec<Vec<String>> = Vec::new();
    for instr in instrs {
        if instr.starts_with("FROM ") {
            stages.push(Vec::new());
        }
        if let Some(stage) = stages.last_mut() {
            stage.push(instr.clone());
        }
    }
    stages
}

#[test]
fn operator_image_builds_on_the_haltsql_image() {
    let instrs = instructions(&read("Dockerfile"));
    assert!(instrs.contains(&"ARG HALTSQL_IMAGE=haltsql-from-source".to_owned()));
    let stages = stages(&instrs);
    assert!(stages.len() >= 3, "multi-stage: {stages:?}");
    // The default names a stage built from this repository's haltsql crate.
    let from_source = stages
        .iter()
        .find(|s| s[0].ends_with(" AS haltsql-from-source"));
    let Some(from_source) = from_source else {
        panic!("no haltsql-from-source stage")
    };
    assert!(
        from_source
            .iter()
            .any(|i| i.contains("/out/haltsql /usr/local/bin/haltsql"))
    );
    let last = &stages[stages.len() - 1];
    assert_eq!(last[0], "FROM ${HALTSQL_IMAGE}");
    assert!(
        last.iter()
            .any(|i| i.starts_with("COPY --from=build-operator")
                && i.ends_with(" /usr/local/bin/haltsql-operator"))
    );
    assert!(last.contains(&"USER 65532:65532".to_owned()));
    assert!(last.contains(&r#"ENTRYPOINT ["/usr/local/bin/haltsql-operator"]"#.to_owned()));
    assert!(
        instrs
            .iter()
            .any(|i| i.contains("cargo build --locked --release -p haltsql-operator"))
    );
}

#[test]
fn haltsql_image_runs_as_nonroot() {
    let stages = stages(&instructions(&read("haltsql/Dockerfile")));
    assert!(stages.len() >= 2);
    let last = &stages[stages.len() - 1];
    assert!(last.contains(&"USER 65532:65532".to_owned()));
    assert!(last.contains(&r#"ENTRYPOINT ["/usr/local/bin/haltsql"]"#.to_owned()));
    assert!(last.iter().any(|i| i.ends_with(" /usr/local/bin/haltsql")));
}

#[test]
fn manifests_use_the_image_paths() {
    for rel in [
        "config/manager/manager.yaml",
        "charts/haltsql-operator/templates/deployment.yaml",
    ] {
        let text = read(rel);
        assert!(text.contains("- /usr/local/bin/haltsql-operator"), "{rel}");
        assert!(text.contains("--haltsql-binary="), "{rel}");
    }
    assert!(
        read("config/manager/manager.yaml").contains("--haltsql-binary=/usr/local/bin/haltsql\n")
    );
    assert!(
        read("charts/haltsql-operator/values.yaml")
            .contains("haltsqlBinary: /usr/local/bin/haltsql\n")
    );
}

#[test]
fn build_context_excludes_local_state() {
    let ignore = read(".dockerignore");
    for entry in ["target/", "bin/", ".cluster/", ".git/"] {
        assert!(ignore.lines().any(|l| l.trim() == entry), "{entry}");
    }
}
