//! Startup checks of the manager: they fail fast, with a clear message, and
//! need no cluster (the kubeconfig points nowhere).

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn operator(args: &[&str]) -> Output {
    Command::new(support::operator_bin())
        .args(args)
        .env_clear()
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("the operator binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_haltsql_binary_stops_the_start_with_a_message() {
    let started = Instant::now();
    let out = operator(&[
        "--haltsql-binary=/nonexistent/bin/haltsql",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = stderr(&out);
    assert!(
        err.contains("--haltsql-binary /nonexistent/bin/haltsql")
            && err.contains("missing")
            && err.contains("No such file"),
        "{err}"
    );
}

#[test]
fn the_default_haltsql_binary_is_checked_too() {
    // No flag: the guide's default path, which does not exist on this machine.
    if std::path::Path::new("/usr/local/bin/haltsql").exists() {
        panic!("/usr/local/bin/haltsql exists here; this test needs it absent");
    }
    let out = operator(&["--metrics-bind-address=0", "--health-probe-bind-address=0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--haltsql-binary /usr/local/bin/haltsql"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_haltsql_binary_that_is_not_executable_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("haltsql");
    std::fs::write(&file, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    // A plain file without the x bit, and a directory (which has it).
    for target in [file.as_path(), dir.path()] {
        let flag = format!("--haltsql-binary={}", target.display());
        let out = operator(&[
            &flag,
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr(&out).contains("not an executable file"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_taken_port_stops_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let bin = support::haltsql_bin();
    let out = operator(&[
        &format!("--haltsql-binary={}", bin.display()),
        &format!("--metrics-bind-address=127.0.0.1:{port}"),
        "--health-probe-bind-address=0",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("--metrics-bind-address 127.0.0.1:{port}")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_flag_values_are_usage_errors() {
    for args in [
        ["--watch-namespaces=a,,b"],
        ["--watch-namespaces=Not_A_Namespace"],
        ["--metrics-bind-address=8080"],
        ["--leader-elect=perhaps"],
    ] {
        let out = operator(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("invalid value"), "{}", stderr(&out));
    }
}

#[test]
fn help_documents_every_flag_with_its_default() {
    let out = operator(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--haltsql-binary <PATH>",
        "[default: /usr/local/bin/haltsql]",
        "--watch-namespaces <NS[,NS...]>",
        "--leader-elect",
        "--metrics-bind-address <ADDR>",
        "[default: :8080]",
        "--health-probe-bind-address <ADDR>",
        "[default: :8081]",
        "render",
        "KUBECONFIG",
        "RUST_LOG",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    let out = operator(&["render", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--filename <FILE>"));
}
