//! The bundle archive: build one from a folder, open (and check) one.
//!
//! Opening is written for hostile input even though bundles are signed: the
//! archive is checked only after its signature, but a signing key can leak,
//! and a bug here must not become a path traversal or a memory blow-up.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use flate2::Compression;
use flate2::read::GzDecoder;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::load::{self, LoadOptions, LoadedPolicy, LocatedError, tree, yaml};
use haltsql_names::is_dns1123_hostname;

/// Largest bundle archive (compressed), fetched or cached: 8 MiB.
pub const MAX_BUNDLE_BYTES: u64 = 8 * 1024 * 1024;
/// Largest sum of the unpacked files: 32 MiB.
pub const MAX_UNPACKED_BYTES: u64 = 32 * 1024 * 1024;
/// Most entries in the archive.
pub const MAX_ENTRIES: usize = 1024;
/// The manifest's file name at the archive root.
pub const MANIFEST: &str = "manifest.json";
/// The only `format` understood.
pub const FORMAT: u32 = 1;

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Manifest {
    /// `haltsql.dev/v1`.
    pub api_version: String,
    /// `BundleManifest`.
    pub kind: String,
    /// `1`.
    pub format: u32,
    /// Free text shown in logs and metrics (for example a git commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The policy files, each exactly once.
    pub policies: Vec<ManifestEntry>,
    /// Catalog snapshots that policies name with `catalog: FILE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub catalogs: Vec<ManifestEntry>,
}

/// One policy file of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Path inside the archive (`/`-separated, relative).
    pub path: String,
    /// Lower-case hex SHA-256 of the file.
    pub sha256: String,
}

/// A checked bundle.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// Lower-case hex SHA-256 of the archive.
    pub digest: String,
    /// The manifest's `revision`.
    pub revision: Option<String>,
    /// The policies, names already prefixed, in manifest order.
    pub policies: Vec<LoadedPolicy>,
}

