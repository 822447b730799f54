//! `HaltSQLPolicy`: one haltsql policy, inline or as a signed bundle.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::spec_error::SpecError;

/// Largest inline policy document, in bytes (256 KiB).
pub const MAX_POLICY_BYTES: usize = 256 * 1024;
/// Default of `spec.bundleSource.pollIntervalSeconds`.
pub const DEFAULT_POLL_INTERVAL_SECONDS: i32 = 60;
/// Smallest `spec.bundleSource.pollIntervalSeconds`.
pub const MIN_POLL_INTERVAL_SECONDS: i32 = 10;
/// Largest `spec.bundleSource.pollIntervalSeconds` (one day).
pub const MAX_POLL_INTERVAL_SECONDS: i32 = 86_400;
/// Default Secret key of a bearer token (`auth.tokenKey`).
pub const DEFAULT_TOKEN_KEY: &str = "token";
/// Default Secret key of a user name (`auth.usernameKey`).
pub const DEFAULT_USERNAME_KEY: &str = "username";
/// Default Secret key of a password (`auth.passwordKey`).
pub const DEFAULT_PASSWORD_KEY: &str = "password";
/// Default Secret key of an AWS access key id (`credentials.accessKeyIdKey`).
pub const DEFAULT_ACCESS_KEY_ID_KEY: &str = "access_key_id";
/// Default Secret key of an AWS secret access key (`credentials.secretAccessKeyKey`).
pub const DEFAULT_SECRET_ACCESS_KEY_KEY: &str = "secret_access_key";

/// One haltsql policy for HaltSQLServers in the same namespace: either an
/// inline policy document (`policy`) or a signed bundle that the servers fetch
/// themselves (`bundleSource`). Exactly one of the two must be set. The
/// operator validates the policy with `haltsql validate` and reports the
/// `Valid` and `Synced` conditions.
// `printcolumn(...)` entries repeat `type_ = ...`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "haltsql.dev",
    version = "v1alpha1",
    kind = "HaltSQLPolicy",
    plural = "haltsqlpolicies",
    singular = "haltsqlpolicy",
    namespaced,
    status = "HaltSQLPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "hsp",
    category = "haltsql",
    doc = "A haltsql policy (inline document or signed bundle) that HaltSQLServers in the same namespace load.",
    printcolumn(
        name = "Policy",
        type_ = "string",
        json_path = ".status.policyName",
        description = "metadata.name inside the policy document: the name servers, tokens and defaultPolicy refer to"
    ),
    printcolumn(
        name = "Valid",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Valid")].status"#,
        description = "Whether the current generation passed haltsql validate"
    ),
    printcolumn(
        name = "Synced",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Synced")].status"#,
        description = "Whether every referencing HaltSQLServer has rolled out this content"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.policy) != has(self.bundleSource)")
    .message("exactly one of spec.policy or spec.bundleSource must be set"))]
pub struct HaltSQLPolicySpec {
    /// A complete haltsql policy document (`apiVersion: haltsql.dev/v1`,
    /// `kind: Policy`) as YAML or JSON, at most 256 KiB. Servers, tokens and
    /// `defaultPolicy` refer to it by the document's `metadata.name` (shown in
    /// `status.policyName`), not by the name of this object. A `catalog` must
    /// be written inline: a catalog file reference cannot be resolved and is
    /// reported as `Valid=False`, reason `InvalidSpec`. Mutually exclusive
    /// with `bundleSource`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 262144")
        .message("the policy document must be at most 256 KiB (262144 bytes)"))]
    pub policy: Option<String>,

    /// A signed policy bundle that the servers fetch and verify themselves
    /// (from OCI, HTTPS or S3), instead of an inline `policy`. The operator
    /// validates the source settings, not the bundle content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_source: Option<BundleSource>,
}

/// Where the signed bundle comes from: exactly one of `oci`, `https` or `s3`,
/// and the keys its signature is verified with. GCS is not supported.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = reject_gcs_property)]
#[x_kube(
    validation = Rule::new("(has(self.oci) ? 1 : 0) + (has(self.https) ? 1 : 0) + (has(self.s3) ? 1 : 0) == 1")
        .message("bundleSource needs exactly one of oci, https or s3"),
    validation = Rule::new("!has(self.gcs)")
        .message("GCS bundle sources are not supported (haltsql has no gcs bundle source); use oci, https or s3")
        .field_path(".gcs")
)]
pub struct BundleSource {
    /// An OCI artifact in a registry. Mutually exclusive with `https` and `s3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSource>,

