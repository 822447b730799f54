//! `HaltSQLServer`: a haltsql-server Deployment loading a set of policies.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::free_form::{RawObject, free_form_object, free_form_object_list};
use super::spec_error::SpecError;

/// Default of `spec.replicas`.
pub const DEFAULT_REPLICAS: i32 = 2;
/// Default of `spec.service.port`, also the container's API port.
pub const DEFAULT_SERVICE_PORT: i32 = 8080;
/// Default CPU request of the server container.
pub const DEFAULT_CPU_REQUEST: &str = "100m";
/// Default memory request of the server container.
pub const DEFAULT_MEMORY_REQUEST: &str = "64Mi";
/// Default memory limit of the server container.
pub const DEFAULT_MEMORY_LIMIT: &str = "256Mi";
/// Default `minAvailable` of an enabled PodDisruptionBudget.
pub const DEFAULT_PDB_MIN_AVAILABLE: i32 = 1;
/// Most policies one server may reference.
pub const MAX_POLICIES: usize = 256;

/// A haltsql-server Deployment that loads a set of HaltSQLPolicy objects. The
/// operator renders the configuration into a ConfigMap and creates the
/// Deployment, Service and, when enabled, a PodDisruptionBudget and a
/// NetworkPolicy; it rolls the pods when the configuration changes.
// `printcolumn(...)` entries repeat `type_ = ...`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "haltsql.dev",
    version = "v1alpha1",
    kind = "HaltSQLServer",
    plural = "haltsqlservers",
    singular = "haltsqlserver",
    namespaced,
    status = "HaltSQLServerStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "hss",
    category = "haltsql",
    doc = "A haltsql-server Deployment that loads a set of HaltSQLPolicy objects from its namespace.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Desired pods"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Ready pods"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].reason"#,
        description = "Reason of the Ready condition"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.auth) || !has(self.auth.mtls) || !has(self.auth.mtls.identities) || size(self.auth.mtls.identities) == 0 || (has(self.tls) && has(self.tls.clientAuth) && self.tls.clientAuth != 'none')")
    .message("auth.mtls.identities need tls with clientAuth optional or required"))]
pub struct HaltSQLServerSpec {
    /// Number of server pods. Defaults to 2. The resource has a scale
    /// subresource, so `kubectl scale` and HorizontalPodAutoscalers work on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), extend("default" = DEFAULT_REPLICAS))]
    pub replicas: Option<i32>,

    /// The haltsql image, for example `ghcr.io/haltsql/haltsql:0.0.1`. Pin a
    /// digest in production.
    #[schemars(length(min = 1))]
    pub image: String,

    /// Pull policy of the image: `Always`, `IfNotPresent` or `Never`. The
    /// Kubernetes default applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets in the same namespace used to pull the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// The HaltSQLPolicy objects (by object name, in the same namespace) that
    /// the server loads: 1 to 256, no duplicates.
    #[schemars(length(min = 1, max = MAX_POLICIES))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub policies: Vec<PolicyReference>,

    /// haltsql settings rendered into the server's `config.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ServerConfig>,

    /// Who may call the server: bearer tokens, OIDC providers, mTLS
    /// identities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<ServerAuth>,

    /// Built-in TLS for the API port. Unset: plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,

    /// The audit log of verify decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditSpec>,

    /// Extra environment variables of the server container, for example
    /// `AWS_*` from a Secret, used by `${env:...}` placeholders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub env: Option<Vec<EnvVar>>,

    /// Resources of the server container. Defaults to 100m CPU and 64Mi
    /// memory requested and a 256Mi memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {
        "requests": {"cpu": DEFAULT_CPU_REQUEST, "memory": DEFAULT_MEMORY_REQUEST},
        "limits": {"memory": DEFAULT_MEMORY_LIMIT}
    }))]
    pub resources: Option<ResourceRequirements>,

    /// ServiceAccount of the server pods. Defaults to the namespace's
    /// `default` ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,

    /// Mount a ServiceAccount token into the server pods. Defaults to false;
    /// set it to true for Vault Kubernetes auth or IRSA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub automount_service_account_token: Option<bool>,

    /// Extra annotations of the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<BTreeMap<String, String>>,

    /// Extra labels of the server pods. The operator's own selector labels
    /// take precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<BTreeMap<String, String>>,

    /// Node labels the server pods must be scheduled on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Tolerations of the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Affinity of the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Topology spread constraints of the server pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,

    /// The Service in front of the server pods (named like the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = {}))]
    pub service: Option<ServiceSpec>,

    /// A PodDisruptionBudget for the server pods (named like the server). Off
    /// unless `enabled` is true. Set at most one of `minAvailable` and
    /// `maxUnavailable`; with neither, `minAvailable` is 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<PodDisruptionBudgetSpec>,

    /// A NetworkPolicy that limits who reaches the API port (named like the
    /// server). Off unless `enabled` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,
}

