//! The server Deployment: restricted-level pod security, the config, Secret,
//! TLS and cache volumes, probes and a surge-only rolling update.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    HTTPGetAction, KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, SeccompProfile, SecretProjection, SecretVolumeSource, SecurityContext,
    Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::config::{BUNDLE_CACHE_DIR, TLS_DIR};
use super::objects::{
    CONFIG_CHECKSUM_ANNOTATION, CONFIG_HASH_LABEL, CONFIG_KEY, ServerRef, common_labels,
    config_hash, selector_labels,
};
use super::secrets::{SECRETS_DIR, SecretMounts};
use crate::api::{ClientAuth, HaltSQLServerSpec};

/// The container's name.
pub const CONTAINER_NAME: &str = "haltsql";
/// Where the ConfigMap is mounted.
pub const CONFIG_DIR: &str = "/etc/haltsql";
/// The API port (named `http`).
pub const HTTP_PORT: i32 = 8080;
/// The plain-HTTP health port with TLS (named `health`).
pub const HEALTH_PORT: i32 = 8081;
/// uid and gid of the server (the distroless `nonroot` user).
pub const RUN_AS: i64 = 65532;
/// Old ReplicaSets the Deployment keeps (and with them their ConfigMaps).
pub const REVISION_HISTORY_LIMIT: i32 = 3;
/// Mode of mounted Secret files: readable by the owner and the pod's
/// fsGroup only.
const SECRET_FILE_MODE: i32 = 0o440;