    /// A bundle at an HTTPS URL. Mutually exclusive with `oci` and `s3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<HttpsSource>,

    /// An S3 (or S3-compatible) object. Mutually exclusive with `oci` and
    /// `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Source>,

    /// Trusted ed25519 public keys, each as inline PEM or as the base64 of
    /// the 32 raw key bytes. Required and non-empty: the bundle signature is
    /// always verified.
    #[schemars(length(min = 1), inner(length(min = 1)))]
    pub public_keys: Vec<String>,

    /// Prepended to the names of the bundle's policies (for example `prod.`).
    /// When every bundle carries a prefix, token and default-policy references
    /// are checked against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,

    /// How often the servers poll the source for a new bundle, in seconds:
    /// 10 to 86400. Defaults to 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        range(min = MIN_POLL_INTERVAL_SECONDS, max = MAX_POLL_INTERVAL_SECONDS),
        extend("default" = DEFAULT_POLL_INTERVAL_SECONDS)
    )]
    pub poll_interval_seconds: Option<i32>,
}

/// Adds the `gcs` property to the `bundleSource` schema, so that setting it is
/// rejected with a readable message instead of being pruned or reported as an
/// unknown field.
fn reject_gcs_property(schema: &mut schemars::Schema) {
    if let Some(properties) = schema
        .ensure_object()
        .entry("properties")
        .or_insert_with(|| serde_json::Value::Object(Default::default()))
        .as_object_mut()
    {
        properties.insert(
            "gcs".to_owned(),
            serde_json::json!({
                "description": "Not supported: haltsql has no gcs bundle source. Any value is rejected; use oci, https or s3.",
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true
            }),
        );
    }
}

/// An OCI artifact holding the bundle.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OciSource {
    /// The artifact reference, `registry/repository:tag` or
    /// `registry/repository@sha256:<digest>`.
    #[schemars(length(min = 1))]
    pub r#ref: String,

    /// Talk plain HTTP to the registry. haltsql accepts this only for loopback
    /// registries. Defaults to false.
    #[serde(default, rename = "plainHTTP", skip_serializing_if = "Option::is_none")]
    pub plain_http: Option<bool>,

    /// Registry credentials from a Secret in the same namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<BundleAuth>,
}

/// A bundle at an HTTPS URL.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpsSource {
    /// The `https://` URL of the bundle.
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('https://')").message("url must start with https://"))]
    pub url: String,

    /// Credentials from a Secret in the same namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<BundleAuth>,
}

/// Credentials for an OCI registry or an HTTPS server, read by the server
/// pods from a Secret in the same namespace (the operator never reads it).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type == 'token' ? !has(self.usernameKey) && !has(self.passwordKey) : !has(self.tokenKey)")
    .message("tokenKey goes with type token; usernameKey and passwordKey go with type basic"))]
pub struct BundleAuth {
    /// `token` (a bearer token) or `basic` (user name and password).
    pub r#type: BundleAuthType,

    /// The Secret holding the credentials.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// For `type: token`: the Secret key holding the token. Defaults to
    /// `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub token_key: Option<String>,

    /// For `type: basic`: the Secret key holding the user name. Defaults to
    /// `username`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub username_key: Option<String>,

    /// For `type: basic`: the Secret key holding the password. Defaults to
    /// `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub password_key: Option<String>,
}

/// Kind of bundle source credentials.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BundleAuthType {
    /// A bearer token.
    #[default]
    Token,
    /// HTTP basic authentication.
    Basic,
}

/// An S3 object holding the bundle.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct S3Source {
    /// The bucket.
    #[schemars(length(min = 1))]
    pub bucket: String,

    /// The object key.
    #[schemars(length(min = 1))]
    pub key: String,

    /// The bucket's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,

    /// A custom endpoint URL for S3-compatible storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Where the server gets AWS credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<S3Credentials>,
}

