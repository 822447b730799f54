//! The document loader shared by `haltsql validate` and `haltsql serve`.
//!
//! Entry points:
//! - [`load_files`] / [`load_files_with`]: what `validate` runs; loads each
//!   file (a Policy or a Config, which loads the policy files it names) and
//!   returns a [`LoadReport`] with every document read and every problem found.
//! - [`load_config`] / [`load_config_with`]: what `serve` and `check` run;
//!   a fully resolved [`LoadedConfig`] or every located error.
//! - [`load_policy`]: one Policy file.
//!
//! Every error is a [`LocatedError`] (file, line, column, key path, message).
//! Input is untrusted: files are capped at [`MAX_DOCUMENT_BYTES`], the YAML
//! tree at [`tree::Limits`] (depth, nodes, alias expansion), and no input
//! makes the loader panic (the CLI still catches a panic and reports it as an
//! internal error, exit 2).

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

pub mod config;
pub mod errors;
pub mod fields;
pub mod fs;
pub mod json;
pub mod names;
pub mod placeholders;
pub mod policy;
pub mod tree;
mod walk;
pub mod yaml;

pub use config::{
    AdminConfig, AuditConfig, AuditSink, AuthConfig, BundleLocation, BundleSource, ClientAuth,
    DeliveryConfig, EsTarget, KafkaSasl, KafkaTls, LimitsConfig, LoadedConfig, LogFormat, LogLevel,
    LoggingConfig, MtlsIdentity, MtlsMatch, OidcPolicy, OidcProvider, ReloadConfig, S3Credentials,
    SaslMechanism, ServerConfig, SourceAuth, TlsConfig, TlsVersion, TokenConfig,
    parse_ed25519_public_key,
};
pub use errors::{LocatedError, ReadError};
pub use fields::{FileOrContent, Secret};
pub use placeholders::EnvSource;
pub use policy::{
    Catalog, CatalogColumn, CatalogSchema, CatalogTable, Dialect, LoadedPolicy, StatementKind,
    TableName, TableRule,
};

use placeholders::Resolver;
use tree::Node;
use walk::{Doc, Placeholders, Str};

/// The only `apiVersion` understood.
pub const API_VERSION: &str = "haltsql.dev/v1";

/// Largest document file (4 MiB).
pub const MAX_DOCUMENT_BYTES: u64 = 4 * 1024 * 1024;

/// Most errors reported in one run; the rest are counted in a last error.
pub const MAX_ERRORS: usize = 1000;

/// How to load.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Read every absolute path the documents name (`${file:/x}`, absolute
    /// policy and catalog files) as `ROOT/x`, and root the absolute paths in
    /// the [`LoadedConfig`] the same way. For checking a pod's file layout
    /// offline; `None` (the server's case) reads paths as written.
    pub root: Option<PathBuf>,
    /// Where `${env:NAME}` is looked up (default: the process environment).
    pub env: EnvSource,
    /// YAML limits (defaults: depth 64, 250 000 nodes, 16 MiB of text).
    pub limits: tree::Limits,
    /// Sealed mode, for documents from untrusted authors: only the files
    /// named by the caller are opened, each without following a symbolic
    /// link; placeholders are errors (no file, no variable is read) and so
    /// are references to policy and catalog files.
    pub sealed: bool,
}

/// One document that was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DocumentInfo {
    /// The file as named.
    pub file: String,
    /// `Policy`, `Config` or `Catalog` (a catalog snapshot a policy names);
    /// `None` when the file could not be parsed far enough to tell.
    pub kind: Option<String>,
    /// The policy's `metadata.name` (as written, even if invalid); `None`
    /// for other kinds.
    pub name: Option<String>,
    /// Lower-case hex SHA-256 of the file's bytes.
    pub sha256: String,
}

/// What [`load_files`] found.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Every document read, including the policy and catalog files that
    /// configs and policies name, in the order read.
    pub documents: Vec<DocumentInfo>,
    /// Every problem, grouped by file (in reading order), then by position.
    pub errors: Vec<LocatedError>,
    /// A file named on the command line could not be read (missing,
    /// permission denied, not a regular file), or the loader failed
    /// internally: the documents could not be checked (exit 2).
    pub could_not_check: bool,
    /// The valid configs among the files named.
    pub configs: Vec<LoadedConfig>,
    /// The valid policies among the files named (not those loaded through
    /// a config: see [`LoadedConfig::policies`]).
    pub policies: Vec<LoadedPolicy>,
}

