//! The server pods, reachable from the test: one `kubectl port-forward
//! pod/<name>` per ready pod of the Deployment's current ReplicaSet (or of
//! pods named by the test, such as the old pods of a stalled rollout).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::cluster::Cluster;
use crate::port_forward::PortForward;
use haltsql_testkit::http;
use haltsql_testkit::status::pod_ready;

pub const CHECKSUM_ANNOTATION: &str = "haltsql.dev/config-checksum";
/// The container port of `server.listen` (the verify API).
const API_PORT: u16 = 8080;

/// One reachable server pod.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub pod: String,
    pub addr: SocketAddr,
}

/// Port-forwards to server pods, kept while the pods are wanted.
#[derive(Default)]
pub struct Pods {
    forwards: BTreeMap<String, PortForward>,
}

impl Pods {
    /// Waits until exactly `replicas` pods of the current ReplicaSet are ready
    /// and carry `checksum`, forwards to each, drops the other forwards, and
    /// returns their endpoints (sorted by pod name).
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
                    let ready: Vec<String> = pods
                        .iter()
                        .filter(|p| pod_checksum(p) == checksum)
                        .map(|p| p.name_any())
                        .collect();
                    if ready.len() == replicas && pods.len() == replicas {
                        self.reach(cluster, ns, &ready).await
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

    /// Forwards to exactly these pods (keeping forwards that still work) and
    /// waits until each answers `/readyz`.
    pub async fn reach(
        &mut self,
        cluster: &Cluster,
        ns: &str,
        pods: &[String],
    ) -> Result<Vec<Endpoint>, String> {
        let wanted: BTreeSet<&String> = pods.iter().collect();
        self.forwards.retain(|name, _| wanted.contains(name));
        for name in pods {
            if !self.forwards.contains_key(name) {
                let fwd = PortForward::start(cluster, ns, &format!("pod/{name}"), API_PORT)?;
                self.forwards.insert(name.clone(), fwd);
            }
            let addr = self.forwards[name].addr;
            if let Err(e) = wait_ready(addr, name).await {
                // A forward whose pod went away fails; start afresh next time.
                self.forwards.remove(name);
                return Err(e);
            }
        }
        Ok(self
            .forwards
            .iter()
            .map(|(pod, fwd)| Endpoint {
                pod: pod.clone(),
                addr: fwd.addr,
            })
            .collect())
    }

    /// Stops every forward (the server is gone).
    pub fn stop_all(&mut self) {
        self.forwards.clear();
    }
}

pub fn pod_checksum(pod: &Pod) -> &str {
    pod.annotations()
        .get(CHECKSUM_ANNOTATION)
        .map(String::as_str)
        .unwrap_or("")
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
    ready_pods_of(cluster, ns, &rs).await
}

/// Ready pods of one ReplicaSet.
pub async fn ready_pods_of(
    cluster: &Cluster,
    ns: &str,
    rs: &ReplicaSet,
) -> Result<Vec<Pod>, String> {
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
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("pod {pod} at {addr} never became ready: {last}"))
}