/// The keys mounted from the TLS Secret.
pub fn tls_keys(spec: &HaltSQLServerSpec) -> Vec<&'static str> {
    match &spec.tls {
        None => Vec::new(),
        Some(t) => {
            let mut keys = vec!["tls.crt", "tls.key"];
            if matches!(
                t.client_auth,
                Some(ClientAuth::Optional | ClientAuth::Required)
            ) {
                keys.push("ca.crt");
            }
            keys
        }
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

fn probe(path: &str, port: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String(port.to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

/// The projected volume of every referenced Secret key, one
/// `<secret>/<key>` file each. `None` when no key is referenced.
fn secrets_volume(mounts: &SecretMounts) -> Option<Volume> {
    if mounts.is_empty() {
        return None;
    }
    let mut by_secret: BTreeMap<&str, Vec<KeyToPath>> = BTreeMap::new();
    for (secret, key) in mounts.iter() {
        by_secret.entry(secret).or_default().push(KeyToPath {
            key: key.clone(),
            path: format!("{secret}/{key}"),
            ..Default::default()
        });
    }
    Some(Volume {
        name: "secrets".to_owned(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(SECRET_FILE_MODE),
            sources: Some(
                by_secret
                    .into_iter()
                    .map(|(secret, items)| VolumeProjection {
                        secret: Some(SecretProjection {
                            name: secret.to_owned(),
                            items: Some(items),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }),
        ..Default::default()
    })
}

/// What the pod template mounts: the configuration, the Secret keys, TLS,
/// the bundle cache and a writable `/tmp`.
struct Mounts {
    volumes: Vec<Volume>,
    volume_mounts: Vec<VolumeMount>,
}

impl Mounts {
    fn add(&mut self, volume: Volume, path: &str, read_only: bool) {
        self.volume_mounts
            .push(mount(&volume.name, path, read_only));
        self.volumes.push(volume);
    }
}

fn pod_mounts(
    spec: &HaltSQLServerSpec,
    config_map: &str,
    secrets: &SecretMounts,
    has_bundles: bool,
) -> Mounts {
    let mut mounts = Mounts {
        volumes: Vec::new(),
        volume_mounts: Vec::new(),
    };
    let config = Volume {
        name: "config".to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    };
    mounts.add(config, CONFIG_DIR, true);
    if let Some(v) = secrets_volume(secrets) {
        mounts.add(v, SECRETS_DIR, true);
    }
    if let Some(t) = spec.tls.as_ref() {
        let tls = Volume {
            name: "tls".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(t.secret_name.clone()),
                default_mode: Some(SECRET_FILE_MODE),
                items: Some(
                    tls_keys(spec)
                        .into_iter()
                        .map(|k| KeyToPath {
                            key: k.to_owned(),
                            path: k.to_owned(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        mounts.add(tls, TLS_DIR, true);
    }
    if has_bundles {
        // One shared emptyDir; each bundle's cache_dir is a subfolder.
        mounts.add(empty_dir("bundle-cache"), BUNDLE_CACHE_DIR, false);
    }
    // The root file system is read-only.
    mounts.add(empty_dir("tmp"), "/tmp", false);
    mounts
}

/// The restricted-level container security context.
fn container_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `haltsql serve` container.
fn container(spec: &HaltSQLServerSpec, volume_mounts: Vec<VolumeMount>) -> Container {
    let tls = spec.tls.is_some();
    let probe_port = if tls { "health" } else { "http" };
    let mut ports = vec![ContainerPort {
        name: Some("http".to_owned()),
        container_port: HTTP_PORT,
        protocol: Some("TCP".to_owned()),
        ..Default::default()
    }];
    if tls {
        ports.push(ContainerPort {
            name: Some("health".to_owned()),
            container_port: HEALTH_PORT,
            protocol: Some("TCP".to_owned()),
            ..Default::default()
        });
    }
    Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(spec.image.clone()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_owned()),
        args: Some(vec![
            "serve".to_owned(),
            "--config".to_owned(),
            format!("{CONFIG_DIR}/{CONFIG_KEY}"),
        ]),
        ports: Some(ports),
        env: spec.env.clone().filter(|e| !e.is_empty()),
        resources: Some(spec.resources_or_default()),
        security_context: Some(container_security_context()),
        liveness_probe: Some(probe("/healthz", probe_port, 10)),
        readiness_probe: Some(probe("/readyz", probe_port, 5)),
        volume_mounts: Some(volume_mounts),
        ..Default::default()
    }
}

/// The pod template: the container, its volumes, the user's scheduling
/// fields, and the labels and annotations that tie it to its configuration.
fn pod_template(
    srv: &ServerRef<'_>,
    config_map: &str,
    checksum: &str,
    secrets: &SecretMounts,
    has_bundles: bool,
) -> PodTemplateSpec {
    let spec = srv.spec;
    let Mounts {
        volumes,
        volume_mounts,
    } = pod_mounts(spec, config_map, secrets, has_bundles);

    // User labels first, so the operator's labels win.
    let mut pod_labels = spec.pod_labels.clone().unwrap_or_default();
    pod_labels.extend(common_labels(srv.name));
    // Which ConfigMap this template mounts, readable from its ReplicaSets'
    // labels (metadata only): old ConfigMaps are deleted once no ReplicaSet
    // carries their hash.
    pod_labels.insert(
        CONFIG_HASH_LABEL.to_owned(),
        config_hash(checksum).to_owned(),
    );
    let mut pod_annotations = spec.pod_annotations.clone().unwrap_or_default();
    pod_annotations.insert(CONFIG_CHECKSUM_ANNOTATION.to_owned(), checksum.to_owned());

    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(pod_annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            service_account_name: spec.service_account_name.clone(),
            automount_service_account_token: Some(spec.automount_service_account_token()),
            image_pull_secrets: spec.image_pull_secrets.clone().filter(|s| !s.is_empty()),
            node_selector: spec.node_selector.clone().filter(|s| !s.is_empty()),
            tolerations: spec.tolerations.clone().filter(|s| !s.is_empty()),
            affinity: spec.affinity.clone(),
            topology_spread_constraints: spec
                .topology_spread_constraints
                .clone()
                .filter(|s| !s.is_empty()),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(RUN_AS),
                run_as_group: Some(RUN_AS),
                // Group-owns the mounted Secret files (mode 0440).
                fs_group: Some(RUN_AS),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![container(spec, volume_mounts)],
            volumes: Some(volumes),
            ..Default::default()
        }),
    }
}

/// The Deployment `<server>`. The rollout deadline is its own progress
/// deadline, so the Deployment controller reports a stalled rollout even
/// while the operator is down (`None`: Kubernetes' default).
pub(crate) fn deployment(
    srv: &ServerRef<'_>,
    config_map: &str,
    checksum: &str,
    secrets: &SecretMounts,
    has_bundles: bool,
    rollout_deadline: Option<Duration>,
) -> Deployment {
    Deployment {
        metadata: srv.meta(srv.name.to_owned(), BTreeMap::new()),
        spec: Some(DeploymentSpec {
            replicas: Some(srv.spec.replicas_or_default()),
            // Each old ReplicaSet keeps its ConfigMap alive; a few are enough
            // for `kubectl rollout undo`.
            revision_history_limit: Some(REVISION_HISTORY_LIMIT),
            selector: LabelSelector {
                match_labels: Some(selector_labels(srv.name)),
                ..Default::default()
            },
            // A ready pod is never removed before its replacement is ready.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: pod_template(srv, config_map, checksum, secrets, has_bundles),
            progress_deadline_seconds: rollout_deadline
                .map(|d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX)),
            ..Default::default()
        }),
        ..Default::default()
    }
}
