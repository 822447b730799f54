//! Proves the node tier is a real node (`hack/cluster.sh up node`): pods run
//! as containers on the bridge in 198.18.0.0/24, `kubectl exec`, `logs` and
//! `port-forward` reach them, and pods reach the API server through the
//! `kubernetes` Service and each other through a Service (kube-proxy).
//!
//! The images come from this repository only: the node's pause image, and a
//! tiny static `netcheck` program (tests/node/netcheck.c) that this test packs
//! with `bin/oci-image` and imports with `hack/cluster.sh load node`.

use crate::support;

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::{Cluster, TestNamespace, repo_root, run_ok};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, PostParams};
use tokio::io::AsyncReadExt;

const NODE_NAME: &str = "haltsql-node-0";
const PAUSE_IMAGE: &str = "haltsql.local/pause:3.10";
const NETCHECK_IMAGE: &str = "haltsql.local/netcheck:1";
const KUBERNETES_SERVICE_IP: &str = "198.19.128.1";

/// Builds the netcheck image and imports it into the node, once per test binary.
fn netcheck_image() -> &'static str {
    static LOADED: OnceLock<()> = OnceLock::new();
    LOADED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("netcheck");
        run_ok(
            Command::new("gcc")
                .args(["-static", "-Os", "-Wall", "-Wextra", "-o"])
                .arg(&binary)
                .arg(repo_root().join("tests/node/netcheck.c")),
        );
        let archive = dir.path().join("netcheck.tar");
        run_ok(
            Command::new(repo_root().join("bin/oci-image"))
                .arg("--out")
                .arg(&archive)
                .args(["--tag", NETCHECK_IMAGE, "--entrypoint", "/netcheck"])
                .args(["--user", "65532:65532", "--file"])
                .arg(format!("{}:/netcheck:0755", binary.display())),
        );
        run_ok(
            Command::new(repo_root().join("hack/cluster.sh"))
                .args(["load", "node"])
                .arg(&archive),
        );
    });
    NETCHECK_IMAGE
}

fn in_pod_cidr(ip: &str) -> bool {
    match ip.parse::<Ipv4Addr>() {
        Ok(ip) => ip.octets()[..3] == [198, 18, 0] && ip.octets()[3] > 1,
        Err(_) => false,
    }
}

fn deployment(name: &str, image: &str, args: &[&str], port: Option<i32>) -> Deployment {
    let mut container = serde_json::json!({
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}}
    });
    if let Some(port) = port {
        container["ports"] = serde_json::json!([{"containerPort": port}]);
        container["readinessProbe"] = serde_json::json!({
            "tcpSocket": {"port": port}, "periodSeconds": 1
        });
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 1}
            }
        }
    }))
    .unwrap()
}

/// Creates the Deployment and waits until both replicas are available; returns its pods.
async fn run_deployment(client: &kube::Client, ns: &str, deployment: Deployment) -> Vec<Pod> {
    let name = deployment.metadata.name.clone().unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let what = format!("deployment {name} with 2 available replicas");
    support::eventually(&what, Duration::from_secs(120), || async {
        let d = deployments.get(&name).await.ok()?;
        (d.status?.available_replicas? == 2).then_some(())
    })
    .await;
    pods.list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .unwrap()
        .items
}

/// Runs a pod to completion and returns its log; panics unless it succeeded.
async fn run_to_completion(client: &kube::Client, ns: &str, name: &str, args: &[&str]) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": name, "image": netcheck_image(),
                            "imagePullPolicy": "IfNotPresent", "args": args}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let phase = support::eventually(
        &format!("pod {name} to finish"),
        Duration::from_secs(60),
        || async {
            let phase = pods.get(name).await.ok()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        },
    )
    .await;
    let log = Cluster::Node.kubectl_ok(&["-n", ns, "logs", name]);
    assert_eq!(phase, "Succeeded", "pod {name} failed; its log:\n{log}");
    log
}

