//! The server pods, reachable from the test: one endpoint per ready pod of the
//! Deployment's current ReplicaSet.
//!
//! - local: kwok pods run no containers, so each ready pod gets a `haltsql
//!   serve` process of its own, started from the pod's volumes as a kubelet
//!   would mount them: the ConfigMap's files and the projected Secret keys
//!   (`/var/run/haltsql/secrets/<secret>/<key>`) are written under a private
//!   root, the config's `${file:...}` placeholders are pointed into that root
//!   and `server.listen` at a free loopback port. Before starting, the files
//!   are checked against the pod's `haltsql.dev/config-checksum`, so a pod
//!   never runs a configuration other than the one it was rolled out with.
//!   A new checksum means new pods, hence new processes; processes of pods
//!   that are gone are stopped.
//! - kind: one `kubectl port-forward pod/<name>` per ready pod.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::cluster::Cluster;
use crate::http;
use crate::provider::PortForward;

pub const CHECKSUM_ANNOTATION: &str = "haltsql.dev/config-checksum";

/// One reachable server pod.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub pod: String,
    pub addr: SocketAddr,
}

/// How pods are reached.
pub enum Backend {
    /// `haltsql serve` processes under `dir`.
    Local { haltsql: PathBuf, dir: PathBuf },
    /// `kubectl port-forward` to the real pods.
    PortForward,
}

enum Running {
    Process { child: Child, log: PathBuf },
    Forward(#[allow(dead_code)] PortForward),
}

struct Instance {
    addr: SocketAddr,
    checksum: String,
    running: Running,
}

pub struct Pods {
    backend: Backend,
    instances: BTreeMap<String, Instance>,
}

impl Pods {
    pub fn new(backend: Backend) -> Self {
        Pods {
            backend,
            instances: BTreeMap::new(),
        }
    }

