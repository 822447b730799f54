//! `policies`: the policy files a Config loads, its bundle sources, and the
//! references to policies from the rest of the document.

use std::collections::BTreeMap;
use std::path::Path;

use super::bundle_source::{BundleSource, Prefix, parse_bundle_source};
use crate::load::Session;
use crate::load::policy::LoadedPolicy;
use crate::load::tree::Node;
use crate::load::walk::{Doc, Map, Str, index, join};
use haltsql_names::is_dns1123_hostname;

/// A reference to a policy, checked once every policy entry is known.
pub(super) struct PolicyRef {
    name: Str,
}

pub(super) fn policy_ref(
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
    refs: &mut Vec<PolicyRef>,
) -> Option<String> {
    let s = doc.nonempty(node, path)?;
    if !is_dns1123_hostname(&s.value) {
        doc.error_str(
            &s,
            format!(
                "invalid policy name {}: must be a lower-case DNS-1123 subdomain",
                s.shown()
            ),
        );
        return None;
    }
    let v = s.value.clone();
    refs.push(PolicyRef { name: s });
    Some(v)
}

/// A `policies[]` entry being loaded.
struct FileEntry {
    policy: Option<LoadedPolicy>,
    node: Str,
    path: String,
}

/// A `policies[].bundle_source` entry being checked.
struct BundleEntry {
    source: Option<BundleSource>,
    name: Option<Str>,
    prefix: Prefix,
    path: String,
}

/// The `policies` entries as read, before the cross-checks.
pub(super) struct PolicyEntries {
    files: Vec<FileEntry>,
    bundles: Vec<BundleEntry>,
    /// Set when a `policies[]` entry could not be read at all.
    incomplete: bool,
}

impl PolicyEntries {
    /// The loaded policies and the checked bundle sources; `None` when any
    /// entry failed (already reported).
    pub(super) fn into_loaded(self) -> Option<(Vec<LoadedPolicy>, Vec<BundleSource>)> {
        let policies = self
            .files
            .into_iter()
            .map(|f| f.policy)
            .collect::<Option<Vec<_>>>()?;
        let bundle_sources = self
            .bundles
            .into_iter()
            .map(|b| b.source)
            .collect::<Option<Vec<_>>>()?;
        Some((policies, bundle_sources))
    }
}

/// `policies`: loads each `file` entry and checks each `bundle_source`.
pub(super) fn parse_policies(
    session: &mut Session<'_>,
    doc: &mut Doc<'_>,
    m: Map<'_>,
    file: &Path,
) -> PolicyEntries {
    let mut entries = PolicyEntries {
        files: Vec::new(),
        bundles: Vec::new(),
        incomplete: false,
    };
    let Some(list) = m.req(doc, "policies") else {
        return entries;
    };
    let Some(items) = doc.seq(list, "policies") else {
        return entries;
    };
    if items.is_empty() {
        doc.error(list, "policies", "must list at least one policy");
    }
    for (i, item) in items.iter().enumerate() {
        let path = index("policies", i);
        let Some(em) = doc.map(item, &path, &["file", "bundle_source"]) else {
            entries.incomplete = true;
            continue;
        };
        match (em.get("file"), em.get("bundle_source")) {
            (Some(_), Some(_)) | (None, None) => {
                entries.incomplete = true;
                doc.error(
                    item,
                    &path,
                    "exactly one of file or bundle_source is required",
                );
            }
            (Some(f), None) => {
                let fpath = join(&path, "file");
                if let Some(s) = doc.nonempty(f, &fpath) {
                    let policy = load_policy_entry(session, doc, &s, file);
                    entries.files.push(FileEntry {
                        policy,
                        node: s,
                        path: fpath,
                    });
                } else {
                    entries.incomplete = true;
                }
            }
            (None, Some(b)) => {
                let bpath = join(&path, "bundle_source");
                let (source, name, prefix) = parse_bundle_source(session, doc, b, &bpath);
                entries.bundles.push(BundleEntry {
                    source,
                    name,
                    prefix,
                    path: bpath,
                });
            }
        }
    }
    entries
}

fn load_policy_entry(
    session: &mut Session<'_>,
    doc: &mut Doc<'_>,
    s: &Str,
    config_file: &Path,
) -> Option<LoadedPolicy> {
    let rel = Path::new(&s.value);
    let path = if rel.is_absolute() {
        crate::load::fs::rooted(session.opts.root.as_deref(), rel)
    } else {
        config_file.parent().unwrap_or(Path::new("")).join(rel)
    };
    session.load_policy_from_config(doc, s, &path)
}

/// Checks the policy names: no two file policies or bundle sources share
/// one, and every reference names a loaded policy (or one a bundle's prefix
/// may bring).
pub(super) fn check_policy_names(doc: &mut Doc<'_>, entries: &PolicyEntries, refs: &[PolicyRef]) {
    let PolicyEntries {
        files,
        bundles,
        incomplete,
    } = entries;
    let incomplete = *incomplete;
    // Duplicate names among file policies.
    let mut names: BTreeMap<&str, &FileEntry> = BTreeMap::new();
    for f in files {
        let Some(p) = &f.policy else { continue };
        if let Some(prev) = names.get(p.name.as_str()) {
            doc.error_str(
                &f.node,
                format!(
                    "policy name {:?} is already loaded by {} (two policies with one name)",
                    p.name, prev.path
                ),
            );
        } else {
            names.insert(&p.name, f);
        }
    }
    // Bundle source names and prefixes.
    let mut bundle_names: BTreeMap<&str, &BundleEntry> = BTreeMap::new();
    for b in bundles {
        if let Some(n) = &b.name {
            if let Some(prev) = bundle_names.get(n.value.as_str()) {
                doc.error_str(
                    n,
                    format!(
                        "bundle source name {} is already used by {}",
                        n.shown(),
                        prev.path
                    ),
                );
            } else {
                bundle_names.insert(&n.value, b);
            }
        }
    }
    // The contract sets no rule on prefixes beyond references: bundles
    // without a prefix, overlapping prefixes and file policies whose name
    // starts with a prefix are all accepted. Whether two policies end up
    // with one name can only be known when the bundles are fetched, and
    // the server checks it then.
    // References.
    let every_bundle_prefixed = bundles.iter().all(|b| !matches!(b.prefix, Prefix::Absent));
    let any_invalid = bundles.iter().any(|b| matches!(b.prefix, Prefix::Invalid));
    // A policy file that did not load (already reported) may be the one a
    // reference names: do not add a misleading second error.
    let all_files_loaded = !incomplete && files.iter().all(|f| f.policy.is_some());
    for r in refs {
        let name = &r.name.value;
        if names.contains_key(name.as_str()) {
            continue;
        }
        if !every_bundle_prefixed || any_invalid || !all_files_loaded {
            // A bundle without a (valid) prefix may bring any name: such
            // references are checked when the bundle is fetched.
            continue;
        }
        let via_bundle = bundles.iter().any(|b| {
            b.prefix
                .valid()
                .is_some_and(|p| name.len() > p.value.len() && name.starts_with(&p.value))
        });
        if via_bundle {
            continue;
        }
        let mut known: Vec<String> = names.keys().map(|k| format!("{k:?}")).collect();
        known.extend(
            bundles
                .iter()
                .filter_map(|b| b.prefix.valid().map(|p| format!("{:?}*", p.value))),
        );
        let known = if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        };
        doc.error_str(
            &r.name,
            format!(
                "policy {} is not loaded by this config (loaded: {known})",
                r.name.shown()
            ),
        );
    }
}
