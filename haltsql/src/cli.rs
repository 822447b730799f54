//! The `validate` and `hash-token` subcommands (argument types and runners).
//!
//! `main.rs` only dispatches; each subcommand's arguments and behaviour live
//! here so that they can be tested and documented in one place.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use sha2::{Digest, Sha256};

use crate::load::{self, LoadOptions};

/// Output format of `validate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One located error per line: `FILE:LINE:COLUMN: KEY.PATH: message`.
    Text,
    /// `{"valid", "documents": [...], "errors": [...]}` on stdout.
    Json,
}

const VALIDATE_LONG: &str = "\
Load policy and config documents with the loader the server uses and report \
every problem found, not only the first.

Each FILE holds one YAML (or JSON) document: `kind: Policy` or `kind: Config` \
with `apiVersion: haltsql.dev/v1`. A Config loads the policy files it lists \
(relative to its own folder) and checks its bundle sources without fetching \
them. `${file:/absolute/path}` and `${env:NAME}` placeholders in a Config are \
resolved as the server would; a missing file or variable is an error. \
Placeholders are not allowed in Policy documents.

--sealed is for documents written by someone else (the operator runs every \
HaltSQLPolicy through it): only the FILEs given are opened, each a name in \
the current folder and never through a symbolic link; placeholders, \
`policies[].file` and `catalog: FILE` are reported as errors without \
anything being read.

Checked: unknown keys (everywhere), types, ranges, names, policy references \
(token, default_policy, OIDC, mTLS), duplicate policy names, token hashes (64 \
lower-case hex digits), TLS and mTLS settings, bundle sources (forms, auth, \
Ed25519 public keys, poll interval, name_prefix) and audit sinks.

Output (stdout):
  text  one error per line, `FILE:LINE:COLUMN: KEY.PATH: message` \
(the `KEY.PATH: ` part is left out for whole-file problems), or one \
`FILE: ok (KIND NAME)` line per document read when everything is valid.
  json  {\"valid\": bool, \"documents\": [{\"file\", \"kind\", \"name\", \"sha256\"}], \
\"errors\": [{\"file\", \"line\", \"column\", \"path\", \"message\"}]}, \
printed in every case, also with exit code 1 or 2.

Lines and columns are 1-based; 0:0 marks a file that could not be read at all.

Exit codes:
  0  every document is valid
  1  invalid: the documents were read and something is wrong in them
  2  could not check: usage error, a FILE that cannot be read (missing, \
permission denied, not a regular file), or an internal error

Limits for untrusted input: 4 MiB per file, nesting depth 64, 250000 nodes \
and 16 MiB of text per document (aliases count with their expansion), 1 MiB \
per placeholder file.";

/// Arguments of `haltsql validate`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Check policy and config documents and report every problem",
    long_about = VALIDATE_LONG,
    after_help = "Examples:\n  haltsql validate policy.yaml\n  haltsql validate --format json config.yaml\n  haltsql validate --root /tmp/pod config.yaml   # Secret files under /tmp/pod/var/run/...\n  haltsql validate --sealed --format json policy.yaml"
)]
pub struct ValidateArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Read absolute paths (`${file:/x}`, absolute policy files) under DIR,
    /// as `DIR/x`: checks a pod's file layout without being in the pod.
    #[arg(long, value_name = "DIR", conflicts_with = "sealed")]
    pub root: Option<PathBuf>,

    /// For documents from untrusted authors: open only the FILEs given
    /// (names in the current folder, no symbolic link followed), resolve
    /// no `${file:}`/`${env:}` placeholder and read no policy or catalog
    /// file a document names; each of those is reported as an error.
    #[arg(long)]
    pub sealed: bool,

    /// Policy or Config documents (YAML or JSON).
    #[arg(value_name = "FILE", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
}