impl LoadReport {
    /// No errors and everything could be checked.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty() && !self.could_not_check
    }

    /// The contract's exit code: 0 valid, 1 invalid, 2 could not check.
    pub fn exit_code(&self) -> i32 {
        if self.could_not_check {
            2
        } else if self.errors.is_empty() {
            0
        } else {
            1
        }
    }

    /// The contract's JSON: `{"valid", "documents": [{"file", "kind",
    /// "name", "sha256"}], "errors": [{"file", "line", "column", "path",
    /// "message"}]}`, keys in that order.
    pub fn to_json_string(&self) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            valid: bool,
            documents: &'a [DocumentInfo],
            errors: &'a [LocatedError],
        }
        let out = Out {
            valid: self.is_valid(),
            documents: &self.documents,
            errors: &self.errors,
        };
        serde_json::to_string(&out).unwrap_or_else(|_| {
            r#"{"valid":false,"documents":[],"errors":[{"file":"","line":0,"column":0,"path":"","message":"internal error: cannot serialize the report"}]}"#.to_string()
        })
    }

    /// The same as [`to_json_string`](Self::to_json_string), as a value.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "valid": self.is_valid(),
            "documents": self.documents,
            "errors": self.errors,
        })
    }
}

/// State shared while loading one set of files.
pub(crate) struct Session<'o> {
    pub opts: &'o LoadOptions,
    resolver: Resolver,
    pub documents: Vec<DocumentInfo>,
    pub errors: Vec<LocatedError>,
    pub could_not_check: bool,
}

// One per file loaded, moved out at once: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Top {
    Nothing,
    Policy(Option<LoadedPolicy>),
    Config(Option<LoadedConfig>),
}

/// Strips a UTF-8 BOM and checks the text: valid UTF-8 and no control
/// characters YAML forbids. Errors carry a 1-based line and column.
fn decode(bytes: &[u8]) -> Result<&str, (usize, usize, String)> {
    if bytes.starts_with(&[0xFE, 0xFF]) || bytes.starts_with(&[0xFF, 0xFE]) {
        return Err((
            1,
            1,
            "UTF-16 is not supported; save the file as UTF-8".to_string(),
        ));
    }
    let body = bytes.strip_prefix(&[0xEF, 0xBB, 0xBF]).unwrap_or(bytes);
    let offset = bytes.len() - body.len();
    let text = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(e) => {
            let at = offset + e.valid_up_to();
            let (line, column) = fs::line_col(bytes, at);
            let byte = bytes.get(at).copied().unwrap_or(0);
            return Err((
                line,
                column,
                format!("not valid UTF-8 (byte 0x{byte:02x}); documents must be UTF-8 text"),
            ));
        }
    };
    if let Some((i, c)) = text.char_indices().find(|(_, c)| forbidden_char(*c)) {
        let (line, column) = fs::line_col(bytes, offset + i);
        return Err((
            line,
            column,
            format!(
                "control character U+{:04X} is not allowed in YAML",
                c as u32
            ),
        ));
    }
    Ok(text)
}

