//! `haltsql validate --sealed`: documents from untrusted authors make the
//! validator open nothing but the file it was given.
//!
//! A canary file sits next to the work folder, where any process of the
//! same user could read it. An inotify watch on it records every open (of
//! the inode, whatever name or link leads to it), so "the canary was never
//! opened" is observed, not inferred; each test also shows the watch does
//! fire when the same document is loaded without `--sealed`, and that the
//! sealed report is byte for byte the same whether the canary exists or not
//! (no oracle for its existence or content).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Records opens of one file through inotify (`IN_OPEN`).
struct OpenWatch {
    fd: libc::c_int,
}

impl OpenWatch {
    fn new(path: &Path) -> Self {
        // SAFETY: plain syscalls on a descriptor this struct owns.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        let wd =
            unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_OPEN | libc::IN_ACCESS) };
        assert!(
            wd >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        OpenWatch { fd }
    }

    /// Whether the file was opened or read since the last call.
    fn opened(&self) -> bool {
        let mut seen = false;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a buffer of the given length.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return seen;
            }
            seen = true;
        }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this struct owns, once.
        unsafe { libc::close(self.fd) };
    }
}

/// A work folder `work/` and a canary `canary.yaml` beside it.
struct Setup {
    _dir: tempfile::TempDir,
    work: PathBuf,
    canary: PathBuf,
}

const CANARY: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: canary
tables:
  app.secret:
    columns: [id]
";

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let canary = dir.path().join("canary.yaml");
        std::fs::write(&canary, CANARY).unwrap();
        Setup {
            _dir: dir,
            work,
            canary,
        }
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.work.join(name), text).unwrap();
    }

    fn validate(&self, sealed: bool, file: &str) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_haltsql"));
        c.env_clear()
            .env("CANARY", "s3cr3t-canary-value")
            .current_dir(&self.work)
            .arg("validate");
        if sealed {
            c.arg("--sealed");
        }
        c.args(["--format", "json", "--", file]).output().unwrap()
    }

    /// Runs `file` sealed and unsealed; asserts the canary is opened only
    /// without `--sealed` (when `unsealed_opens`), and that the sealed
    /// report does not depend on the canary. Returns the sealed output.
    fn check(&self, file: &str, unsealed_opens: bool) -> Output {
        let watch = OpenWatch::new(&self.canary);
        assert!(!watch.opened());
        let sealed = self.validate(true, file);
        assert!(
            !watch.opened(),
            "--sealed opened the canary for {file}: {}",
            String::from_utf8_lossy(&sealed.stdout)
        );
        if unsealed_opens {
            let open = self.validate(false, file);
            assert!(
                watch.opened(),
                "the watch saw no open without --sealed: {}",
                String::from_utf8_lossy(&open.stdout)
            );
        }
        std::fs::remove_file(&self.canary).unwrap();
        let without = self.validate(true, file);
        std::fs::write(&self.canary, CANARY).unwrap();
        assert_eq!(sealed.status.code(), without.status.code());
        assert_eq!(
            String::from_utf8_lossy(&sealed.stdout),
            String::from_utf8_lossy(&without.stdout),
            "the sealed report depends on the canary"
        );
        sealed
    }
}

fn report(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn messages(o: &Output) -> Vec<String> {
    report(o)["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}:{}:{}: {}: {}",
                e["file"].as_str().unwrap(),
                e["line"],
                e["column"],
                e["path"].as_str().unwrap(),
                e["message"].as_str().unwrap()
            )
        })
        .collect()
}

fn config_with_token_hash(hash: &str) -> String {
    format!(
        "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\n  auth:\n    tokens: [{{name: a, policy: p, sha256: '{hash}'}}]\npolicies: [{{file: policy.yaml}}]\n"
    )
}

const POLICY: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: p
tables:
  app.orders:
    columns: [id]
";

#[test]
fn file_placeholder_is_refused_unread() {
    let s = Setup::new();
    s.write("policy.yaml", POLICY);
    s.write(
        "config.yaml",
        &config_with_token_hash(&format!("${{file:{}}}", s.canary.display())),
    );
    let o = s.check("config.yaml", true);
    assert_eq!(o.status.code(), Some(1));
    let m = messages(&o);
    assert!(
        m.iter().any(|e| e.starts_with("config.yaml:6:")
            && e.contains(
                "server.auth.tokens[0].sha256: placeholders are not resolved in sealed mode"
            )),
        "{m:?}"
    );
    // The policy file the config names is refused too, and not read.
    assert!(
        m.iter().any(|e| e
            .contains("policies[0].file: policy file \"policy.yaml\" is not read in sealed mode")),
        "{m:?}"
    );
    let docs = report(&o)["documents"].as_array().unwrap().clone();
    assert_eq!(docs.len(), 1, "only the given file is read: {docs:?}");
}