/// AWS credentials of an S3 bundle source.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.source != 'static' || has(self.secretName)")
        .message("credentials with source static need secretName"),
    validation = Rule::new("self.source == 'static' || !(has(self.secretName) || has(self.accessKeyIdKey) || has(self.secretAccessKeyKey) || has(self.sessionTokenKey))")
        .message("secretName and the key names are only used with source static")
)]
pub struct S3Credentials {
    /// `env` (the `AWS_*` variables, set them with `HaltSQLServer.spec.env`),
    /// `static` (keys from the Secret `secretName`), `web_identity` or
    /// `instance`.
    pub source: S3CredentialsSource,

    /// For `source: static`: the Secret holding the keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: Option<String>,

    /// For `source: static`: the Secret key holding the access key id.
    /// Defaults to `access_key_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub access_key_id_key: Option<String>,

    /// For `source: static`: the Secret key holding the secret access key.
    /// Defaults to `secret_access_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_access_key_key: Option<String>,

    /// For `source: static`: the Secret key holding a session token.
    /// Optional; no session token when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub session_token_key: Option<String>,
}

/// Where an S3 bundle source gets its AWS credentials.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum S3CredentialsSource {
    /// The `AWS_*` environment variables of the server container.
    #[default]
    #[serde(rename = "env")]
    Env,
    /// Keys from a Secret.
    #[serde(rename = "static")]
    Static,
    /// A web identity token (for example IRSA).
    #[serde(rename = "web_identity")]
    WebIdentity,
    /// The instance metadata service.
    #[serde(rename = "instance")]
    Instance,
}

impl S3CredentialsSource {
    /// The value as written in the spec and in haltsql's config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Env => "env",
            Self::Static => "static",
            Self::WebIdentity => "web_identity",
            Self::Instance => "instance",
        }
    }
}

impl BundleAuthType {
    /// The value as written in the spec and in haltsql's config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Token => "token",
            Self::Basic => "basic",
        }
    }
}

