//! Pure rendering of a HaltSQLServer: `config.yaml` and the policy files,
//! the config checksum, and the owned ConfigMap, Deployment, Service,
//! PodDisruptionBudget and NetworkPolicy. No client, no clock, no I/O: the
//! same input always gives the same objects.
//!
//! Choices this module makes (see also the item docs):
//! - Policies are rendered in HaltSQLPolicy object-name order, so reordering
//!   `spec.policies` does not roll the pods.
//! - Bundle caches share one emptyDir at `/var/cache/haltsql/bundles`; each
//!   bundle's `cache_dir` is its own subfolder `<HaltSQLPolicy name>`, which
//!   the server creates.
//! - `allowUnauthenticated` without `defaultPolicy` is an error, as in
//!   haltsql (unauthenticated requests would have no policy).
//! - The configuration lives in an immutable ConfigMap per rendered
//!   configuration, `<server>-haltsql-config-<first 16 hex digits of the
//!   checksum>`, so a pod of an older ReplicaSet that restarts during a
//!   stalled rollout still mounts the configuration it was made for. The
//!   ConfigMap and the pod template carry [`CONFIG_HASH_LABEL`], which is how
//!   the reconciler tells which ReplicaSets still use which ConfigMap.
//! - Every owned object carries the three common labels, a controller owner
//!   reference (when the server has a uid, i.e. always when it was read from
//!   the API server; offline renders without a uid get none) and the
//!   `haltsql.dev/spec-hash` annotation.

pub mod checksum;
pub mod config;
pub mod content;
mod errors;
mod objects;
pub mod secrets;
pub mod service;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use serde_json::Value;

use crate::api::{ClientAuth, HaltSQLPolicySpec, HaltSQLServer, HaltSQLServerSpec, PolicySource};
pub use checksum::{SPEC_HASH_ANNOTATION, spec_hash_of};
pub use content::{ValidationDocument, content_hash, validation_document};
pub use errors::RenderError;
pub use objects::{
    APP_NAME, CONFIG_CHECKSUM_ANNOTATION, CONFIG_HASH_LABEL, CONFIG_HASH_LEN, CONFIG_KEY,
    INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, MAX_CONFIG_MAP_BYTES, NAME_LABEL, common_labels,
    config_hash, config_map_name, config_map_prefix, owner_reference, selector_labels,
    selector_string,
};
use objects::{ServerRef, stamp};
use secrets::SecretMounts;

/// One referenced HaltSQLPolicy, as the server reconciler found it (Valid
/// for its current generation).
#[derive(Clone, Copy, Debug)]
pub struct PolicyInput<'a> {
    /// `metadata.name` of the HaltSQLPolicy object.
    pub object_name: &'a str,
    /// `status.policyName`: the policy document's `metadata.name` (only used
    /// for inline policies).
    pub policy_name: &'a str,
    /// `status.contentHash` (not rendered; the reconciler keeps it for
    /// `appliedPolicies`).
    pub content_hash: &'a str,
    /// The object's spec.
    pub spec: &'a HaltSQLPolicySpec,
}

/// Everything the server reconciler applies.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// The config checksum (`status.configChecksum`, pod-template annotation).
    pub checksum: String,
    /// `<server>-haltsql-config-<hash>`, immutable.
    pub config_map: ConfigMap,
    /// `<server>`.
    pub deployment: Deployment,
    /// `<server>`.
    pub service: Service,
    /// `<server>`, when enabled.
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    /// `<server>`, when enabled.
    pub network_policy: Option<NetworkPolicy>,
    /// Every Secret key the pods mount, `(secret, key)`, sorted (TLS keys
    /// included).
    pub mounted_secret_keys: Vec<(String, String)>,
}

