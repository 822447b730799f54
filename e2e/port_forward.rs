//! `kubectl port-forward` to a pod, for the e2e's HTTP checks.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::cluster::Cluster;

/// A running `kubectl port-forward TARGET :PORT` on loopback.
pub struct PortForward {
    child: Child,
    pub addr: SocketAddr,
}

impl PortForward {
    pub fn start(cluster: &Cluster, ns: &str, target: &str, port: u16) -> Result<Self, String> {
        let mut child = cluster
            .kubectl()
            .args(["-n", ns, "port-forward", "--address", "127.0.0.1", target])
            .arg(format!(":{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("kubectl port-forward {target}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // "Forwarding from 127.0.0.1:41234 -> 8080"; keep reading so the pipe never fills.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                let local = line
                    .strip_prefix("Forwarding from ")
                    .and_then(|rest| rest.split(" -> ").next())
                    .and_then(|a| a.parse::<SocketAddr>().ok());
                if let Some(addr) = local {
                    return Ok(PortForward { child, addr });
                }
            }
        }
        let _ = child.kill();
        Err(format!("kubectl port-forward {target} did not start"))
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
