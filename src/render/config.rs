//! `config.yaml` in haltsql's `kind: Config` format, and the bundle-source
//! entry shared with a policy's validation document.

use serde::Serialize;
use serde_json::Value;

use super::errors::RenderError;
use super::secrets::{SecretMounts, check_ref, substitute_object};
use crate::api::{
    BundleAuth, BundleAuthType, BundleLocation, BundleSource, ClientAuth, HaltSQLServerSpec,
    S3CredentialsSource,
};

/// The API listener.
pub const LISTEN: &str = "0.0.0.0:8080";
/// The plain-HTTP health listener used with TLS.
pub const HEALTH_LISTEN: &str = "0.0.0.0:8081";
/// Where the TLS Secret is mounted.
pub const TLS_DIR: &str = "/var/run/haltsql/tls";
/// Parent of the per-bundle cache folders (one shared emptyDir).
pub const BUNDLE_CACHE_DIR: &str = "/var/cache/haltsql/bundles";
/// The credential value used in validation documents, where no Secret is
/// mounted.
pub const PLACEHOLDER_CREDENTIAL: &str = "placeholder";

/// The `policies[]` entry of an inline policy: its file in the ConfigMap.
pub fn policy_file_name(object_name: &str) -> String {
    format!("policy-{object_name}.yaml")
}

/// A bundle's cache folder in the pod.
pub fn bundle_cache_dir(object_name: &str) -> String {
    format!("{BUNDLE_CACHE_DIR}/{object_name}")
}

/// The whole document. Field order is the order written, so the file reads
/// top-down like the contract's example.
#[derive(Serialize)]
pub(crate) struct ConfigDoc {
    #[serde(rename = "apiVersion")]
    pub api_version: &'static str,
    pub kind: &'static str,
    pub server: ServerSection,
    pub policies: Vec<PolicyEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_policy: Option<String>,
    pub reload: Reload,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logging: Option<Logging>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opa: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<Audit>,
}

#[derive(Serialize)]
pub(crate) struct ServerSection {
    pub listen: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_listen: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<Tls>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<Value>,
}

#[derive(Serialize)]
pub(crate) struct Tls {
    pub cert_file: String,
    pub key_file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_version: Option<&'static str>,
}

#[derive(Serialize)]
pub(crate) struct Auth {
    pub allow_unauthenticated: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<Token>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oidc: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtls: Option<Mtls>,
}

#[derive(Serialize)]
pub(crate) struct Token {
    pub name: String,
    pub policy: String,
    pub sha256: String,
}

#[derive(Serialize)]
pub(crate) struct Mtls {
    pub identities: Vec<Value>,
}

/// One `policies[]` entry: a file or a bundle source.
#[derive(Serialize)]
pub(crate) struct PolicyEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle_source: Option<BundleEntry>,
}

/// `bundle_source`.
#[derive(Serialize)]
pub(crate) struct BundleEntry {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oci: Option<Oci>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub https: Option<Https>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3>,
    pub public_keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,
    pub poll_interval_seconds: i32,
    pub cache_dir: String,
}

#[derive(Serialize)]
pub(crate) struct Oci {
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_http: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<SourceAuth>,
}

#[derive(Serialize)]
pub(crate) struct Https {
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<SourceAuth>,
}