/// Runs `validate`; returns the exit code.
pub fn validate(args: &ValidateArgs) -> i32 {
    if args.sealed
        && let Some(bad) = args.files.iter().find(|f| !is_plain_name(f))
    {
        eprintln!(
            "haltsql validate: --sealed reads only files of the current folder; {} is not a plain file name",
            load::errors::one_line_pub(&bad.to_string_lossy())
        );
        return 2;
    }
    let opts = LoadOptions {
        root: args.root.clone(),
        sealed: args.sealed,
        ..LoadOptions::default()
    };
    let report = load::load_files_with(&args.files, &opts);
    let mut out = std::io::stdout().lock();
    let written = match args.format {
        Format::Json => writeln!(out, "{}", report.to_json_string()),
        Format::Text => write_text(&mut out, &report),
    };
    if written.and_then(|()| out.flush()).is_err() {
        return 2;
    }
    report.exit_code()
}

/// One normal path component: no folder, no `..`, not absolute.
fn is_plain_name(path: &std::path::Path) -> bool {
    let mut parts = path.components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    )
}

fn write_text(out: &mut impl Write, report: &load::LoadReport) -> std::io::Result<()> {
    if report.errors.is_empty() && !report.could_not_check {
        for d in &report.documents {
            let kind = d.kind.as_deref().unwrap_or("document");
            match &d.name {
                Some(n) => writeln!(
                    out,
                    "{}: ok ({kind} {n})",
                    load::errors::one_line_pub(&d.file)
                )?,
                None => writeln!(out, "{}: ok ({kind})", load::errors::one_line_pub(&d.file))?,
            }
        }
        return Ok(());
    }
    for e in &report.errors {
        writeln!(out, "{e}")?;
    }
    Ok(())
}

const HASH_LONG: &str = "\
Read a bearer token on standard input and print its lower-case hex SHA-256, \
the value a Config's `server.auth.tokens[].sha256` takes.

One trailing newline (\\n or \\r\\n) is removed first, so `echo TOKEN | \
haltsql hash-token` hashes TOKEN. At most 64 KiB is read.

Exit codes: 0 printed; 2 empty or oversized input, or a read error.";

/// Largest token `hash-token` reads.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Arguments of `haltsql hash-token` (none).
#[derive(Debug, Clone, Args)]
#[command(about = "Print the SHA-256 of a token read on stdin", long_about = HASH_LONG)]
pub struct HashTokenArgs {}

/// The hex SHA-256 of a token, after removing one trailing newline.
pub fn hash_token_bytes(input: &[u8]) -> Option<String> {
    let token = input
        .strip_suffix(b"\r\n")
        .or_else(|| input.strip_suffix(b"\n"))
        .unwrap_or(input);
    if token.is_empty() {
        return None;
    }
    Some(hex::encode(Sha256::digest(token)))
}

/// Runs `hash-token`; returns the exit code.
pub fn hash_token(_args: &HashTokenArgs) -> i32 {
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin()
        .lock()
        .take(MAX_TOKEN_BYTES + 1)
        .read_to_end(&mut buf)
    {
        eprintln!("haltsql hash-token: cannot read stdin: {e}");
        return 2;
    }
    if buf.len() as u64 > MAX_TOKEN_BYTES {
        eprintln!("haltsql hash-token: the token is larger than {MAX_TOKEN_BYTES} bytes");
        return 2;
    }
    match hash_token_bytes(&buf) {
        None => {
            eprintln!("haltsql hash-token: empty token on stdin");
            2
        }
        Some(h) => {
            println!("{h}");
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_without_one_newline() {
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hash_token_bytes(b"abc").as_deref(), Some(abc));
        assert_eq!(hash_token_bytes(b"abc\n").as_deref(), Some(abc));
        assert_eq!(hash_token_bytes(b"abc\r\n").as_deref(), Some(abc));
        assert_ne!(hash_token_bytes(b"abc\n\n").as_deref(), Some(abc));
        assert_eq!(hash_token_bytes(b"\n"), None);
    }
}