/// Observed state of a HaltSQLPolicy, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HaltSQLPolicyStatus {
    /// The generation of the spec that the `Valid` condition refers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `metadata.name` inside the policy document: the name that servers,
    /// tokens, OIDC providers and `defaultPolicy` use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_name: Option<String>,

    /// SHA-256 (lower-case hex) of the validated content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hash: Option<String>,

    /// `Valid` (reasons `Validated`, `ValidationFailed`, `InvalidSpec`,
    /// `ValidatorError`) and `Synced` (reasons `Synced`, `RollingOut`,
    /// `NotReferenced`, `NotValid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The two forms of a policy, borrowed from the spec.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PolicySource<'a> {
    /// `spec.policy`: an inline policy document.
    Inline(&'a str),
    /// `spec.bundleSource`: a signed bundle.
    Bundle(&'a BundleSource),
}

/// The three bundle locations, borrowed from the spec.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BundleLocation<'a> {
    /// `oci`
    Oci(&'a OciSource),
    /// `https`
    Https(&'a HttpsSource),
    /// `s3`
    S3(&'a S3Source),
}

impl HaltSQLPolicySpec {
    /// The policy's source. Errors when neither or both are set (the API
    /// server rejects that; objects built in code may still carry it).
    pub fn source(&self) -> Result<PolicySource<'_>, SpecError> {
        match (&self.policy, &self.bundle_source) {
            (Some(policy), None) => Ok(PolicySource::Inline(policy)),
            (None, Some(bundle)) => Ok(PolicySource::Bundle(bundle)),
            _ => Err(SpecError::PolicySource),
        }
    }
}

impl BundleSource {
    /// `pollIntervalSeconds`, defaulted to 60.
    pub fn poll_interval_seconds(&self) -> i32 {
        self.poll_interval_seconds
            .unwrap_or(DEFAULT_POLL_INTERVAL_SECONDS)
    }

    /// The one location that is set. Errors when not exactly one is.
    pub fn location(&self) -> Result<BundleLocation<'_>, SpecError> {
        match (&self.oci, &self.https, &self.s3) {
            (Some(oci), None, None) => Ok(BundleLocation::Oci(oci)),
            (None, Some(https), None) => Ok(BundleLocation::Https(https)),
            (None, None, Some(s3)) => Ok(BundleLocation::S3(s3)),
            _ => Err(SpecError::BundleLocation),
        }
    }
}

impl BundleAuth {
    /// `tokenKey`, defaulted to `token`.
    pub fn token_key(&self) -> &str {
        self.token_key.as_deref().unwrap_or(DEFAULT_TOKEN_KEY)
    }

    /// `usernameKey`, defaulted to `username`.
    pub fn username_key(&self) -> &str {
        self.username_key.as_deref().unwrap_or(DEFAULT_USERNAME_KEY)
    }

    /// `passwordKey`, defaulted to `password`.
    pub fn password_key(&self) -> &str {
        self.password_key.as_deref().unwrap_or(DEFAULT_PASSWORD_KEY)
    }
}

impl S3Credentials {
    /// `accessKeyIdKey`, defaulted to `access_key_id`.
    pub fn access_key_id_key(&self) -> &str {
        self.access_key_id_key
            .as_deref()
            .unwrap_or(DEFAULT_ACCESS_KEY_ID_KEY)
    }

    /// `secretAccessKeyKey`, defaulted to `secret_access_key`.
    pub fn secret_access_key_key(&self) -> &str {
        self.secret_access_key_key
            .as_deref()
            .unwrap_or(DEFAULT_SECRET_ACCESS_KEY_KEY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUNDLE: &str = r#"
bundleSource:
  oci:
    ref: ghcr.io/corp/haltsql-policies:prod
    plainHTTP: false
    auth: { type: basic, secretName: registry-credentials }
  publicKeys: ["k"]
  namePrefix: prod.
"#;

    fn spec(yaml: &str) -> HaltSQLPolicySpec {
        match serde_yaml::from_str(yaml) {
            Ok(spec) => spec,
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn bundle_source_reads_with_defaults() {
        let spec = spec(BUNDLE);
        let Ok(PolicySource::Bundle(bundle)) = spec.source() else {
            panic!("not a bundle: {spec:?}")
        };
        assert_eq!(bundle.poll_interval_seconds(), 60);
        let Ok(BundleLocation::Oci(oci)) = bundle.location() else {
            panic!("not oci")
        };
        assert_eq!(oci.plain_http, Some(false));
        let auth = oci.auth.as_ref();
        assert_eq!(auth.map(|a| a.r#type), Some(BundleAuthType::Basic));
        assert_eq!(auth.map(|a| a.username_key()), Some("username"));
        assert_eq!(auth.map(|a| a.password_key()), Some("password"));
        assert_eq!(auth.map(|a| a.token_key()), Some("token"));
        let back = serde_json::to_value(&spec).unwrap_or_default();
        assert_eq!(back["bundleSource"]["oci"]["plainHTTP"], false);
        assert!(back["bundleSource"].get("pollIntervalSeconds").is_none());
    }

    #[test]
    fn inline_policy_and_bad_combinations() {
        assert_eq!(
            spec("policy: 'kind: Policy'").source(),
            Ok(PolicySource::Inline("kind: Policy"))
        );
        assert_eq!(spec("{}").source(), Err(SpecError::PolicySource));
        let both = HaltSQLPolicySpec {
            policy: Some("x".into()),
            bundle_source: Some(BundleSource::default()),
        };
        assert_eq!(both.source(), Err(SpecError::PolicySource));
        assert_eq!(
            BundleSource::default().location(),
            Err(SpecError::BundleLocation)
        );
    }

    #[test]
    fn s3_credentials_defaults() {
        let creds = S3Credentials {
            source: S3CredentialsSource::Static,
            secret_name: Some("aws".into()),
            ..Default::default()
        };
        assert_eq!(creds.access_key_id_key(), "access_key_id");
        assert_eq!(creds.secret_access_key_key(), "secret_access_key");
        assert_eq!(creds.session_token_key, None);
        assert_eq!(
            serde_json::to_value(S3CredentialsSource::WebIdentity).ok(),
            Some(serde_json::json!("web_identity"))
        );
    }
}