#[derive(Serialize)]
pub(crate) struct SourceAuth {
    #[serde(rename = "type")]
    pub type_: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct S3 {
    pub bucket: String,
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<S3Credentials>,
}

#[derive(Serialize)]
pub(crate) struct S3Credentials {
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct Reload {
    pub watch: bool,
}

#[derive(Serialize)]
pub(crate) struct Limits {
    pub max_request_bytes: i64,
}

#[derive(Serialize)]
pub(crate) struct Logging {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<&'static str>,
}

#[derive(Serialize)]
pub(crate) struct Audit {
    pub log_raw_sql: bool,
    pub sinks: Vec<Value>,
}

/// Where bundle credentials come from.
pub(crate) enum Credentials<'m> {
    /// Mount the Secret key and use its `${file:...}` placeholder.
    Mount(&'m mut SecretMounts),
    /// A fixed value (validation documents: the validator never sees a
    /// Secret). The reference is still checked.
    Placeholder,
}

impl Credentials<'_> {
    fn value(&mut self, field: &str, secret: &str, key: &str) -> Result<String, RenderError> {
        match self {
            Credentials::Mount(mounts) => mounts.mount(field, secret, key),
            Credentials::Placeholder => {
                check_ref(field, secret, key)?;
                Ok(PLACEHOLDER_CREDENTIAL.to_owned())
            }
        }
    }
}

/// The `bundle_source` entry of one bundle HaltSQLPolicy. `field` is the
/// spec path of the bundle source (for error messages).
pub(crate) fn bundle_entry(
    object_name: &str,
    field: &str,
    source: &BundleSource,
    creds: &mut Credentials<'_>,
) -> Result<BundleEntry, RenderError> {
    let location = source.location().map_err(|e| RenderError::PolicySpec {
        object: object_name.to_owned(),
        source: e,
    })?;
    let mut entry = BundleEntry {
        name: object_name.to_owned(),
        oci: None,
        https: None,
        s3: None,
        public_keys: source.public_keys.clone(),
        name_prefix: source.name_prefix.clone(),
        // Always explicit: haltsql's own default differs from the API's 60.
        poll_interval_seconds: source.poll_interval_seconds(),
        cache_dir: bundle_cache_dir(object_name),
    };
    match location {
        BundleLocation::Oci(oci) => {
            let auth = oci
                .auth
                .as_ref()
                .map(|a| source_auth(a, &format!("{field}.oci.auth"), creds))
                .transpose()?;
            entry.oci = Some(Oci {
                reference: oci.r#ref.clone(),
                plain_http: oci.plain_http,
                auth,
            });
        }
        BundleLocation::Https(https) => {
            let auth = https
                .auth
                .as_ref()
                .map(|a| source_auth(a, &format!("{field}.https.auth"), creds))
                .transpose()?;
            entry.https = Some(Https {
                url: https.url.clone(),
                auth,
            });
        }
        BundleLocation::S3(s3) => {
            let credentials = match &s3.credentials {
                None => None,
                Some(c) => {
                    let cfield = format!("{field}.s3.credentials");
                    let mut out = S3Credentials {
                        source: c.source.as_str(),
                        access_key_id: None,
                        secret_access_key: None,
                        session_token: None,
                    };
                    if c.source == S3CredentialsSource::Static {
                        let secret =
                            c.secret_name
                                .as_deref()
                                .ok_or_else(|| RenderError::InvalidField {
                                    field: format!("{cfield}.secretName"),
                                    message: "required with source static".to_owned(),
                                })?;
                        out.access_key_id = Some(creds.value(
                            &format!("{cfield}.accessKeyIdKey"),
                            secret,
                            c.access_key_id_key(),
                        )?);
                        out.secret_access_key = Some(creds.value(
                            &format!("{cfield}.secretAccessKeyKey"),
                            secret,
                            c.secret_access_key_key(),
                        )?);
                        if let Some(k) = c.session_token_key.as_deref() {
                            out.session_token = Some(creds.value(
                                &format!("{cfield}.sessionTokenKey"),
                                secret,
                                k,
                            )?);
                        }
                    }
                    Some(out)
                }
            };
            entry.s3 = Some(S3 {
                bucket: s3.bucket.clone(),
                key: s3.key.clone(),
                region: s3.region.clone(),
                endpoint: s3.endpoint.clone(),
                credentials,
            });
        }
    }
    Ok(entry)
}

fn source_auth(
    auth: &BundleAuth,
    field: &str,
    creds: &mut Credentials<'_>,
) -> Result<SourceAuth, RenderError> {
    let secret = auth.secret_name.as_str();
    Ok(match auth.r#type {
        BundleAuthType::Token => SourceAuth {
            type_: auth.r#type.as_str(),
            username: None,
            password: None,
            token: Some(creds.value(&format!("{field}.tokenKey"), secret, auth.token_key())?),
        },
        BundleAuthType::Basic => SourceAuth {
            type_: auth.r#type.as_str(),
            username: Some(creds.value(
                &format!("{field}.usernameKey"),
                secret,
                auth.username_key(),
            )?),
            password: Some(creds.value(
                &format!("{field}.passwordKey"),
                secret,
                auth.password_key(),
            )?),
            token: None,
        },
    })
}

/// The TLS section, or `None` without `spec.tls`.
fn tls(spec: &HaltSQLServerSpec) -> Option<Tls> {
    let t = spec.tls.as_ref()?;
    let verifies_clients = matches!(
        t.client_auth,
        Some(ClientAuth::Optional | ClientAuth::Required)
    );
    Some(Tls {
        cert_file: format!("{TLS_DIR}/tls.crt"),
        key_file: format!("{TLS_DIR}/tls.key"),
        client_ca_file: verifies_clients.then(|| format!("{TLS_DIR}/ca.crt")),
        client_auth: t.client_auth.map(ClientAuth::as_str),
        min_version: t.min_version.map(|v| v.as_str()),
    })
}