/// A reference to a HaltSQLPolicy in the same namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReference {
    /// Name of the HaltSQLPolicy object (not the policy document's name).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Image pull policy of the server container.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImagePullPolicy {
    /// Always pull.
    Always,
    /// Pull when not present on the node.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl ImagePullPolicy {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// haltsql settings rendered into the server's `config.yaml`. Raw sections
/// are copied as given; any string in them may be written as
/// `{secretKeyRef: {name, key}}` to use a Secret key, which is then mounted
/// into the pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServerConfig {
    /// `default_policy`: the policy (by the document's `metadata.name`) used
    /// for unauthenticated requests when `allowUnauthenticated` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_policy: Option<String>,

    /// `server.auth.allow_unauthenticated`: serve requests without a token
    /// with `defaultPolicy`. Development only. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_unauthenticated: Option<bool>,

    /// `logging.level`: `error`, `warn`, `info`, `debug` or `trace`. haltsql's
    /// default applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,

    /// `logging.format`: `json` or `text`. haltsql's default applies when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,

    /// `limits.max_request_bytes`: the largest request body, 1024 (1 KiB) to
    /// 16777216 (16 MiB). haltsql's default applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 16777216))]
    pub max_request_bytes: Option<i64>,

    /// `telemetry`, rendered as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub telemetry: Option<RawObject>,

    /// `opa`, rendered as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub opa: Option<RawObject>,

    /// `server.admin`, rendered as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub admin: Option<RawObject>,

    /// `secrets` (haltsql's secret providers), rendered as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub secrets: Option<RawObject>,
}

/// haltsql log level.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Informational messages.
    Info,
    /// Debug messages.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    /// haltsql's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }
}

/// haltsql log format.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

impl LogFormat {
    /// haltsql's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Text => "text",
        }
    }
}

/// Authentication of callers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServerAuth {
    /// Bearer tokens, each pinned to one policy. Names must be unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub tokens: Option<Vec<TokenSpec>>,

    /// `server.auth.oidc` entries (`issuer`, `audience`, `policy` or
    /// `policy_claim`, ...), rendered as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object_list")]
    pub oidc: Option<Vec<RawObject>>,

    /// Client certificate identities. They need `tls` with `clientAuth`
    /// `optional` or `required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls: Option<MtlsSpec>,
}

/// A bearer token whose SHA-256 is kept in a Secret.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TokenSpec {
    /// The token's name, as shown in audit events.
    #[schemars(length(min = 1))]
    pub name: String,

    /// The policy this token uses, by the policy document's `metadata.name`
    /// (see `HaltSQLPolicy.status.policyName`).
    #[schemars(length(min = 1))]
    pub policy: String,

    /// The Secret key holding the lower-case hex SHA-256 of the token. A
    /// trailing newline is ignored.
    pub sha256_secret_ref: SecretKeyRef,
}

/// A key in a Secret of the same namespace. The operator never reads the
/// Secret; it mounts the key into the server pods.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Key in the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Client certificate (mTLS) authentication.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MtlsSpec {
    /// `server.auth.mtls.identities` entries (`subject`, `dns_name` or
    /// `uri`, and `policy`), rendered as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object_list")]
    pub identities: Option<Vec<RawObject>>,
}

/// Built-in TLS from a `kubernetes.io/tls` Secret. With TLS, the probes use a
/// plain-HTTP health port (8081) that serves only `/healthz` and `/readyz`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServerTls {
    /// The `kubernetes.io/tls` Secret holding `tls.crt` and `tls.key`, and
    /// `ca.crt` for verifying client certificates.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// Client certificates: `none`, `optional` or `required`. haltsql's
    /// default (`none`) applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuth>,

    /// Lowest TLS version: `"1.2"` or `"1.3"`. haltsql's default applies when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
}

/// Client certificate mode.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificates.
    None,
    /// Verify a client certificate when one is presented.
    Optional,
    /// Require a valid client certificate.
    Required,
}

