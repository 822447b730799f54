//! `haltsql bundle keygen|build|sign|verify` and the archive rules, with
//! the real binary; hostile archives are made with the tar crate.

use std::path::Path;
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_haltsql");

const POLICY: &str = "apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders
search_path: [app]
tables:
  app.orders:
    columns: [id]
";

fn haltsql(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn write(path: &Path, content: impl AsRef<[u8]>) {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(path, content).unwrap();
}

fn setup(dir: &Path) {
    write(&dir.join("policies/orders.yaml"), POLICY);
    let o = haltsql(
        &[
            "bundle",
            "keygen",
            "--private-key",
            "k.key",
            "--public-key",
            "k.pub",
        ],
        dir,
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = haltsql(
        &[
            "bundle",
            "keygen",
            "--private-key",
            "o.key",
            "--public-key",
            "o.pub",
        ],
        dir,
    );
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn build_sign_verify_round_trip_and_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.join("k.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // keygen never overwrites a private key.
    let o = haltsql(
        &[
            "bundle",
            "keygen",
            "--private-key",
            "k.key",
            "--public-key",
            "x.pub",
        ],
        dir,
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let o = haltsql(
        &[
            "bundle",
            "build",
            "policies",
            "-o",
            "b.tar.gz",
            "--revision",
            "r1",
        ],
        dir,
    );
    assert!(o.status.success(), "{}", text(&o));
    let first = std::fs::read(dir.join("b.tar.gz")).unwrap();
    // Reproducible.
    let o = haltsql(
        &[
            "bundle",
            "build",
            "policies",
            "-o",
            "b.tar.gz",
            "--revision",
            "r1",
        ],
        dir,
    );
    assert!(o.status.success());
    assert_eq!(std::fs::read(dir.join("b.tar.gz")).unwrap(), first);

    let o = haltsql(&["bundle", "sign", "--key", "k.key", "b.tar.gz"], dir);
    assert!(o.status.success(), "{}", text(&o));
    let o = haltsql(
        &[
            "bundle",
            "verify",
            "--public-key",
            "k.pub",
            "--name-prefix",
            "prod.",
            "b.tar.gz",
        ],
        dir,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let digest = hex::encode(Sha256::digest(&first));
    assert!(
        text(&o).contains(&format!(
            "ok (sha256:{digest}, revision r1, policies: prod.orders)"
        )),
        "{}",
        text(&o)
    );

    // Another key.
    let o = haltsql(
        &["bundle", "verify", "--public-key", "o.pub", "b.tar.gz"],
        dir,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("not signed by any of the 1 trusted public keys"),
        "{}",
        text(&o)
    );
    // Either of two keys.
    let o = haltsql(
        &[
            "bundle",
            "verify",
            "--public-key",
            "o.pub",
            "--public-key",
            "k.pub",
            "b.tar.gz",
        ],
        dir,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // One byte changed.
    let mut t = first.clone();
    let last = t.len() - 1;
    t[last] ^= 0x55;
    write(&dir.join("t.tar.gz"), &t);
    std::fs::copy(dir.join("b.tar.gz.sig"), dir.join("t.tar.gz.sig")).unwrap();
    let o = haltsql(
        &["bundle", "verify", "--public-key", "k.pub", "t.tar.gz"],
        dir,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("the signature is for sha256:"),
        "{}",
        text(&o)
    );

    // A catalog file next to a policy travels in the bundle and is checked.
    write(
        &dir.join("withcat/app/orders.yaml"),
        format!("{POLICY}catalog: catalog/app.yaml\n"),
    );
    write(
        &dir.join("withcat/app/catalog/app.yaml"),
        "schemas:\n  app:\n    tables:\n      orders:\n        columns: [id, total]\n",
    );
    let o = haltsql(&["bundle", "build", "withcat", "-o", "c.tar.gz"], dir);
    assert!(o.status.success(), "{}", text(&o));
    let o = haltsql(&["bundle", "sign", "--key", "k.key", "c.tar.gz"], dir);
    assert!(o.status.success(), "{}", text(&o));
    let o = haltsql(
        &["bundle", "verify", "--public-key", "k.pub", "c.tar.gz"],
        dir,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // ... and a catalog without the policy's column is a located error.
    write(
        &dir.join("withcat/app/catalog/app.yaml"),
        "schemas:\n  app:\n    tables:\n      orders:\n        columns: [total]\n",
    );
    let o = haltsql(&["bundle", "build", "withcat", "-o", "c.tar.gz"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("withcat/app/orders.yaml:8:"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("not in the catalog"), "{}", text(&o));

    // A name that the prefix makes too long is found by verify.
    let o = haltsql(
        &[
            "bundle",
            "verify",
            "--public-key",
            "k.pub",
            "--name-prefix",
            &"p.".repeat(125),
            "b.tar.gz",
        ],
        dir,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("not a DNS-1123 subdomain"),
        "{}",
        text(&o)
    );
}

#[test]
fn build_reports_located_policy_errors_and_refuses_other_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(
        &dir.join("bad/p.yaml"),
        "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: p\ntables:\n  app.t:\n    colums: [id]\n",
    );
    let o = haltsql(&["bundle", "build", "bad", "-o", "x.tar.gz"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("bad/p.yaml:7:5:"), "{}", text(&o));
    assert!(!dir.join("x.tar.gz").exists());

    write(
        &dir.join("cat/p.yaml"),
        format!("{POLICY}catalog: other.yaml\n"),
    );
    let o = haltsql(&["bundle", "build", "cat", "-o", "x.tar.gz"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("cat/p.yaml:9:10: catalog: other.yaml is not in cat"),
        "{}",
        text(&o)
    );

    write(&dir.join("secret.yaml"), "schemas: {}\n");
    write(
        &dir.join("out/p.yaml"),
        format!("{POLICY}catalog: ../secret.yaml\n"),
    );
    let o = haltsql(&["bundle", "build", "out", "-o", "x.tar.gz"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("out/p.yaml:9:10: catalog: the path leaves the archive root"),
        "{}",
        text(&o)
    );

    write(
        &dir.join("cfg/c.yaml"),
        "apiVersion: haltsql.dev/v1\nkind: Config\npolicies: [{file: p.yaml}]\n",
    );
    write(&dir.join("cfg/p.yaml"), POLICY);
    let o = haltsql(&["bundle", "build", "cfg", "-o", "x.tar.gz"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("only kind: Policy documents"),
        "{}",
        text(&o)
    );

    write(&dir.join("txt/p.yaml"), POLICY);
    write(&dir.join("txt/README"), "x");
    let o = haltsql(&["bundle", "build", "txt", "-o", "x.tar.gz"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("only .yaml, .yml and .json"),
        "{}",
        text(&o)
    );

    write(&dir.join("dup/a.yaml"), POLICY);
    write(&dir.join("dup/b.yaml"), POLICY);
    let o = haltsql(&["bundle", "build", "dup", "-o", "x.tar.gz"], dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("policy orders is also defined in a.yaml"),
        "{}",
        text(&o)
    );
}

/// A gzip'd tar with raw entry names (the tar crate's `append_data` refuses
/// `..`, so the names are written into the header directly).
fn raw_archive(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (name, kind, data) in entries {
        let mut h = tar::Header::new_gnu();
        {
            let raw = h.as_old_mut();
            raw.name[..name.len()].copy_from_slice(name.as_bytes());
        }
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        if *kind == tar::EntryType::Symlink {
            h.set_link_name("/etc/passwd").unwrap();
        }
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn manifest_for(files: &[(&str, &[u8])]) -> Vec<u8> {
    let policies: Vec<_> = files
        .iter()
        .map(|(p, d)| serde_json::json!({"path": p, "sha256": hex::encode(Sha256::digest(d))}))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "haltsql.dev/v1", "kind": "BundleManifest", "format": 1, "policies": policies
    }))
    .unwrap()
}

#[test]
fn verify_refuses_hostile_archives_even_when_signed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let p = POLICY.as_bytes();
    let cat_policy = format!("{POLICY}catalog: ../../../../etc/passwd\n").into_bytes();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot",
            raw_archive(&[
                (
                    "manifest.json",
                    tar::EntryType::Regular,
                    &manifest_for(&[("../x.yaml", p)]),
                ),
                ("../x.yaml", tar::EntryType::Regular, p),
            ]),
            "leaves the archive root",
        ),
        (
            "absolute",
            raw_archive(&[
                (
                    "manifest.json",
                    tar::EntryType::Regular,
                    &manifest_for(&[("/x.yaml", p)]),
                ),
                ("/x.yaml", tar::EntryType::Regular, p),
            ]),
            "absolute paths",
        ),
        (
            "symlink",
            raw_archive(&[
                (
                    "manifest.json",
                    tar::EntryType::Regular,
                    &manifest_for(&[("x.yaml", p)]),
                ),
                ("x.yaml", tar::EntryType::Symlink, b""),
            ]),
            "only regular files",
        ),
        (
            "unlisted",
            raw_archive(&[
                (
                    "manifest.json",
                    tar::EntryType::Regular,
                    &manifest_for(&[("x.yaml", p)]),
                ),
                ("x.yaml", tar::EntryType::Regular, p),
                ("y.yaml", tar::EntryType::Regular, p),
            ]),
            "not listed in manifest.json",
        ),
        (
            "digest",
            raw_archive(&[
                (
                    "manifest.json",
                    tar::EntryType::Regular,
                    &manifest_for(&[("x.yaml", b"other")]),
                ),
                ("x.yaml", tar::EntryType::Regular, p),
            ]),
            "the sha256 of x.yaml does not match",
        ),
        (
            "catalogescape",
            raw_archive(&[
                (
                    "manifest.json",
                    tar::EntryType::Regular,
                    &manifest_for(&[("x.yaml", &cat_policy)]),
                ),
                ("x.yaml", tar::EntryType::Regular, &cat_policy),
            ]),
            "catalog: ../../../../etc/passwd is not a catalog of this bundle",
        ),
        (
            "nomanifest",
            raw_archive(&[("x.yaml", tar::EntryType::Regular, p)]),
            "manifest.json: missing",
        ),
        (
            // 40 MiB of zeros compress to a few kB: the unpacked cap stops it.
            "bomb",
            raw_archive(&[
                (
                    "manifest.json",
                    tar::EntryType::Regular,
                    &manifest_for(&[("x.yaml", p)]),
                ),
                ("x.yaml", tar::EntryType::Regular, &vec![0u8; 40 << 20]),
            ]),
            "larger than",
        ),
    ];
    for (name, data, expected) in cases {
        let file = format!("{name}.tar.gz");
        write(&dir.join(&file), &data);
        let o = haltsql(&["bundle", "sign", "--key", "k.key", &file], dir);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let o = haltsql(&["bundle", "verify", "--public-key", "k.pub", &file], dir);
        assert_eq!(o.status.code(), Some(1), "{name}: {}", text(&o));
        assert!(text(&o).contains(expected), "{name}: {}", text(&o));
    }
    // Over the archive size limit: refused before anything else.
    write(&dir.join("huge.tar.gz"), vec![0u8; (8 << 20) + 1]);
    write(&dir.join("huge.tar.gz.sig"), "{}");
    let o = haltsql(
        &["bundle", "verify", "--public-key", "k.pub", "huge.tar.gz"],
        dir,
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("larger than the limit"), "{}", text(&o));
}

#[test]
fn validate_allows_plain_http_only_for_loopback_registries() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    use base64::Engine as _;
    let raw = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32])
        .verifying_key()
        .to_bytes();
    let key = base64::engine::general_purpose::STANDARD.encode(raw);
    for (registry, ok) in [
        ("registry.corp.example:5000", false),
        ("10.1.2.3:5000", false),
        ("localhost:5000", true),
        ("127.0.0.1:5000", true),
        ("[::1]:5000", true),
    ] {
        let config = format!(
            "apiVersion: haltsql.dev/v1\nkind: Config\nserver: {{listen: 127.0.0.1:8080}}\npolicies:\n  - bundle_source:\n      name: b\n      oci: {{ref: \"{registry}/p:prod\", plain_http: true}}\n      public_keys: [\"{key}\"]\n"
        );
        write(&dir.join("c.yaml"), config);
        let o = haltsql(&["validate", "c.yaml"], dir);
        if ok {
            assert_eq!(o.status.code(), Some(0), "{registry}: {}", text(&o));
        } else {
            assert_eq!(o.status.code(), Some(1), "{registry}: {}", text(&o));
            let want = format!(
                "policies[0].bundle_source.oci.plain_http: plain_http is only allowed for loopback registries (localhost, 127.0.0.0/8, [::1]), not {registry}"
            );
            let got = text(&o);
            assert!(
                got.lines()
                    .any(|l| l.starts_with("c.yaml:7:") && l.ends_with(&want)),
                "{registry}: {got}"
            );
        }
    }
}

#[test]
fn serve_refuses_s3_web_identity_and_instance_credentials_for_bundles() {
    use base64::Engine as _;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let raw = ed25519_dalek::SigningKey::from_bytes(&[2u8; 32])
        .verifying_key()
        .to_bytes();
    let key = base64::engine::general_purpose::STANDARD.encode(raw);
    for source in ["web_identity", "instance"] {
        let config = format!(
            "apiVersion: haltsql.dev/v1\nkind: Config\nserver: {{listen: 127.0.0.1:0}}\npolicies:\n  - bundle_source:\n      name: b\n      s3: {{bucket: policies, key: b.tar.gz, credentials: {{source: {source}}}}}\n      public_keys: [\"{key}\"]\n"
        );
        write(&dir.join("c.yaml"), config);
        let o = haltsql(&["validate", "c.yaml"], dir);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = haltsql(&["serve", "--config", "c.yaml"], dir);
        assert_eq!(o.status.code(), Some(2), "{source}: {}", text(&o));
        assert!(
            text(&o).contains("bundle source b: S3 credentials source web_identity and instance")
                && text(&o).contains("not implemented"),
            "{source}: {}",
            text(&o)
        );
    }
}