/// The server's name must work as a Service name (a DNS-1035 label) and as
/// a label value (at most 63 characters).
fn check_server_name(name: &str) -> Result<(), RenderError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(RenderError::InvalidServerName {
            name: name.to_owned(),
            reason: "must be a DNS-1035 label (at most 63 lower-case letters, digits and '-', starting with a letter): it names the Service and is the app.kubernetes.io/instance label".to_owned(),
        })
    }
}

/// The policy names the referenced policies define, for reference checks.
struct Defined {
    /// Inline policies: policy name -> object name.
    inline: BTreeMap<String, String>,
    /// `namePrefix` of each bundle (`None`: no prefix).
    bundle_prefixes: Vec<Option<String>>,
}

impl Defined {
    fn collect(policies: &[PolicyInput<'_>]) -> Result<Self, RenderError> {
        let mut inline: BTreeMap<String, String> = BTreeMap::new();
        let mut bundle_prefixes = Vec::new();
        for p in policies {
            match p.spec.source().map_err(|e| RenderError::PolicySpec {
                object: p.object_name.to_owned(),
                source: e,
            })? {
                PolicySource::Inline(_) => {
                    if let Some(first) = inline.get(p.policy_name) {
                        return Err(RenderError::DuplicatePolicyName {
                            name: p.policy_name.to_owned(),
                            first: first.clone(),
                            second: p.object_name.to_owned(),
                        });
                    }
                    inline.insert(p.policy_name.to_owned(), p.object_name.to_owned());
                }
                PolicySource::Bundle(b) => bundle_prefixes.push(b.name_prefix.clone()),
            }
        }
        Ok(Self {
            inline,
            bundle_prefixes,
        })
    }

    /// Whether a policy name may be loaded: an inline policy's name, or a
    /// name a bundle may bring (with a prefix on every bundle, one that
    /// starts with a prefix; with an unprefixed bundle, any name).
    fn may_define(&self, name: &str) -> bool {
        if self.inline.contains_key(name) {
            return true;
        }
        if self.bundle_prefixes.is_empty() {
            return false;
        }
        self.bundle_prefixes.iter().any(|p| match p {
            None => true,
            Some(prefix) => name.len() > prefix.len() && name.starts_with(prefix.as_str()),
        })
    }

    fn check(&self, field: String, name: &str) -> Result<(), RenderError> {
        if self.may_define(name) {
            return Ok(());
        }
        let mut defined: Vec<String> = self.inline.keys().cloned().collect();
        defined.extend(
            self.bundle_prefixes
                .iter()
                .flatten()
                .map(|p| format!("{p}*")),
        );
        Err(RenderError::UndefinedPolicy {
            field,
            name: name.to_owned(),
            defined: if defined.is_empty() {
                "none".to_owned()
            } else {
                defined.join(", ")
            },
        })
    }
}

/// Checks what can be checked without Secret values: policy references,
/// unique token names and hashes, mTLS and unauthenticated mode.
fn check_spec(spec: &HaltSQLServerSpec, defined: &Defined) -> Result<(), RenderError> {
    let default_policy = spec
        .config
        .as_ref()
        .and_then(|c| c.default_policy.as_deref());
    if spec.allow_unauthenticated() && default_policy.is_none() {
        return Err(RenderError::UnauthenticatedWithoutDefaultPolicy);
    }
    if let Some(name) = default_policy {
        defined.check("spec.config.defaultPolicy".to_owned(), name)?;
    }
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut refs: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (i, t) in spec.tokens().iter().enumerate() {
        if let Some(first) = names.insert(&t.name, i) {
            return Err(RenderError::InvalidField {
                field: format!("spec.auth.tokens[{i}].name"),
                message: format!("{:?} is already used by spec.auth.tokens[{first}]", t.name),
            });
        }
        // One hash may select only one policy: the same key twice is the
        // same hash twice, which haltsql refuses at start-up.
        let r = &t.sha256_secret_ref;
        if let Some(first) = refs.insert((&r.name, &r.key), i) {
            return Err(RenderError::InvalidField {
                field: format!("spec.auth.tokens[{i}].sha256SecretRef"),
                message: format!(
                    "the same Secret key as spec.auth.tokens[{first}] (a token hash must select exactly one policy)"
                ),
            });
        }
        defined.check(format!("spec.auth.tokens[{i}].policy"), &t.policy)?;
    }
    let auth = spec.auth.as_ref();
    for (i, o) in auth
        .and_then(|a| a.oidc.as_deref())
        .unwrap_or(&[])
        .iter()
        .enumerate()
    {
        if let Some(Value::String(name)) = o.get("policy") {
            defined.check(format!("spec.auth.oidc[{i}].policy"), name)?;
        }
    }
    let identities = auth
        .and_then(|a| a.mtls.as_ref())
        .and_then(|m| m.identities.as_deref())
        .unwrap_or(&[]);
    if !identities.is_empty() {
        let verifies_clients = spec.tls.as_ref().is_some_and(|t| {
            matches!(
                t.client_auth,
                Some(ClientAuth::Optional | ClientAuth::Required)
            )
        });
        if !verifies_clients {
            return Err(RenderError::MtlsWithoutClientAuth);
        }
    }
    for (i, o) in identities.iter().enumerate() {
        if let Some(Value::String(name)) = o.get("policy") {
            defined.check(format!("spec.auth.mtls.identities[{i}].policy"), name)?;
        }
    }
    Ok(())
}

/// What rendering takes from the operator's settings rather than from the
/// objects. The default leaves each to Kubernetes' own default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenderSettings {
    /// The Deployment's `progressDeadlineSeconds` (`--rollout-deadline-seconds`).
    pub rollout_deadline: Option<Duration>,
}