impl ClientAuth {
    /// haltsql's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Optional => "optional",
            Self::Required => "required",
        }
    }
}

/// TLS protocol version.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3
    #[serde(rename = "1.3")]
    Tls13,
}

impl TlsVersion {
    /// haltsql's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tls12 => "1.2",
            Self::Tls13 => "1.3",
        }
    }
}

/// The audit log: one event per verify decision.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditSpec {
    /// `audit.sinks` entries (`stdout`, `file`, `s3`, `gcs`, `elasticsearch`,
    /// `kafka`), rendered as given. Defaults to `[{type: stdout}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object_list")]
    pub sinks: Option<Vec<RawObject>>,

    /// `audit.log_raw_sql`: include the raw SQL in audit events (otherwise
    /// only its SHA-256). Defaults to false.
    #[serde(default, rename = "logRawSQL", skip_serializing_if = "Option::is_none")]
    pub log_raw_sql: Option<bool>,
}

/// The Service in front of the server pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// `ClusterIP` (default), `NodePort` or `LoadBalancer`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "ClusterIP"))]
    pub type_: Option<ServiceType>,

    /// The Service port, 1 to 65535. Defaults to 8080.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535), extend("default" = DEFAULT_SERVICE_PORT))]
    pub port: Option<i32>,

    /// Annotations of the Service, for example for a cloud load balancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Type of the server's Service.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServiceType {
    /// A cluster-internal virtual IP.
    #[default]
    ClusterIP,
    /// A port on every node.
    NodePort,
    /// A cloud load balancer.
    LoadBalancer,
}

impl ServiceType {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIP => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

/// A PodDisruptionBudget for the server pods. Off unless `enabled` is true.
/// Set at most one of `minAvailable` and `maxUnavailable`; with neither,
/// `minAvailable` is 1.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.minAvailable) && has(self.maxUnavailable))")
    .message("set at most one of minAvailable and maxUnavailable"))]
pub struct PodDisruptionBudgetSpec {
    /// Create the PodDisruptionBudget. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Pods (a number, or a percentage such as `50%`) that must stay
    /// available during voluntary disruptions. Defaults to 1 when
    /// `maxUnavailable` is not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,

    /// Pods (a number, or a percentage) that may be unavailable during
    /// voluntary disruptions. Mutually exclusive with `minAvailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// A NetworkPolicy for the server pods. Off unless `enabled` is true.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Create the NetworkPolicy. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// The peers that may reach the API port (8080). Empty or unset: any pod
    /// in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_from: Option<Vec<NetworkPolicyPeer>>,
}

/// Observed state of a HaltSQLServer, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HaltSQLServerStatus {
    /// The server generation this status refers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Pods of the Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,

    /// Ready pods of the Deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,

    /// Pods of the Deployment that run the current pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,

    /// Label selector of the server pods, in string form (used by the scale
    /// subresource, for example by HorizontalPodAutoscalers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// Checksum of the last rendered configuration (also on the pod template
    /// as `haltsql.dev/config-checksum`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_checksum: Option<String>,

    /// The policies of the configuration that has fully rolled out (every
    /// replica updated and available).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_policies: Option<Vec<AppliedPolicy>>,

    /// `PoliciesReady`, `ConfigRendered`, `Available`, `Progressing` and
    /// `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// A policy that has fully rolled out on a server.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct AppliedPolicy {
    /// The policy document's `metadata.name` (`HaltSQLPolicy.status.policyName`).
    pub name: String,

    /// The content hash (`HaltSQLPolicy.status.contentHash`) that rolled out.
    pub content_hash: String,
}

/// The PodDisruptionBudget's budget, after defaulting.
#[derive(Clone, Debug, PartialEq)]
pub enum PdbBudget {
    /// `minAvailable`
    MinAvailable(IntOrString),
    /// `maxUnavailable`
    MaxUnavailable(IntOrString),
}

impl HaltSQLServerSpec {
    /// `replicas`, defaulted to 2.
    pub fn replicas_or_default(&self) -> i32 {
        self.replicas.unwrap_or(DEFAULT_REPLICAS)
    }

    /// `resources`, defaulted to 100m CPU and 64Mi memory requested and a
    /// 256Mi memory limit.
    pub fn resources_or_default(&self) -> ResourceRequirements {
        self.resources.clone().unwrap_or_else(default_resources)
    }

    /// `automountServiceAccountToken`, defaulted to false.
    pub fn automount_service_account_token(&self) -> bool {
        self.automount_service_account_token.unwrap_or(false)
    }

