//! Policy content: the hash that identifies what was validated and rolled
//! out, and the document `haltsql validate` checks for a HaltSQLPolicy.

use serde::Serialize;

use super::checksum::{canonical_json, sha256_hex};
use super::config::{BundleEntry, Credentials, LISTEN, PolicyEntry, bundle_entry, to_yaml};
use super::errors::RenderError;
use crate::api::{HaltSQLPolicySpec, PolicySource};

/// File name of an inline policy's validation document.
pub const POLICY_FILE: &str = "policy.yaml";
/// File name of a bundle source's validation document.
pub const CONFIG_FILE: &str = "config.yaml";

/// SHA-256 (lower-case hex) of a policy's content: the bytes of
/// `spec.policy` for an inline policy, the canonical JSON (sorted keys) of
/// `spec.bundleSource` for a bundle. A spec with neither or both hashes the
/// canonical JSON of the whole spec, so the result is still stable.
pub fn content_hash(spec: &HaltSQLPolicySpec) -> String {
    match spec.source() {
        Ok(PolicySource::Inline(policy)) => sha256_hex(policy.as_bytes()),
        Ok(PolicySource::Bundle(bundle)) => match serde_json::to_value(bundle) {
            Ok(v) => sha256_hex(canonical_json(&v)),
            Err(e) => sha256_hex(format!("unserializable bundleSource: {e}")),
        },
        Err(_) => match serde_json::to_value(spec) {
            Ok(v) => sha256_hex(canonical_json(&v)),
            Err(e) => sha256_hex(format!("unserializable spec: {e}")),
        },
    }
}

/// A file to hand to `haltsql validate`, alone in a private folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationDocument {
    /// `policy.yaml` or `config.yaml`.
    pub file_name: String,
    /// The file's content.
    pub contents: String,
}

/// The smallest loadable Config around one bundle source.
#[derive(Serialize)]
struct BundleValidationConfig {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    server: MinimalServer,
    policies: Vec<PolicyEntry>,
}

#[derive(Serialize)]
struct MinimalServer {
    listen: &'static str,
}

/// What `haltsql validate` checks for a HaltSQLPolicy: the inline document
/// as given (`policy.yaml`), or, for a bundle, a minimal `kind: Config`
/// (`config.yaml`) with the `bundle_source` entry rendered exactly as for a
/// server, except that every credential is the fixed value `placeholder`
/// (no `${file:...}`: the validator never sees a Secret).
pub fn validation_document(
    object_name: &str,
    spec: &HaltSQLPolicySpec,
) -> Result<ValidationDocument, RenderError> {
    let source = spec.source().map_err(|e| RenderError::PolicySpec {
        object: object_name.to_owned(),
        source: e,
    })?;
    match source {
        PolicySource::Inline(policy) => Ok(ValidationDocument {
            file_name: POLICY_FILE.to_owned(),
            contents: policy.to_owned(),
        }),
        PolicySource::Bundle(bundle) => {
            let entry: BundleEntry = bundle_entry(
                object_name,
                "spec.bundleSource",
                bundle,
                &mut Credentials::Placeholder,
            )?;
            let doc = BundleValidationConfig {
                api_version: "haltsql.dev/v1",
                kind: "Config",
                server: MinimalServer { listen: LISTEN },
                policies: vec![PolicyEntry {
                    file: None,
                    bundle_source: Some(entry),
                }],
            };
            let header = format!(
                "# Validation document for HaltSQLPolicy {object_name} (bundle source; credentials are placeholders).\n"
            );
            Ok(ValidationDocument {
                file_name: CONFIG_FILE.to_owned(),
                contents: to_yaml(&header, &doc, "validation document")?,
            })
        }
    }
}
