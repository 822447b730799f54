//! Docker is not available on the build machines, so the Dockerfiles are
//! checked statically: the operator image starts from the haltsql image given
//! by HALTSQL_IMAGE (default: built from ./haltsql), puts the binaries where
//! the manifests expect them and runs as 65532.

use crate::support;

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

/// The image archives of `make images` (hack/images.sh), in
/// `HALTSQL_IMAGES_DIR` (default `.cache/images`).
fn image_archive(name: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("HALTSQL_IMAGES_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| support::repo_root().join(".cache/images"));
    let path = dir.join(format!("{name}.tar"));
    assert!(
        path.exists(),
        "{} is missing: run `make images` first",
        path.display()
    );
    path
}

/// One member of a tar archive, read with the system's tar.
fn tar_member(archive: &std::path::Path, member: &str) -> Vec<u8> {
    let out = std::process::Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(member)
        .output()
        .expect("run tar");
    assert!(
        out.status.success(),
        "tar -xOf {} {member}",
        archive.display()
    );
    out.stdout
}

/// The image config and the paths in its layers, from a docker-save archive.
fn inspect_archive(archive: &std::path::Path) -> (serde_json::Value, Vec<String>) {
    let manifest: serde_json::Value =
        serde_json::from_slice(&tar_member(archive, "manifest.json")).expect("manifest.json");
    let config_name = manifest[0]["Config"].as_str().expect("Config");
    let config: serde_json::Value =
        serde_json::from_slice(&tar_member(archive, config_name)).expect("config");
    let mut paths = Vec::new();
    for layer in manifest[0]["Layers"].as_array().expect("Layers") {
        let layer = tar_member(archive, layer.as_str().expect("layer name"));
        let mut child = std::process::Command::new("tar")
            .arg("-tzf")
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run tar");
        let mut stdin = child.stdin.take().expect("stdin");
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            stdin.write_all(&layer).expect("write layer");
        });
        let out = child.wait_with_output().expect("tar -t");
        writer.join().expect("writer");
        assert!(out.status.success(), "tar -tz of a layer");
        paths.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| format!("/{}", l.trim_end_matches('/'))),
        );
    }
    (config, paths)
}

/// `["a", "b"]` of an exec-form instruction, as JSON.
fn exec_form(stage: &[String], keyword: &str) -> Option<serde_json::Value> {
    let prefix = format!("{keyword} ");
    stage
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix(&prefix))
        .map(|json| serde_json::from_str(json).expect("exec form"))
}

/// What the last stage of a Dockerfile says about the running image.
struct Expected {
    entrypoint: serde_json::Value,
    cmd: serde_json::Value,
    user: String,
    binaries: Vec<String>,
}

fn expected_from(dockerfile_stages: &[&[String]]) -> Expected {
    let last = dockerfile_stages[dockerfile_stages.len() - 1];
    let entrypoint = exec_form(last, "ENTRYPOINT").expect("ENTRYPOINT");
    // A stage that sets ENTRYPOINT resets the CMD it inherits.
    let cmd = exec_form(last, "CMD").unwrap_or(serde_json::Value::Null);
    let user = last
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix("USER "))
        .expect("USER")
        .to_owned();
    let binaries = dockerfile_stages
        .iter()
        .flat_map(|s| s.iter())
        .filter(|i| i.starts_with("COPY --from="))
        .filter_map(|i| i.split_whitespace().last())
        .map(str::to_owned)
        .collect();
    Expected {
        entrypoint,
        cmd,
        user,
        binaries,
    }
}

fn assert_archive_matches(archive: &str, expected: Expected) {
    let (config, paths) = inspect_archive(&image_archive(archive));
    let run = &config["config"];
    assert_eq!(
        run["Entrypoint"], expected.entrypoint,
        "{archive}: entrypoint"
    );
    let cmd = match &run["Cmd"] {
        serde_json::Value::Array(a) if a.is_empty() => serde_json::Value::Null,
        other => other.clone(),
    };
    assert_eq!(cmd, expected.cmd, "{archive}: cmd");
    assert_eq!(run["User"], expected.user.as_str(), "{archive}: user");
    for binary in &expected.binaries {
        assert!(
            paths.contains(binary),
            "{archive}: {binary} not in {paths:?}"
        );
    }
    // The user the image runs as exists, and /tmp is there for the writable mount.
    for path in ["/etc/passwd", "/tmp"] {
        assert!(paths.contains(&path.to_owned()), "{archive}: {path}");
    }
}

#[test]
fn haltsql_image_archive_agrees_with_its_dockerfile() {
    let stages = stages(&instructions(&read("haltsql/Dockerfile")));
    let last = [stages[stages.len() - 1].as_slice()];
    assert_archive_matches("haltsql", expected_from(&last));
}

#[test]
fn operator_image_archive_agrees_with_its_dockerfile() {
    let haltsql = stages(&instructions(&read("haltsql/Dockerfile")));
    let operator = stages(&instructions(&read("Dockerfile")));
    // The final stage builds on the haltsql image: its files are in it too.
    let layers = [
        haltsql[haltsql.len() - 1].as_slice(),
        operator[operator.len() - 1].as_slice(),
    ];
    assert_archive_matches("haltsql-operator", expected_from(&layers));
}