fn forbidden_char(c: char) -> bool {
    let u = c as u32;
    (u < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
        || u == 0x7F
        || ((0x80..=0x9F).contains(&u) && u != 0x85)
        || u == 0xFFFE
        || u == 0xFFFF
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn display(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

impl<'o> Session<'o> {
    fn new(opts: &'o LoadOptions) -> Self {
        Session {
            opts,
            resolver: Resolver {
                root: opts.root.clone(),
                env: opts.env.clone(),
                read: Default::default(),
            },
            documents: Vec::new(),
            errors: Vec::new(),
            could_not_check: false,
        }
    }

    /// Every file read so far: the documents (config, policies, catalogs)
    /// and the files placeholders read, without repeats.
    pub(crate) fn input_files(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        let placeholders = self
            .resolver
            .read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for p in self
            .documents
            .iter()
            .map(|d| PathBuf::from(&d.file))
            .chain(placeholders)
        {
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out
    }

    /// Records the document and parses its bytes into a tree (errors go to
    /// the session). Returns the tree, if any, and the document's index.
    fn ingest(&mut self, name: &str, bytes: &[u8]) -> (Option<Node>, usize) {
        self.documents.push(DocumentInfo {
            file: name.to_string(),
            kind: None,
            name: None,
            sha256: sha256_hex(bytes),
        });
        let idx = self.documents.len() - 1;
        let text = match decode(bytes) {
            Ok(t) => t,
            Err((line, column, message)) => {
                self.errors
                    .push(LocatedError::new(name, line, column, "", message));
                return (None, idx);
            }
        };
        let (root, errs) = yaml::parse(text, self.opts.limits);
        for e in errs {
            self.errors
                .push(LocatedError::new(name, e.line, e.column, "", e.message));
        }
        (root, idx)
    }

    /// Reads a file a document refers to. Problems reading it are reported
    /// at the reference `s`.
    pub(crate) fn read_referenced(
        &mut self,
        doc: &mut Doc<'_>,
        s: &Str,
        path: &Path,
        what: &str,
    ) -> Option<(Node, usize)> {
        if self.opts.sealed {
            doc.error_str(
                s,
                format!(
                    "{what} {} is not read in sealed mode (validate --sealed opens no file a document names)",
                    s.shown()
                ),
            );
            return None;
        }
        match fs::read_capped(path, MAX_DOCUMENT_BYTES) {
            Err(e) => {
                doc.error_str(s, format!("cannot read {what} {}: {e}", s.shown()));
                None
            }
            Ok(bytes) => {
                let (root, idx) = self.ingest(&display(path), &bytes);
                root.map(|r| (r, idx))
            }
        }
    }

    /// Loads a policy file a Config names.
    pub(crate) fn load_policy_from_config(
        &mut self,
        doc: &mut Doc<'_>,
        s: &Str,
        path: &Path,
    ) -> Option<LoadedPolicy> {
        let (root, idx) = self.read_referenced(doc, s, path, "policy file")?;
        let name = display(path);
        let sha = self.documents[idx].sha256.clone();
        let mut pdoc = Doc::new(name, Placeholders::Forbid);
        let kind = header(&mut pdoc, &root);
        self.documents[idx].kind = kind.clone();
        let policy = match kind.as_deref() {
            Some("Policy") => {
                self.documents[idx].name = policy::peek_name(&root);
                policy::parse_policy(self, &mut pdoc, &root, path, &sha)
            }
            Some(_) => {
                if let Some(k) = kind_node(&root) {
                    pdoc.error(k, "kind", "a policy file must hold a kind: Policy document");
                }
                None
            }
            None => None,
        };
        self.errors.append(&mut pdoc.errors);
        if policy.is_none() && !self.errors.iter().any(|e| e.file == display(path)) {
            doc.error_str(s, "policy file is invalid");
        }
        policy
    }

    /// Loads a file named by the user (command line or `serve --config`).
    fn load_top(
        &mut self,
        path: &Path,
        bytes: Result<Vec<u8>, ReadError>,
        want_config: bool,
    ) -> Top {
        let name = display(path);
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                let (line, column) = if e.is_unreadable() { (0, 0) } else { (1, 1) };
                if e.is_unreadable() {
                    self.could_not_check = true;
                }
                self.errors
                    .push(LocatedError::new(&name, line, column, "", e.to_string()));
                return Top::Nothing;
            }
        };
        let (root, idx) = self.ingest(&name, &bytes);
        let Some(root) = root else {
            return Top::Nothing;
        };
        let sha = self.documents[idx].sha256.clone();
        let resolver = self.resolver.clone();
        let mut doc = Doc::new(name, Placeholders::Forbid);
        let kind = header(&mut doc, &root);
        self.documents[idx].kind = kind.clone();
        let out = match kind.as_deref() {
            Some("Config") => {
                doc.placeholders = if self.opts.sealed {
                    Placeholders::Sealed
                } else {
                    Placeholders::Resolve(&resolver)
                };
                Top::Config(config::parse_config(self, &mut doc, &root, path, &sha))
            }
            Some(_) if want_config => {
                if let Some(k) = kind_node(&root) {
                    doc.error(k, "kind", "expected a kind: Config document");
                }
                Top::Nothing
            }
            Some(_) => {
                self.documents[idx].name = policy::peek_name(&root);
                Top::Policy(policy::parse_policy(self, &mut doc, &root, path, &sha))
            }
            None => Top::Nothing,
        };
        self.errors.append(&mut doc.errors);
        out
    }

    /// Sorts errors by file (in reading order) and position, caps them.
    fn finish(mut self) -> (Vec<DocumentInfo>, Vec<LocatedError>, bool) {
        let mut order: Vec<String> = Vec::new();
        for f in self
            .documents
            .iter()
            .map(|d| &d.file)
            .chain(self.errors.iter().map(|e| &e.file))
        {
            if !order.contains(f) {
                order.push(f.clone());
            }
        }
        let rank = |f: &str| order.iter().position(|o| o == f).unwrap_or(usize::MAX);
        self.errors
            .sort_by_key(|e| (rank(&e.file), e.line, e.column));
        self.errors.dedup();
        if self.errors.len() > MAX_ERRORS {
            let more = self.errors.len() - MAX_ERRORS;
            self.errors.truncate(MAX_ERRORS);
            let last = self.errors[MAX_ERRORS - 1].clone();
            self.errors.push(LocatedError::new(
                last.file,
                last.line,
                last.column,
                "",
                format!("{more} more errors not shown"),
            ));
        }
        (self.documents, self.errors, self.could_not_check)
    }
}

/// The node of the root's `kind` value.
fn kind_node(root: &Node) -> Option<&Node> {
    let tree::Value::Map(entries) = &root.value else {
        return None;
    };
    entries
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == "kind"))
        .map(|(_, v)| v)
}