/// The `server.auth` section: tokens (their hashes mounted), OIDC
/// providers and mTLS identities, with Secret placeholders substituted.
fn auth(spec: &HaltSQLServerSpec, mounts: &mut SecretMounts) -> Result<Auth, RenderError> {
    let tokens = spec
        .tokens()
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let r = &t.sha256_secret_ref;
            Ok(Token {
                name: t.name.clone(),
                policy: t.policy.clone(),
                sha256: mounts.mount(
                    &format!("spec.auth.tokens[{i}].sha256SecretRef"),
                    &r.name,
                    &r.key,
                )?,
            })
        })
        .collect::<Result<Vec<_>, RenderError>>()?;
    let auth_spec = spec.auth.as_ref();
    let oidc = auth_spec
        .and_then(|a| a.oidc.as_ref())
        .map(|list| {
            list.iter()
                .enumerate()
                .map(|(i, o)| substitute_object(o, &format!("spec.auth.oidc[{i}]"), mounts))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let mtls = auth_spec
        .and_then(|a| a.mtls.as_ref())
        .and_then(|m| m.identities.as_ref())
        .map(|list| {
            list.iter()
                .enumerate()
                .map(|(i, o)| {
                    substitute_object(o, &format!("spec.auth.mtls.identities[{i}]"), mounts)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .map(|identities| Mtls { identities });
    Ok(Auth {
        allow_unauthenticated: spec.allow_unauthenticated(),
        tokens,
        oidc,
        mtls,
    })
}

/// Builds the document from the server spec and the `policies[]` entries
/// (already rendered), mounting every Secret key it refers to.
pub(crate) fn config_doc(
    spec: &HaltSQLServerSpec,
    policies: Vec<PolicyEntry>,
    mounts: &mut SecretMounts,
) -> Result<ConfigDoc, RenderError> {
    let config = spec.config.as_ref();
    let raw = |section: Option<&crate::api::RawObject>,
               field: &str,
               mounts: &mut SecretMounts|
     -> Result<Option<Value>, RenderError> {
        section
            .map(|s| substitute_object(s, field, mounts))
            .transpose()
    };

    let auth = auth(spec, mounts)?;
    let admin = raw(
        config.and_then(|c| c.admin.as_ref()),
        "spec.config.admin",
        mounts,
    )?;
    let server = ServerSection {
        listen: LISTEN,
        health_listen: spec.tls.is_some().then_some(HEALTH_LISTEN),
        tls: tls(spec),
        auth: Some(auth),
        admin,
    };

    let logging = config.and_then(|c| {
        (c.log_level.is_some() || c.log_format.is_some()).then(|| Logging {
            level: c.log_level.map(|l| l.as_str()),
            format: c.log_format.map(|f| f.as_str()),
        })
    });
    let sinks = spec
        .audit_sinks_or_default()
        .iter()
        .enumerate()
        .map(|(i, s)| substitute_object(s, &format!("spec.audit.sinks[{i}]"), mounts))
        .collect::<Result<Vec<_>, _>>()?;
    if sinks.is_empty() {
        return Err(RenderError::InvalidField {
            field: "spec.audit.sinks".to_owned(),
            message: "must list at least one sink (every decision is audited); leave it unset for [{type: stdout}]".to_owned(),
        });
    }

    Ok(ConfigDoc {
        api_version: "haltsql.dev/v1",
        kind: "Config",
        server,
        policies,
        default_policy: config.and_then(|c| c.default_policy.clone()),
        // Rollouts deliver changes, so all replicas switch together.
        reload: Reload { watch: false },
        limits: config
            .and_then(|c| c.max_request_bytes)
            .map(|max_request_bytes| Limits { max_request_bytes }),
        logging,
        telemetry: raw(
            config.and_then(|c| c.telemetry.as_ref()),
            "spec.config.telemetry",
            mounts,
        )?,
        opa: raw(
            config.and_then(|c| c.opa.as_ref()),
            "spec.config.opa",
            mounts,
        )?,
        secrets: raw(
            config.and_then(|c| c.secrets.as_ref()),
            "spec.config.secrets",
            mounts,
        )?,
        audit: Some(Audit {
            log_raw_sql: spec.audit_log_raw_sql(),
            sinks,
        }),
    })
}

/// Serializes a document as YAML after a header comment.
pub(crate) fn to_yaml<T: Serialize>(
    header: &str,
    doc: &T,
    what: &str,
) -> Result<String, RenderError> {
    let body = serde_yaml::to_string(doc).map_err(|e| RenderError::Serialize {
        what: what.to_owned(),
        message: e.to_string(),
    })?;
    Ok(format!("{header}{body}"))
}
