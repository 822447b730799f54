//! `haltsql bundle build|sign|verify|keygen`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use sha2::{Digest, Sha256};

use super::SIGNATURE_SUFFIX;
use super::archive::{self, MAX_BUNDLE_BYTES};
use super::sign::{self, MAX_SIGNATURE_BYTES};
use crate::load;

const BUNDLE_LONG: &str = "\
Make, sign and check signed policy bundles, the files a Config's \
`policies[].bundle_source` serves.

  haltsql bundle keygen --private-key bundle.key --public-key bundle.pub
  haltsql bundle build policies/ -o bundle.tar.gz
  haltsql bundle sign --key bundle.key bundle.tar.gz      # writes bundle.tar.gz.sig
  haltsql bundle verify --public-key bundle.pub bundle.tar.gz

Exit codes: 0 done; 1 the input is invalid (a policy, the archive, the \
signature); 2 a file cannot be read or written, or a usage error.";

/// Arguments of `haltsql bundle`.
#[derive(Debug, Clone, Args)]
#[command(about = "Build, sign and verify policy bundles", long_about = BUNDLE_LONG)]
pub struct BundleArgs {
    #[command(subcommand)]
    pub command: BundleCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum BundleCommand {
    /// Pack every .yaml/.yml/.json Policy under DIR into a bundle archive.
    Build(BuildArgs),
    /// Write a detached signature FILE.sig with a private key.
    Sign(SignArgs),
    /// Check a bundle's signature and every policy in it.
    Verify(VerifyArgs),
    /// Make a new Ed25519 key pair (PKCS#8 PEM private key, PEM public key).
    Keygen(KeygenArgs),
}

#[derive(Debug, Clone, Args)]
pub struct BuildArgs {
    /// The folder with the policy documents (read recursively).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// The archive to write.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// Free text recorded in the manifest (for example a commit id).
    #[arg(long)]
    pub revision: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct SignArgs {
    /// The private key (PKCS#8 PEM, from `bundle keygen`).
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
    /// Where to write the signature (default: FILE.sig).
    #[arg(short = 'o', long, value_name = "SIG")]
    pub output: Option<PathBuf>,
    /// The bundle archive.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// A trusted public key file (PEM or base64 of 32 bytes); repeatable.
    #[arg(long = "public-key", value_name = "KEY", required = true)]
    pub public_keys: Vec<PathBuf>,
    /// The signature file (default: FILE.sig).
    #[arg(long, value_name = "SIG")]
    pub signature: Option<PathBuf>,
    /// Check the names as the server will, with this name_prefix.
    #[arg(long, value_name = "PREFIX")]
    pub name_prefix: Option<String>,
    /// The bundle archive.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct KeygenArgs {
    /// Where to write the private key (created with mode 0600; never overwritten).
    #[arg(long, value_name = "FILE")]
    pub private_key: PathBuf,
    /// Where to write the public key.
    #[arg(long, value_name = "FILE")]
    pub public_key: PathBuf,
}

/// Runs `haltsql bundle ...`; returns the exit code.
pub fn run(args: &BundleArgs) -> i32 {
    match &args.command {
        BundleCommand::Build(a) => build(a),
        BundleCommand::Sign(a) => sign(a),
        BundleCommand::Verify(a) => verify(a),
        BundleCommand::Keygen(a) => keygen(a),
    }
}

fn fail(code: i32, msg: impl std::fmt::Display) -> i32 {
    eprintln!("{msg}");
    code
}

fn sig_path(file: &Path, given: Option<&PathBuf>) -> PathBuf {
    given.cloned().unwrap_or_else(|| {
        let mut s = file.as_os_str().to_os_string();
        s.push(SIGNATURE_SUFFIX);
        PathBuf::from(s)
    })
}

fn build(a: &BuildArgs) -> i32 {
    let bytes = match archive::build_dir(&a.dir, a.revision.clone()) {
        Ok(b) => b,
        Err(e @ archive::BundleError::Io { .. }) => return fail(2, e),
        Err(e) => return fail(1, e),
    };
    if let Err(e) = std::fs::write(&a.output, &bytes) {
        return fail(2, format!("{}: {e}", a.output.display()));
    }
    let digest = hex::encode(Sha256::digest(&bytes));
    println!(
        "{}: sha256:{digest} ({} bytes)",
        a.output.display(),
        bytes.len()
    );
    0
}

fn read_bundle(path: &Path) -> Result<Vec<u8>, String> {
    load::fs::read_capped(path, MAX_BUNDLE_BYTES).map_err(|e| format!("{}: {e}", path.display()))
}

fn sign(a: &SignArgs) -> i32 {
    let key = match sign::read_private(&a.key) {
        Ok(k) => k,
        Err(e) => return fail(2, e),
    };
    let bytes = match read_bundle(&a.file) {
        Ok(b) => b,
        Err(e) => return fail(2, e),
    };
    let sig = sign::sign_bytes(&bytes, &key);
    let out = sig_path(&a.file, a.output.as_ref());
    let mut text = match serde_json::to_vec_pretty(&sig) {
        Ok(t) => t,
        Err(e) => return fail(2, e),
    };
    text.push(b'\n');
    if let Err(e) = std::fs::write(&out, text) {
        return fail(2, format!("{}: {e}", out.display()));
    }
    println!("{}: signed {}", out.display(), sig.digest);
    0
}

fn verify(a: &VerifyArgs) -> i32 {
    let mut keys = Vec::new();
    for p in &a.public_keys {
        match sign::read_public(p) {
            Ok(k) => keys.push(k),
            Err(e) => return fail(2, e),
        }
    }
    let bytes = match read_bundle(&a.file) {
        Ok(b) => b,
        Err(e) => return fail(2, e),
    };
    let sp = sig_path(&a.file, a.signature.as_ref());
    let sig = match load::fs::read_capped(&sp, MAX_SIGNATURE_BYTES) {
        Ok(s) => s,
        Err(e) => return fail(2, format!("{}: {e}", sp.display())),
    };
    if let Err(e) = sign::verify_bytes(&bytes, &sig, &keys) {
        return fail(1, format!("{}: {e}", a.file.display()));
    }
    let label = a.file.display().to_string();
    match archive::open(&bytes, a.name_prefix.as_deref(), &label) {
        Ok(b) => {
            let names: Vec<&str> = b.policies.iter().map(|p| p.name.as_str()).collect();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "{label}: ok (sha256:{}, revision {}, policies: {})",
                b.digest,
                b.revision.as_deref().unwrap_or("-"),
                names.join(", ")
            );
            0
        }
        Err(e) => fail(1, format!("{label}: {e}")),
    }
}

fn keygen(a: &KeygenArgs) -> i32 {
    let key = match sign::generate() {
        Ok(k) => k,
        Err(e) => return fail(2, e),
    };
    let (private, public) = match (sign::private_pem(&key), sign::public_pem(&key)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return fail(2, e),
    };
    let written = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&a.private_key)
            .and_then(|mut f| f.write_all(private.as_bytes()).and_then(|()| f.sync_all()))
    };
    if let Err(e) = written {
        return fail(2, format!("{}: {e}", a.private_key.display()));
    }
    if let Err(e) = std::fs::write(&a.public_key, public.as_bytes()) {
        return fail(2, format!("{}: {e}", a.public_key.display()));
    }
    println!(
        "{}: private key (keep it secret)\n{}: public key (for public_keys)",
        a.private_key.display(),
        a.public_key.display()
    );
    0
}