/// Checks `apiVersion` and `kind`; returns the kind if it is Policy or Config.
fn header(doc: &mut Doc<'_>, root: &Node) -> Option<String> {
    let m = doc.open_map(root, "")?;
    if let Some(v) = m.req(doc, "apiVersion")
        && let Some(s) = doc.string(v, "apiVersion")
        && s.value != API_VERSION
    {
        doc.error_str(
            &s,
            format!(
                "unsupported apiVersion {}, expected {API_VERSION}",
                s.shown()
            ),
        );
    }
    let k = m.req(doc, "kind")?;
    let s = doc.string(k, "kind")?;
    match s.value.as_str() {
        "Policy" | "Config" => Some(s.value),
        _ => {
            doc.error_str(
                &s,
                format!("unknown kind {}, expected Policy or Config", s.shown()),
            );
            None
        }
    }
}

/// Reads a file named by the caller; in sealed mode without following a
/// symbolic link.
fn read_top(path: &Path, opts: &LoadOptions) -> Result<Vec<u8>, ReadError> {
    if opts.sealed {
        fs::read_capped_nofollow(path, MAX_DOCUMENT_BYTES)
    } else {
        fs::read_capped(path, MAX_DOCUMENT_BYTES)
    }
}

fn internal_error(file: &Path) -> LocatedError {
    LocatedError::new(
        display(file),
        0,
        0,
        "",
        "internal error while loading this file (please report it)",
    )
}

/// Loads every file (Policy or Config documents) with default options.
pub fn load_files(paths: &[PathBuf]) -> LoadReport {
    load_files_with(paths, &LoadOptions::default())
}

/// Loads every file (Policy or Config documents).
pub fn load_files_with(paths: &[PathBuf], opts: &LoadOptions) -> LoadReport {
    let mut session = Session::new(opts);
    let mut configs = Vec::new();
    let mut policies = Vec::new();
    for path in paths {
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let bytes = read_top(path, opts);
            session.load_top(path, bytes, false)
        }));
        match outcome {
            Ok(Top::Config(Some(c))) => configs.push(c),
            Ok(Top::Policy(Some(p))) => policies.push(p),
            Ok(_) => {}
            Err(_) => {
                session.could_not_check = true;
                session.errors.push(internal_error(path));
            }
        }
    }
    let (documents, errors, could_not_check) = session.finish();
    LoadReport {
        documents,
        errors,
        could_not_check,
        configs,
        policies,
    }
}

/// Loads one document from bytes already in memory, as if read from `path`
/// (relative references are resolved against `path`'s folder). No panic
/// catching: this is the fuzzing entry point.
pub fn load_bytes(path: &Path, bytes: &[u8], opts: &LoadOptions) -> LoadReport {
    let mut session = Session::new(opts);
    let mut report = LoadReport::default();
    if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
        session.load_top(
            path,
            Err(ReadError::TooLarge {
                limit: MAX_DOCUMENT_BYTES,
            }),
            false,
        );
    } else {
        match session.load_top(path, Ok(bytes.to_vec()), false) {
            Top::Config(Some(c)) => report.configs.push(c),
            Top::Policy(Some(p)) => report.policies.push(p),
            _ => {}
        }
    }
    let (documents, errors, could_not_check) = session.finish();
    report.documents = documents;
    report.errors = errors;
    report.could_not_check = could_not_check;
    report
}

/// Loads a Config the way `haltsql serve` does, with default options.
pub fn load_config(path: &Path) -> Result<LoadedConfig, Vec<LocatedError>> {
    load_config_with(path, &LoadOptions::default())
}

/// Loads a Config: the fully resolved config, or every located error (the
/// same errors `validate` reports for the file).
pub fn load_config_with(
    path: &Path,
    opts: &LoadOptions,
) -> Result<LoadedConfig, Vec<LocatedError>> {
    let mut session = Session::new(opts);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let bytes = read_top(path, opts);
        session.load_top(path, bytes, true)
    }));
    let config = match outcome {
        Ok(Top::Config(c)) => c,
        Ok(_) => None,
        Err(_) => {
            session.errors.push(internal_error(path));
            None
        }
    };
    let (_, errors, _) = session.finish();
    match config {
        Some(c) if errors.is_empty() => Ok(c),
        _ if errors.is_empty() => Err(vec![internal_error(path)]),
        _ => Err(errors),
    }
}

/// Loads one Policy file.
pub fn load_policy(path: &Path, opts: &LoadOptions) -> Result<LoadedPolicy, Vec<LocatedError>> {
    let report = load_files_with(&[path.to_path_buf()], opts);
    match report.policies.into_iter().next() {
        Some(p) if report.errors.is_empty() => Ok(p),
        _ if report.errors.is_empty() => Err(vec![LocatedError::new(
            display(path),
            1,
            1,
            "kind",
            "expected a kind: Policy document",
        )]),
        _ => Err(report.errors),
    }
}