#[test]
fn env_placeholder_is_refused_and_its_value_never_shown() {
    let s = Setup::new();
    s.write("config.yaml", &config_with_token_hash("${env:CANARY}"));
    let o = s.check("config.yaml", false);
    assert_eq!(o.status.code(), Some(1));
    let m = messages(&o);
    assert!(
        m.iter()
            .any(|e| e.contains("placeholders are not resolved in sealed mode")),
        "{m:?}"
    );
    // Unsealed, the variable is resolved (and fails the hash check);
    // sealed, the outcome is the same whether it is set or not.
    let unsealed = s.validate(false, "config.yaml");
    assert!(
        !messages(&unsealed)
            .iter()
            .any(|e| e.contains("sealed mode") && e.contains("sha256")),
        "{:?}",
        messages(&unsealed)
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_haltsql"));
    let unset = c
        .env_clear()
        .current_dir(&s.work)
        .args(["validate", "--sealed", "--format", "json", "config.yaml"])
        .output()
        .unwrap();
    assert_eq!(unset.stdout, o.stdout);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("s3cr3t"));
}

#[test]
fn policy_file_references_are_refused_unread() {
    let s = Setup::new();
    for (i, reference) in [s.canary.display().to_string(), "../canary.yaml".to_string()]
        .iter()
        .enumerate()
    {
        let name = format!("config{i}.yaml");
        s.write(
            &name,
            &format!(
                "apiVersion: haltsql.dev/v1\nkind: Config\nserver:\n  listen: 127.0.0.1:0\npolicies:\n  - file: {reference}\n"
            ),
        );
        let o = s.check(&name, true);
        assert_eq!(o.status.code(), Some(1));
        let m = messages(&o);
        assert_eq!(
            m,
            vec![format!(
                "{name}:6:11: policies[0].file: policy file {reference:?} is not read in sealed mode (validate --sealed opens no file a document names)"
            )]
        );
    }
}

#[test]
fn catalog_file_references_are_refused_unread() {
    let s = Setup::new();
    // The canary holds a Policy, not a catalog: unsealed, it is opened and
    // found invalid; sealed, it is not opened at all.
    for (i, reference) in [s.canary.display().to_string(), "../canary.yaml".to_string()]
        .iter()
        .enumerate()
    {
        let name = format!("policy{i}.yaml");
        s.write(&name, &format!("{POLICY}catalog: {reference}\n"));
        let o = s.check(&name, true);
        assert_eq!(o.status.code(), Some(1));
        assert_eq!(
            messages(&o),
            vec![format!(
                "{name}:8:10: catalog: catalog file {reference:?} is not read in sealed mode (validate --sealed opens no file a document names)"
            )]
        );
    }
}

#[test]
fn symbolic_links_are_not_followed() {
    let s = Setup::new();
    std::os::unix::fs::symlink(&s.canary, s.work.join("policy.yaml")).unwrap();
    let o = s.check("policy.yaml", true);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        messages(&o),
        vec![
            "policy.yaml:0:0: : is a symbolic link, which sealed mode does not follow".to_string()
        ]
    );
    assert_eq!(report(&o)["documents"], serde_json::json!([]));
}

#[test]
fn only_names_in_the_current_folder_are_accepted() {
    let s = Setup::new();
    let watch = OpenWatch::new(&s.canary);
    for file in [
        "../canary.yaml".to_string(),
        s.canary.display().to_string(),
        "./policy.yaml".to_string(),
    ] {
        let o = s.validate(true, &file);
        assert_eq!(o.status.code(), Some(2), "{file}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("is not a plain file name"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert!(!watch.opened());
}

#[test]
fn a_plain_policy_still_validates_sealed() {
    let s = Setup::new();
    s.write("policy.yaml", POLICY);
    let o = s.validate(true, "policy.yaml");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(report(&o)["documents"][0]["name"], "p");
}