/// Renders everything the server reconciler applies for `server` loading
/// `policies` (each referenced HaltSQLPolicy, in any order), with no
/// operator settings (as the golden files show it). The operator renders
/// with [`render_with`].
pub fn render(
    server: &HaltSQLServer,
    policies: &[PolicyInput<'_>],
) -> Result<Rendered, RenderError> {
    render_with(server, policies, RenderSettings::default())
}

/// The files of the ConfigMap (`config.yaml` and one file per inline
/// policy) and the Secret keys the configuration refers to.
struct ConfigFiles {
    files: BTreeMap<String, String>,
    mounts: SecretMounts,
    has_bundles: bool,
}

/// `config.yaml` and the policy files, policies in object-name order.
fn config_files(
    srv: &ServerRef<'_>,
    policies: &[PolicyInput<'_>],
) -> Result<ConfigFiles, RenderError> {
    let mut sorted: Vec<&PolicyInput<'_>> = policies.iter().collect();
    sorted.sort_by(|a, b| a.object_name.cmp(b.object_name));
    let mut mounts = SecretMounts::new();
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let mut entries = Vec::new();
    let mut has_bundles = false;
    for p in &sorted {
        match p.spec.source().map_err(|e| RenderError::PolicySpec {
            object: p.object_name.to_owned(),
            source: e,
        })? {
            PolicySource::Inline(policy) => {
                let file = config::policy_file_name(p.object_name);
                files.insert(file.clone(), policy.to_owned());
                entries.push(config::PolicyEntry {
                    file: Some(file),
                    bundle_source: None,
                });
            }
            PolicySource::Bundle(b) => {
                let field = format!("HaltSQLPolicy {:?} spec.bundleSource", p.object_name);
                let entry = config::bundle_entry(
                    p.object_name,
                    &field,
                    b,
                    &mut config::Credentials::Mount(&mut mounts),
                )?;
                has_bundles = true;
                entries.push(config::PolicyEntry {
                    file: None,
                    bundle_source: Some(entry),
                });
            }
        }
    }
    let doc = config::config_doc(srv.spec, entries, &mut mounts)?;
    let header = format!(
        "# Rendered by {MANAGED_BY} from HaltSQLServer {}{}. Edit the HaltSQLServer or its HaltSQLPolicies instead: the next change to them replaces this file.\n",
        srv.namespace.map(|n| format!("{n}/")).unwrap_or_default(),
        srv.name
    );
    files.insert(
        CONFIG_KEY.to_owned(),
        config::to_yaml(&header, &doc, CONFIG_KEY)?,
    );
    Ok(ConfigFiles {
        files,
        mounts,
        has_bundles,
    })
}

/// Every Secret key the pods mount, TLS included, sorted: all of them feed
/// the checksum.
fn mounted_secret_keys(
    spec: &HaltSQLServerSpec,
    mounts: &SecretMounts,
) -> Result<Vec<(String, String)>, RenderError> {
    let mut all_keys: BTreeSet<(String, String)> = mounts.iter().cloned().collect();
    if let Some(tls) = &spec.tls {
        secrets::check_ref("spec.tls.secretName", &tls.secret_name, "tls.crt")?;
        for key in workload::tls_keys(spec) {
            all_keys.insert((tls.secret_name.clone(), key.to_owned()));
        }
    }
    Ok(all_keys.into_iter().collect())
}

/// The immutable ConfigMap of one rendered configuration.
fn config_map(
    srv: &ServerRef<'_>,
    files: BTreeMap<String, String>,
    checksum: &str,
) -> Result<ConfigMap, RenderError> {
    let cm_name = config_map_name(srv.name, checksum);
    let size: usize = files.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_CONFIG_MAP_BYTES {
        return Err(RenderError::ConfigMapTooLarge {
            name: cm_name,
            size,
            limit: MAX_CONFIG_MAP_BYTES,
        });
    }
    let mut cm_meta = srv.meta(cm_name, BTreeMap::new());
    cm_meta.labels.get_or_insert_with(BTreeMap::new).insert(
        CONFIG_HASH_LABEL.to_owned(),
        config_hash(checksum).to_owned(),
    );
    // Immutable: its name stands for its content, and the kubelet need not
    // watch it.
    Ok(ConfigMap {
        metadata: cm_meta,
        data: Some(files),
        immutable: Some(true),
        ..Default::default()
    })
}

/// Renders everything the server reconciler applies for `server` loading
/// `policies` (each referenced HaltSQLPolicy, in any order): a pure
/// function of the objects and the operator's `settings`.
pub fn render_with(
    server: &HaltSQLServer,
    policies: &[PolicyInput<'_>],
    settings: RenderSettings,
) -> Result<Rendered, RenderError> {
    let name = server
        .metadata
        .name
        .as_deref()
        .ok_or(RenderError::MissingName)?;
    check_server_name(name)?;
    let spec = &server.spec;
    let srv = ServerRef {
        name,
        namespace: server.metadata.namespace.as_deref(),
        owner: owner_reference(server),
        spec,
    };
    let defined = Defined::collect(policies)?;
    check_spec(spec, &defined)?;

    let ConfigFiles {
        files,
        mounts,
        has_bundles,
    } = config_files(&srv, policies)?;
    let mounted_secret_keys = mounted_secret_keys(spec, &mounts)?;
    let checksum = checksum::config_checksum(&files, &mounted_secret_keys);
    let config_map = config_map(&srv, files, &checksum)?;
    let deployment = workload::deployment(
        &srv,
        &config_map.name_any(),
        &checksum,
        &mounts,
        has_bundles,
        settings.rollout_deadline,
    );
    let service = stamp(service::service(&srv));
    let pod_disruption_budget = service::pod_disruption_budget(&srv)?.map(stamp);
    let network_policy = service::network_policy(&srv).map(stamp);

    Ok(Rendered {
        checksum,
        config_map: stamp(config_map),
        deployment: stamp(deployment),
        service,
        pod_disruption_budget,
        network_policy,
        mounted_secret_keys,
    })
}