#[derive(Debug, Error)]
pub enum BundleError {
    #[error("the bundle is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("not a gzip-compressed tar archive: {0}")]
    Archive(std::io::Error),
    #[error("the unpacked bundle is larger than {MAX_UNPACKED_BYTES} bytes")]
    UnpackedTooLarge,
    #[error("the bundle has more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    #[error("{path}: {reason}")]
    BadEntry { path: String, reason: String },
    #[error("{MANIFEST}: {0}")]
    Manifest(String),
    #[error("{0}")]
    Policy(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl BundleError {
    /// A short label for the rejection counter.
    pub fn reason(&self) -> &'static str {
        match self {
            BundleError::TooLarge { .. } | BundleError::UnpackedTooLarge => "too_large",
            BundleError::Policy(_) => "invalid_policy",
            _ => "invalid_archive",
        }
    }
}

fn located(errors: &[LocatedError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Builds a bundle from every `.yaml`, `.yml` and `.json` file under `dir`
/// (recursively, in path order). Each must be a valid `kind: Policy`
/// document with an inline catalog (if any); other files, symbolic links and
/// special files are refused. The archive is reproducible: the same folder
/// gives the same bytes.
pub fn build_dir(dir: &Path, revision: Option<String>) -> Result<Vec<u8>, BundleError> {
    let mut files = BTreeMap::new();
    collect(dir, dir, &mut files)?;
    let shown_dir = format!("{}/", dir.display());
    // A document with a kind is a policy; a file a policy names with
    // `catalog: FILE` is a catalog; anything else is a mistake.
    let mut policies = Vec::new();
    let mut catalogs = BTreeSet::new();
    let mut errors = Vec::new();
    // Policies whose catalog reference is wrong are not loaded (the loader
    // would open what they name).
    let mut bad_refs = BTreeSet::new();
    for (rel, bytes) in &files {
        let p = peek(bytes);
        if p.kind.is_none() {
            continue;
        }
        policies.push(rel.clone());
        if let Some((file, line, col)) = p.catalog_file {
            let checked = catalog_path(rel, &file);
            if !checked.as_ref().is_ok_and(|c| files.contains_key(c)) {
                bad_refs.insert(rel.clone());
            }
            match checked {
                Ok(c) if files.contains_key(&c) => {
                    catalogs.insert(c);
                }
                Ok(_) => errors.push(format!(
                    "{shown_dir}{rel}:{line}:{col}: catalog: {file} is not in {}",
                    dir.display()
                )),
                Err(e) => errors.push(format!("{shown_dir}{rel}:{line}:{col}: catalog: {e}")),
            }
        }
    }
    for rel in files.keys() {
        if !policies.contains(rel) && !catalogs.contains(rel) {
            errors.push(format!(
                "{shown_dir}{rel}: neither a kind: Policy document nor a catalog that a policy names"
            ));
        }
    }
    if policies.is_empty() && errors.is_empty() {
        errors.push(format!("{}: no policy documents", dir.display()));
    }
    let mut names = BTreeMap::new();
    for rel in policies.iter().filter(|r| !bad_refs.contains(*r)) {
        match check_policy_bytes(&shown_dir, dir, rel, &files[rel], None) {
            Ok(p) => {
                if let Some(first) = names.insert(p.name.clone(), rel.clone()) {
                    errors.push(format!(
                        "{shown_dir}{rel}: policy {} is also defined in {first}",
                        p.name
                    ));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(BundleError::Policy(errors.join("\n")));
    }
    let entry = |path: &String| ManifestEntry {
        path: path.clone(),
        sha256: hex::encode(Sha256::digest(&files[path])),
    };
    let manifest = Manifest {
        api_version: load::API_VERSION.to_string(),
        kind: "BundleManifest".to_string(),
        format: FORMAT,
        revision,
        policies: policies.iter().map(entry).collect(),
        catalogs: catalogs.iter().map(entry).collect(),
    };
    let manifest_bytes =
        serde_json::to_vec_pretty(&manifest).map_err(|e| BundleError::Manifest(e.to_string()))?;
    let io = |source| BundleError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let gz = flate2::GzBuilder::new().write(Vec::new(), Compression::best());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    append(&mut tar, MANIFEST, &manifest_bytes).map_err(io)?;
    for (path, bytes) in &files {
        append(&mut tar, path, bytes).map_err(io)?;
    }
    let gz = tar.into_inner().map_err(io)?;
    let out = gz.finish().map_err(io)?;
    if out.len() as u64 > MAX_BUNDLE_BYTES {
        return Err(BundleError::TooLarge {
            limit: MAX_BUNDLE_BYTES,
        });
    }
    Ok(out)
}

fn append<W: Write>(tar: &mut tar::Builder<W>, path: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut h = tar::Header::new_ustar();
    h.set_size(bytes.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut h, path, bytes)
}

fn collect(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, Vec<u8>>,
) -> Result<(), BundleError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BundleError::Io { path, source }
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
        let bad = |reason: &str| BundleError::BadEntry {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        if meta.is_dir() {
            collect(root, &path, out)?;
            continue;
        }
        if !meta.is_file() {
            return Err(bad("only regular files and folders can go into a bundle"));
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !matches!(ext, "yaml" | "yml" | "json") {
            return Err(bad(
                "only .yaml, .yml and .json policy files can go into a bundle",
            ));
        }
        if out.len() + 1 >= MAX_ENTRIES {
            return Err(BundleError::TooManyEntries);
        }
        let rel = path
            .strip_prefix(root)
            .ok()
            .and_then(|p| {
                p.components()
                    .map(|c| match c {
                        Component::Normal(s) => s.to_str().map(str::to_string),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .map(|parts| parts.join("/"))
            .ok_or_else(|| bad("the path is not valid UTF-8"))?;
        let bytes = load::fs::read_capped(&path, load::MAX_DOCUMENT_BYTES)
            .map_err(|e| bad(&e.to_string()))?;
        out.insert(rel, bytes);
    }
    Ok(())
}

/// Checks an archive path: relative, `/`-separated, no `.`, `..` or empty
/// components, at most 255 bytes, printable.
fn check_path(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > 255 {
        return Err("paths must have 1 to 255 bytes".to_string());
    }
    if p.starts_with('/') || p.contains('\\') {
        return Err("absolute paths and backslashes are not allowed".to_string());
    }
    if p.chars().any(char::is_control) {
        return Err("control characters are not allowed".to_string());
    }
    if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("the path leaves the archive root or has empty, . or .. parts".to_string());
    }
    Ok(())
}

/// What a document says before it is loaded.
struct Peek {
    /// `kind`, if it is a string.
    kind: Option<String>,
    /// `catalog: FILE` as (file, line, column).
    catalog_file: Option<(String, usize, usize)>,
}

fn peek(bytes: &[u8]) -> Peek {
    let mut out = Peek {
        kind: None,
        catalog_file: None,
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return out; // the loader reports it, located
    };
    let (root, _) = yaml::parse(text, tree::Limits::default());
    if let Some(tree::Node {
        value: tree::Value::Map(entries),
        ..
    }) = root
    {
        for (k, v) in entries {
            let key = k.as_scalar().map(|s| s.text.as_str());
            match (key, v.as_scalar()) {
                (Some("kind"), Some(s)) => out.kind = Some(s.text.clone()),
                (Some("catalog"), Some(s)) => {
                    out.catalog_file = Some((s.text.clone(), v.line, v.column));
                }
                _ => {}
            }
        }
    }
    out
}

/// The archive path `catalog: FILE` names from the policy at `policy`:
/// relative to the policy's folder, and inside the archive.
fn catalog_path(policy: &str, file: &str) -> Result<String, String> {
    let folder = policy.rsplit_once('/').map_or("", |(d, _)| d);
    let joined = if folder.is_empty() {
        file.to_string()
    } else {
        format!("{folder}/{file}")
    };
    check_path(&joined).map(|()| joined)
}

/// Loads the policy document `rel` (an archive path). Errors name it
/// `{shown_dir}{rel}`; a catalog file it names is read from `at_dir`;
/// `prefix` is prepended to its name. Documents of another kind are
/// refused before the loader sees them.
fn check_policy_bytes(
    shown_dir: &str,
    at_dir: &Path,
    rel: &str,
    bytes: &[u8],
    prefix: Option<&str>,
) -> Result<LoadedPolicy, String> {
    let shown = PathBuf::from(format!("{shown_dir}{rel}"));
    let at = at_dir.join(rel);
    let p = peek(bytes);
    if p.kind.as_deref().is_some_and(|k| k != "Policy") {
        return Err(format!(
            "{}: kind: a bundle holds only kind: Policy documents (and the catalogs they name)",
            shown.display()
        ));
    }
    let report = load::load_bytes(&at, bytes, &LoadOptions::default());
    let at_prefix = format!("{}/", at_dir.display());
    let relabel = |e: &LocatedError| {
        let mut e = e.clone();
        if let Some(rest) = e.file.strip_prefix(&at_prefix) {
            e.file = format!("{shown_dir}{rest}");
        }
        e
    };
    if !report.errors.is_empty() {
        let errors: Vec<LocatedError> = report.errors.iter().map(relabel).collect();
        return Err(located(&errors));
    }
    let mut policy = match (report.policies.len(), report.configs.len()) {
        (1, 0) => report.policies.into_iter().next(),
        _ => None,
    }
    .ok_or_else(|| {
        format!(
            "{}: a bundle holds only kind: Policy documents",
            shown.display()
        )
    })?;
    policy.file = shown.clone();
    if let Some(prefix) = prefix {
        let name = format!("{prefix}{}", policy.name);
        if name.len() > 253 || !is_dns1123_hostname(&name) {
            return Err(format!(
                "{}: metadata.name: {name} (with name_prefix {prefix}) is not a DNS-1123 subdomain of at most 253 characters",
                shown.display()
            ));
        }
        policy.name = name;
    }
    Ok(policy)
}

/// Caps what a reader may yield; reading past `limit` is an error.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more than allowed tells "exactly the limit" from "over".
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(BundleError::UnpackedTooLarge)),
            };
        }
        let max = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Opens and checks an archive (its signature must already be verified):
/// every file listed by the manifest with its digest, nothing else, every
/// policy valid, names prefixed with `prefix` and unique. `label` names the
/// bundle in errors.
pub fn open(bytes: &[u8], prefix: Option<&str>, label: &str) -> Result<Bundle, BundleError> {
    if bytes.len() as u64 > MAX_BUNDLE_BYTES {
        return Err(BundleError::TooLarge {
            limit: MAX_BUNDLE_BYTES,
        });
    }
    let digest = hex::encode(Sha256::digest(bytes));
    let mut files = unpack(bytes)?;
    let manifest = read_manifest(&mut files)?;
    check_listed(&manifest, &files)?;
    let catalog_root = write_catalogs(&manifest, &files)?;
    let policies = load_policies(&manifest, &files, catalog_root.as_ref(), prefix, label)?;
    Ok(Bundle {
        digest,
        revision: manifest.revision,
        policies,
    })
}

/// The archive's regular files by normalized path, within the entry, size
/// and path limits.
fn unpack(bytes: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, BundleError> {
    // The unpacked cap covers tar headers and padding too, so the file
    // contents stay below it.
    let reader = Capped {
        inner: GzDecoder::new(bytes),
        left: MAX_UNPACKED_BYTES + MAX_ENTRIES as u64 * 1024,
    };
    let mut archive = tar::Archive::new(reader);
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut total = 0u64;
    let entries = archive.entries().map_err(archive_error)?;
    for (i, entry) in entries.enumerate() {
        if i >= MAX_ENTRIES {
            return Err(BundleError::TooManyEntries);
        }
        let mut entry = entry.map_err(archive_error)?;
        let raw = entry.path_bytes().into_owned();
        let path = String::from_utf8_lossy(&raw).into_owned();
        let bad = |reason: String| BundleError::BadEntry {
            path: path.clone(),
            reason,
        };
        let normalized = path.strip_prefix("./").unwrap_or(&path).to_string();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            check_path(normalized.trim_end_matches('/')).map_err(bad)?;
            continue;
        }
        if !kind.is_file() {
            return Err(bad(format!(
                "only regular files are allowed (found a {kind:?} entry)"
            )));
        }
        check_path(&normalized).map_err(bad)?;
        let size = entry.header().size().map_err(archive_error)?;
        if size > load::MAX_DOCUMENT_BYTES {
            return Err(bad(format!(
                "larger than {} bytes",
                load::MAX_DOCUMENT_BYTES
            )));
        }
        total += size;
        if total > MAX_UNPACKED_BYTES {
            return Err(BundleError::UnpackedTooLarge);
        }
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        entry.read_to_end(&mut data).map_err(archive_error)?;
        if files.insert(normalized.clone(), data).is_some() {
            return Err(bad("the path appears twice".to_string()));
        }
    }
    Ok(files)
}

/// Takes `manifest.json` out of `files` and checks its header.
fn read_manifest(files: &mut BTreeMap<String, Vec<u8>>) -> Result<Manifest, BundleError> {
    let manifest_bytes = files
        .remove(MANIFEST)
        .ok_or_else(|| BundleError::Manifest("missing at the archive root".to_string()))?;
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| BundleError::Manifest(e.to_string()))?;
    if manifest.api_version != load::API_VERSION
        || manifest.kind != "BundleManifest"
        || manifest.format != FORMAT
    {
        return Err(BundleError::Manifest(format!(
            "expected apiVersion {}, kind BundleManifest and format {FORMAT}",
            load::API_VERSION
        )));
    }
    if manifest.policies.is_empty() {
        return Err(BundleError::Manifest("policies is empty".to_string()));
    }
    Ok(manifest)
}

/// Every listed file is in the archive once with its digest, and nothing
/// else is.
fn check_listed(manifest: &Manifest, files: &BTreeMap<String, Vec<u8>>) -> Result<(), BundleError> {
    let mut listed = BTreeSet::new();
    let lists = [
        ("policies", &manifest.policies),
        ("catalogs", &manifest.catalogs),
    ];
    for (list, entries) in lists {
        for (i, e) in entries.iter().enumerate() {
            let at = format!("{list}[{i}]");
            if !listed.insert(e.path.clone()) {
                return Err(BundleError::Manifest(format!(
                    "{at}: {} is listed twice",
                    e.path
                )));
            }
            let data = files.get(&e.path).ok_or_else(|| {
                BundleError::Manifest(format!("{at}: {} is not in the archive", e.path))
            })?;
            if hex::encode(Sha256::digest(data)) != e.sha256 {
                return Err(BundleError::Manifest(format!(
                    "{at}: the sha256 of {} does not match",
                    e.path
                )));
            }
        }
    }
    if let Some(extra) = files.keys().find(|k| !listed.contains(*k)) {
        return Err(BundleError::BadEntry {
            path: extra.clone(),
            reason: format!("not listed in {MANIFEST}"),
        });
    }
    Ok(())
}

/// Catalog files are read by the loader from a private folder that holds
/// nothing else (policies are loaded from memory); `None` without catalogs.
fn write_catalogs(
    manifest: &Manifest,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<Option<tempfile::TempDir>, BundleError> {
    if manifest.catalogs.is_empty() {
        return Ok(None);
    }
    let d = tempfile::Builder::new()
        .prefix("haltsql-bundle-")
        .tempdir()
        .map_err(|e| BundleError::Io {
            path: std::env::temp_dir(),
            source: e,
        })?;
    for c in &manifest.catalogs {
        let p = d.path().join(&c.path);
        let io = |source| BundleError::Io {
            path: p.clone(),
            source,
        };
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&p, &files[&c.path]).map_err(io)?;
    }
    Ok(Some(d))
}

/// Checks and loads every policy; names prefixed and unique, catalogs only
/// from this bundle. `label` names the bundle in errors.
fn load_policies(
    manifest: &Manifest,
    files: &BTreeMap<String, Vec<u8>>,
    catalog_root: Option<&tempfile::TempDir>,
    prefix: Option<&str>,
    label: &str,
) -> Result<Vec<LoadedPolicy>, BundleError> {
    let catalog_paths: BTreeSet<&str> = manifest.catalogs.iter().map(|c| c.path.as_str()).collect();
    let at_dir = catalog_root.map_or_else(
        || PathBuf::from("/nonexistent/haltsql-bundle"),
        |d| d.path().to_path_buf(),
    );
    let shown_dir = format!("{label}:");
    let mut policies = Vec::new();
    let mut names = BTreeMap::new();
    let mut errors = Vec::new();
    for e in &manifest.policies {
        let data = &files[&e.path];
        if let Some((file, line, col)) = peek(data).catalog_file {
            let ok = catalog_path(&e.path, &file).is_ok_and(|c| catalog_paths.contains(c.as_str()));
            if !ok {
                errors.push(format!(
                    "{shown_dir}{}:{line}:{col}: catalog: {file} is not a catalog of this bundle (manifest.json catalogs)",
                    e.path
                ));
                continue;
            }
        }
        match check_policy_bytes(&shown_dir, &at_dir, &e.path, data, prefix) {
            Ok(p) => {
                if let Some(first) = names.insert(p.name.clone(), e.path.clone()) {
                    errors.push(format!(
                        "{shown_dir}{}: policy {} is also defined in {first}",
                        e.path, p.name
                    ));
                }
                policies.push(p);
            }
            Err(msg) => errors.push(msg),
        }
    }
    if !errors.is_empty() {
        return Err(BundleError::Policy(errors.join("\n")));
    }
    Ok(policies)
}

fn archive_error(e: std::io::Error) -> BundleError {
    if e.get_ref()
        .and_then(|inner| inner.downcast_ref::<BundleError>())
        .is_some()
    {
        return BundleError::UnpackedTooLarge;
    }
    BundleError::Archive(e)
}