    /// `service.type`, defaulted to ClusterIP.
    pub fn service_type(&self) -> ServiceType {
        self.service
            .as_ref()
            .and_then(|s| s.type_)
            .unwrap_or_default()
    }

    /// `service.port`, defaulted to 8080.
    pub fn service_port(&self) -> i32 {
        self.service
            .as_ref()
            .and_then(|s| s.port)
            .unwrap_or(DEFAULT_SERVICE_PORT)
    }

    /// The PodDisruptionBudget to create, if enabled: `minAvailable` 1 when
    /// neither budget is set. Errors when both are set.
    pub fn pdb_budget(&self) -> Result<Option<PdbBudget>, SpecError> {
        let Some(pdb) = self.pod_disruption_budget.as_ref() else {
            return Ok(None);
        };
        if !pdb.enabled.unwrap_or(false) {
            return Ok(None);
        }
        match (&pdb.min_available, &pdb.max_unavailable) {
            (Some(_), Some(_)) => Err(SpecError::PdbBudget),
            (Some(min), None) => Ok(Some(PdbBudget::MinAvailable(min.clone()))),
            (None, Some(max)) => Ok(Some(PdbBudget::MaxUnavailable(max.clone()))),
            (None, None) => Ok(Some(PdbBudget::MinAvailable(IntOrString::Int(
                DEFAULT_PDB_MIN_AVAILABLE,
            )))),
        }
    }

    /// Whether a NetworkPolicy is wanted.
    pub fn network_policy_enabled(&self) -> bool {
        self.network_policy
            .as_ref()
            .and_then(|n| n.enabled)
            .unwrap_or(false)
    }

    /// The allowed NetworkPolicy peers (empty: any pod in the namespace).
    pub fn network_policy_peers(&self) -> &[NetworkPolicyPeer] {
        self.network_policy
            .as_ref()
            .and_then(|n| n.ingress_from.as_deref())
            .unwrap_or(&[])
    }

    /// `config.allowUnauthenticated`, defaulted to false.
    pub fn allow_unauthenticated(&self) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.allow_unauthenticated)
            .unwrap_or(false)
    }

    /// `audit.sinks`, defaulted to `[{type: stdout}]`.
    pub fn audit_sinks_or_default(&self) -> Vec<RawObject> {
        match self.audit.as_ref().and_then(|a| a.sinks.as_ref()) {
            Some(sinks) => sinks.clone(),
            None => vec![default_audit_sink()],
        }
    }

    /// `audit.logRawSQL`, defaulted to false.
    pub fn audit_log_raw_sql(&self) -> bool {
        self.audit
            .as_ref()
            .and_then(|a| a.log_raw_sql)
            .unwrap_or(false)
    }

    /// The bearer tokens (empty when unset).
    pub fn tokens(&self) -> &[TokenSpec] {
        self.auth
            .as_ref()
            .and_then(|a| a.tokens.as_deref())
            .unwrap_or(&[])
    }
}

/// The default container resources: 100m CPU and 64Mi memory requested, 256Mi
/// memory limit.
pub fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(DEFAULT_CPU_REQUEST.to_owned())),
            (
                "memory".to_owned(),
                Quantity(DEFAULT_MEMORY_REQUEST.to_owned()),
            ),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity(DEFAULT_MEMORY_LIMIT.to_owned()),
        )])),
        ..Default::default()
    }
}