#[tokio::test]
async fn pause_deployment_runs_as_containers_on_the_bridge() {
    let client = Cluster::Node.client().await;
    let ns = TestNamespace::new_in(&client, Cluster::Node, "node-pause").await;

    let pods = run_deployment(
        &client,
        &ns.name,
        deployment("pause", PAUSE_IMAGE, &[], None),
    )
    .await;
    assert_eq!(pods.len(), 2, "{pods:?}");
    let mut ips = Vec::new();
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        let status = pod.status.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(NODE_NAME));
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let ip = status.pod_ip.clone().unwrap_or_default();
        assert!(in_pod_cidr(&ip), "pod IP {ip:?} is not in 198.18.0.0/24");
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert!(
            container
                .container_id
                .as_deref()
                .unwrap_or_default()
                .starts_with("containerd://"),
            "{container:?}"
        );
        ips.push(ip);
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 2, "each pod has its own IP");

    // The container really runs our pause binary.
    let pod = pods[0].metadata.name.clone().unwrap();
    let out = run_ok(
        Cluster::Node
            .kubectl()
            .args(["-n", &ns.name, "exec", &pod, "--", "/pause", "-v"]),
    );
    assert_eq!(out.trim(), "haltsql pause 3.10");
}

#[tokio::test]
async fn pods_reach_the_api_server_and_each_other_through_services() {
    let client = Cluster::Node.client().await;
    let ns = TestNamespace::new_in(&client, Cluster::Node, "node-net").await;
    let image = netcheck_image();

    let pods = run_deployment(
        &client,
        &ns.name,
        deployment("web", image, &["serve", "8080"], Some(8080)),
    )
    .await;
    let names: Vec<String> = pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    for pod in &pods {
        let ip = pod
            .status
            .as_ref()
            .unwrap()
            .pod_ip
            .clone()
            .unwrap_or_default();
        assert!(in_pod_cidr(&ip), "pod IP {ip:?} is not in 198.18.0.0/24");
    }

    // kubectl logs and exec reach the container through the kubelet.
    let log = run_ok(
        Cluster::Node
            .kubectl()
            .args(["-n", &ns.name, "logs", &names[0]]),
    );
    assert!(log.contains("netcheck: serving on port 8080"), "{log}");
    let out = run_ok(Cluster::Node.kubectl().args([
        "-n",
        &ns.name,
        "exec",
        &names[0],
        "--",
        "/netcheck",
        "version",
    ]));
    assert_eq!(out.trim(), "netcheck 1");

    // kubectl port-forward: the answer comes from that pod.
    let answer = port_forward_read(&ns.name, &names[1], 8080).await;
    assert_eq!(answer.trim(), format!("hello from {}", names[1]));

    // In-cluster configuration: the kubernetes Service leads to the API server.
    let log = run_to_completion(&client, &ns.name, "to-apiserver", &["connect-env"]).await;
    assert!(
        log.contains(&format!("connected to {KUBERNETES_SERVICE_IP}:443")),
        "{log}"
    );

    // A Service in front of the Deployment: kube-proxy leads a pod to a pod.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .unwrap();
    let service = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();
    assert!(
        cluster_ip.starts_with("198.19.128."),
        "Service IP {cluster_ip} is outside 198.19.128.0/24"
    );
    let log = run_to_completion(&client, &ns.name, "to-web", &["connect", &cluster_ip, "80"]).await;
    assert!(
        names
            .iter()
            .any(|n| log.contains(&format!("received hello from {n}"))),
        "no answer from a web pod through {cluster_ip}:80:\n{log}"
    );
}

/// Runs `kubectl port-forward` to the pod, reads what the pod sends on the
/// forwarded port, and stops the port-forward.
async fn port_forward_read(ns: &str, pod: &str, port: u16) -> String {
    let mut child = Cluster::Node
        .kubectl()
        .args([
            "-n",
            ns,
            "port-forward",
            &format!("pod/{pod}"),
            &format!("0:{port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // "Forwarding from 127.0.0.1:PORT -> 8080". The reader keeps draining
    // stdout afterwards: kubectl dies of SIGPIPE if its stdout is closed.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let port = line
                .strip_prefix("Forwarding from 127.0.0.1:")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|p| p.parse::<u16>().ok());
            if let (Some(port), Some(tx)) = (port, tx.take()) {
                let _ = tx.send(port);
            }
        }
    });
    let local = tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .expect("kubectl port-forward announces its local port")
        .expect("kubectl port-forward printed its local port");
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_string(&mut answer))
        .await
        .expect("the pod answers through the port-forward")
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    answer
}