    /// Waits until exactly `replicas` pods of the current ReplicaSet are ready
    /// and carry `checksum`, makes each reachable, stops the rest, and returns
    /// their endpoints (sorted by pod name).
    pub async fn sync(
        &mut self,
        cluster: &Cluster,
        ns: &str,
        deployment: &str,
        checksum: &str,
        replicas: usize,
        timeout: Duration,
    ) -> Vec<Endpoint> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let outcome = match current_pods(cluster, ns, deployment).await {
                Ok(pods) => {
                    let ready: Vec<&Pod> = pods
                        .iter()
                        .filter(|p| pod_checksum(p) == checksum)
                        .collect();
                    if ready.len() == replicas && pods.len() == replicas {
                        self.reconcile(cluster, ns, &ready).await
                    } else {
                        Err(format!(
                            "{} ready pods of the current ReplicaSet, {} with checksum {checksum}, want {replicas}",
                            pods.len(),
                            ready.len()
                        ))
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(endpoints) => return endpoints,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    panic!("server pods of {ns}/{deployment} not reachable after {timeout:?}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Stops everything (the server is gone).
    pub fn stop_all(&mut self) {
        let names: Vec<String> = self.instances.keys().cloned().collect();
        for name in names {
            self.stop(&name);
        }
    }

    async fn reconcile(
        &mut self,
        cluster: &Cluster,
        ns: &str,
        pods: &[&Pod],
    ) -> Result<Vec<Endpoint>, String> {
        let wanted: BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();
        let gone: Vec<String> = self
            .instances
            .iter()
            .filter(|(name, inst)| {
                !wanted.contains(*name)
                    || pods
                        .iter()
                        .any(|p| &p.name_any() == *name && pod_checksum(p) != inst.checksum)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            self.stop(&name);
        }
        for pod in pods {
            let name = pod.name_any();
            if self.instances.contains_key(&name) {
                continue;
            }
            let instance = match &self.backend {
                Backend::Local { haltsql, dir } => {
                    start_local(cluster, ns, pod, haltsql, &dir.join(&name)).await?
                }
                Backend::PortForward => {
                    let fwd = PortForward::start(cluster, ns, &format!("pod/{name}"), 8080)?;
                    Instance {
                        addr: fwd.addr,
                        checksum: pod_checksum(pod).to_owned(),
                        running: Running::Forward(fwd),
                    }
                }
            };
            wait_ready(instance.addr, &name).await.inspect_err(|_| {
                if let Running::Process { log, .. } = &instance.running {
                    eprintln!("{}", std::fs::read_to_string(log).unwrap_or_default());
                }
            })?;
            self.instances.insert(name, instance);
        }
        // Every process must still run: a config that does not load exits 2.
        for (name, inst) in &mut self.instances {
            if let Running::Process { child, log } = &mut inst.running
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "haltsql serve for pod {name} exited ({status}):\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
        }
        Ok(self
            .instances
            .iter()
            .map(|(pod, i)| Endpoint {
                pod: pod.clone(),
                addr: i.addr,
            })
            .collect())
    }

    fn stop(&mut self, name: &str) {
        if let Some(inst) = self.instances.remove(name)
            && let Running::Process { mut child, .. } = inst.running
        {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            for _ in 0..50 {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        self.stop_all();
    }
}

pub fn pod_checksum(pod: &Pod) -> &str {
    pod.annotations()
        .get(CHECKSUM_ANNOTATION)
        .map(String::as_str)
        .unwrap_or("")
}

fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Deployment's newest ReplicaSet (highest `deployment.kubernetes.io/revision`).
pub async fn current_replica_set(
    cluster: &Cluster,
    ns: &str,
    deployment: &str,
) -> Result<ReplicaSet, String> {
    let deploy = Api::<Deployment>::namespaced(cluster.client.clone(), ns)
        .get(deployment)
        .await
        .map_err(|e| format!("get deployment {deployment}: {e}"))?;
    let uid = deploy.metadata.uid.clone().unwrap_or_default();
    let sets = Api::<ReplicaSet>::namespaced(cluster.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list replicasets: {e}"))?;
    sets.items
        .into_iter()
        .filter(|rs| rs.owner_references().iter().any(|o| o.uid == uid))
        .max_by_key(|rs| {
            rs.annotations()
                .get("deployment.kubernetes.io/revision")
                .and_then(|r| r.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .ok_or_else(|| format!("deployment {deployment} has no ReplicaSet yet"))
}

/// Ready pods of the Deployment's current ReplicaSet.
pub async fn current_pods(
    cluster: &Cluster,
    ns: &str,
    deployment: &str,
) -> Result<Vec<Pod>, String> {
    let rs = current_replica_set(cluster, ns, deployment).await?;
    let rs_uid = rs.metadata.uid.clone().unwrap_or_default();
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.owner_references().iter().any(|o| o.uid == rs_uid))
        .filter(pod_ready)
        .collect())
}

async fn wait_ready(addr: SocketAddr, pod: &str) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..100 {
        match http::get(addr, "/readyz").await {
            Ok(r) if r.status == 200 => return Ok(()),
            Ok(r) => last = format!("/readyz {}: {}", r.status, r.body),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("pod {pod} at {addr} never became ready: {last}"))
}

/// Lays out the pod's volumes under `root` (as a kubelet would mount them),
/// checks them against the pod's checksum and starts `haltsql serve`.
async fn start_local(
    cluster: &Cluster,
    ns: &str,
    pod: &Pod,
    haltsql: &Path,
    root: &Path,
) -> Result<Instance, String> {
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let container = spec.containers.first().ok_or("pod without containers")?;
    let args = container.args.clone().unwrap_or_default();
    let config_path = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1))
        .ok_or_else(|| format!("container args {args:?} have no --config"))?
        .clone();

    let _ = std::fs::remove_dir_all(root);
    let mut config_files: BTreeMap<String, String> = BTreeMap::new();
    let mut mounted: Vec<(String, String)> = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .ok_or_else(|| format!("volume {} is not declared", mount.name))?;
        let dir = under(root, &mount.mount_path);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if let Some(cm) = &volume.config_map {
            let data = Api::<ConfigMap>::namespaced(cluster.client.clone(), ns)
                .get(&cm.name)
                .await
                .map_err(|e| format!("get configmap {}: {e}", cm.name))?
                .data
                .unwrap_or_default();
            for (key, value) in &data {
                write(&dir.join(key), value)?;
            }
            config_files.extend(data);
        }
        if let Some(projected) = &volume.projected {
            for source in projected.sources.iter().flatten() {
                let Some(sref) = &source.secret else { continue };
                let secret = Api::<Secret>::namespaced(cluster.client.clone(), ns)
                    .get(&sref.name)
                    .await
                    .map_err(|e| format!("get secret {}: {e}", sref.name))?;
                let data = secret.data.unwrap_or_default();
                let items: Vec<(String, String)> = match &sref.items {
                    Some(items) => items
                        .iter()
                        .map(|i| (i.key.clone(), i.path.clone()))
                        .collect(),
                    None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
                };
                for (key, path) in items {
                    let value = data
                        .get(&key)
                        .ok_or_else(|| format!("secret {} has no key {key}", sref.name))?;
                    write(&dir.join(&path), &String::from_utf8_lossy(&value.0))?;
                    mounted.push((sref.name.clone(), key));
                }
            }
        }
    }

    let want = pod_checksum(pod).to_owned();
    let have = haltsql_operator::render::checksum::config_checksum(&config_files, &mounted);
    if have != want {
        return Err(format!(
            "pod {}: the mounted ConfigMap and Secret keys have checksum {have}, the pod carries {want}",
            pod.name_any()
        ));
    }

    let port = http::free_port();
    let config_file = under(root, &config_path);
    let text = std::fs::read_to_string(&config_file)
        .map_err(|e| format!("{}: {e}", config_file.display()))?;
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| format!("config.yaml: {e}"))?;
    point_into(&mut config, root);
    let server = config
        .get_mut("server")
        .and_then(|s| s.as_mapping_mut())
        .ok_or("config.yaml has no server section")?;
    server.insert("listen".into(), format!("127.0.0.1:{port}").into());
    if server.contains_key("health_listen") {
        server.insert(
            "health_listen".into(),
            format!("127.0.0.1:{}", http::free_port()).into(),
        );
    }
    write(
        &config_file,
        &serde_yaml::to_string(&config).map_err(|e| e.to_string())?,
    )?;

    let log = root.join("serve.log");
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let child = Command::new(haltsql)
        .arg("serve")
        .arg("--config")
        .arg(&config_file)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("start {}: {e}", haltsql.display()))?;
    Ok(Instance {
        addr: ([127, 0, 0, 1], port).into(),
        checksum: want,
        running: Running::Process { child, log },
    })
}

/// `root` + an absolute in-pod path.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

fn write(path: &Path, content: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::write(path, content).map_err(|e| format!("{}: {e}", path.display()))
}

/// Rewrites every `${file:/abs}` placeholder to `${file:ROOT/abs}`.
fn point_into(value: &mut serde_yaml::Value, root: &Path) {
    match value {
        serde_yaml::Value::String(s) => {
            if let Some(rest) = s.strip_prefix("${file:/") {
                *s = format!("${{file:{}/{rest}", root.display());
            }
        }
        serde_yaml::Value::Sequence(items) => items.iter_mut().for_each(|v| point_into(v, root)),
        serde_yaml::Value::Mapping(map) => map.iter_mut().for_each(|(_, v)| point_into(v, root)),
        serde_yaml::Value::Tagged(t) => point_into(&mut t.value, root),
        _ => {}
    }
}