/// The default audit sink, `{type: stdout}`.
pub fn default_audit_sink() -> RawObject {
    let mut sink = RawObject::new();
    sink.insert("type".to_owned(), serde_json::Value::from("stdout"));
    sink
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK_START: &str = r#"
replicas: 2
image: ghcr.io/haltsql/haltsql:0.0.1
policies:
  - name: orders
auth:
  tokens:
    - name: orders-agent
      policy: orders-agent
      sha256SecretRef: { name: haltsql-tokens, key: orders-agent.sha256 }
podDisruptionBudget:
  enabled: true
networkPolicy:
  enabled: true
  ingressFrom:
    - podSelector: { matchLabels: { app: orders-agent } }
audit:
  logRawSQL: true
"#;

    fn quick_start() -> HaltSQLServerSpec {
        match serde_yaml::from_str(QUICK_START) {
            Ok(spec) => spec,
            Err(err) => panic!("quick start: {err}"),
        }
    }

    #[test]
    fn quick_start_reads_into_the_types() {
        let spec = quick_start();
        assert_eq!(spec.replicas_or_default(), 2);
        assert_eq!(
            spec.policies,
            [PolicyReference {
                name: "orders".into()
            }]
        );
        assert_eq!(
            spec.tokens()[0].sha256_secret_ref.key,
            "orders-agent.sha256"
        );
        assert!(spec.network_policy_enabled());
        assert_eq!(spec.network_policy_peers().len(), 1);
        assert!(spec.audit_log_raw_sql());
        assert_eq!(
            spec.pdb_budget(),
            Ok(Some(PdbBudget::MinAvailable(IntOrString::Int(1))))
        );
    }

    #[test]
    fn defaults_without_the_api_server() {
        let spec = HaltSQLServerSpec {
            image: "i".into(),
            policies: vec![PolicyReference { name: "p".into() }],
            ..Default::default()
        };
        assert_eq!(spec.replicas_or_default(), 2);
        assert_eq!(spec.service_type(), ServiceType::ClusterIP);
        assert_eq!(spec.service_port(), 8080);
        assert!(!spec.automount_service_account_token());
        assert!(!spec.allow_unauthenticated());
        assert!(!spec.audit_log_raw_sql());
        assert!(!spec.network_policy_enabled());
        assert_eq!(spec.pdb_budget(), Ok(None));
        assert_eq!(spec.audit_sinks_or_default(), vec![default_audit_sink()]);
        let resources = spec.resources_or_default();
        let get = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
            m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone())
        };
        assert_eq!(get(&resources.requests, "cpu").as_deref(), Some("100m"));
        assert_eq!(get(&resources.requests, "memory").as_deref(), Some("64Mi"));
        assert_eq!(get(&resources.limits, "memory").as_deref(), Some("256Mi"));
        assert_eq!(get(&resources.limits, "cpu"), None);
    }

    #[test]
    fn unset_fields_are_not_serialized() {
        let spec = HaltSQLServerSpec {
            image: "i".into(),
            policies: vec![PolicyReference { name: "p".into() }],
            ..Default::default()
        };
        let value = serde_json::to_value(&spec).ok();
        assert_eq!(
            value,
            Some(serde_json::json!({"image": "i", "policies": [{"name": "p"}]}))
        );
        let status = serde_json::to_value(HaltSQLServerStatus::default()).ok();
        assert_eq!(status, Some(serde_json::json!({})));
    }

    #[test]
    fn pdb_budget_choices() {
        let pdb = |min: Option<IntOrString>, max: Option<IntOrString>, enabled: bool| {
            HaltSQLServerSpec {
                pod_disruption_budget: Some(PodDisruptionBudgetSpec {
                    enabled: Some(enabled),
                    min_available: min,
                    max_unavailable: max,
                }),
                ..Default::default()
            }
            .pdb_budget()
        };
        let pct = IntOrString::String("50%".into());
        assert_eq!(pdb(None, Some(pct.clone()), false), Ok(None));
        assert_eq!(
            pdb(None, Some(pct.clone()), true),
            Ok(Some(PdbBudget::MaxUnavailable(pct.clone())))
        );
        assert_eq!(
            pdb(Some(IntOrString::Int(2)), None, true),
            Ok(Some(PdbBudget::MinAvailable(IntOrString::Int(2))))
        );
        assert_eq!(
            pdb(Some(IntOrString::Int(2)), Some(pct), true),
            Err(SpecError::PdbBudget)
        );
    }

    #[test]
    fn wire_names_follow_the_guide() {
        let spec = HaltSQLServerSpec {
            audit: Some(AuditSpec {
                log_raw_sql: Some(true),
                sinks: None,
            }),
            service: Some(ServiceSpec {
                type_: Some(ServiceType::NodePort),
                port: Some(9000),
                annotations: None,
            }),
            tls: Some(ServerTls {
                secret_name: "tls".into(),
                client_auth: Some(ClientAuth::Required),
                min_version: Some(TlsVersion::Tls13),
            }),
            ..Default::default()
        };
        let value = serde_json::to_value(&spec).unwrap_or_default();
        assert_eq!(value["audit"], serde_json::json!({"logRawSQL": true}));
        assert_eq!(
            value["service"],
            serde_json::json!({"type": "NodePort", "port": 9000})
        );
        assert_eq!(
            value["tls"],
            serde_json::json!({"secretName": "tls", "clientAuth": "required", "minVersion": "1.3"})
        );
    }
}
