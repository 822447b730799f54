//! The operator under test: the release binary as a child process, its
//! `/metrics` and `/readyz`, and its RSS and CPU time sampled from /proc.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use haltsql_testkit::http;
use haltsql_testkit::launcher::Flags;
use haltsql_testkit::prometheus::Metrics;

/// One /proc sample of the operator process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub at: Duration,
    pub rss_kib: u64,
    /// utime + stime of the operator itself, in seconds.
    pub cpu_s: f64,
    /// utime + stime of reaped children (the `haltsql validate` runs), in seconds.
    pub children_cpu_s: f64,
}

pub struct Operator {
    child: tokio::process::Child,
    pub pid: u32,
    metrics_port: u16,
    health_port: u16,
    pub started: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    sampler: tokio::task::JoinHandle<()>,
    pub log: PathBuf,
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// (own cpu seconds, children cpu seconds) from /proc/PID/stat.
fn read_cpu(pid: u32, ticks: f64) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state(3) ... utime(14) stime(15) cutime(16) cstime(17).
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
    Some(((n(14)? + n(15)?) / ticks, (n(16)? + n(17)?) / ticks))
}

/// A `kB` field of /proc/PID/status (`VmRSS`, `VmHWM`).
pub fn read_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

impl Operator {
    pub fn start(
        binary: &Path,
        haltsql: &Path,
        kubeconfig: &Path,
        namespaces: &[String],
        log: PathBuf,
    ) -> Result<Self> {
        let flags = Flags::new(haltsql.to_path_buf(), namespaces)?;
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = tokio::process::Command::new(binary)
            .args(flags.args())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("operator pid")?;
        let started = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sampler = {
            let samples = samples.clone();
            let ticks = clock_ticks();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    let (Some(rss), Some((cpu, children))) =
                        (read_status_kib(pid, "VmRSS"), read_cpu(pid, ticks))
                    else {
                        break;
                    };
                    samples.lock().unwrap().push(Sample {
                        at: started.elapsed(),
                        rss_kib: rss,
                        cpu_s: cpu,
                        children_cpu_s: children,
                    });
                }
            })
        };
        Ok(Operator {
            child,
            pid,
            metrics_port: flags.metrics_port,
            health_port: flags.health_port,
            started,
            samples,
            sampler,
            log,
        })
    }

    /// The newest sample.
    pub fn sample(&self) -> Sample {
        self.samples
            .lock()
            .unwrap()
            .last()
            .copied()
            .unwrap_or_default()
    }

    /// Samples taken between two offsets from the start.
    pub fn samples_between(&self, from: Duration, to: Duration) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .copied()
            .collect()
    }

    /// The kernel's peak RSS of the process so far (VmHWM).
    pub fn peak_rss_kib(&self) -> u64 {
        read_status_kib(self.pid, "VmHWM").unwrap_or(0)
    }

    /// Waits for `/readyz` to answer 200.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<Duration> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(http::Response { status: 200, .. }) =
                http::get_local(self.health_port, "/readyz").await
            {
                return Ok(self.started.elapsed());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!("the operator exited ({status}); see {}", self.log.display());
            }
            if Instant::now() > deadline {
                bail!("the operator was not ready within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn metrics(&self) -> Result<Metrics> {
        let response = http::get_local(self.metrics_port, "/metrics").await?;
        if response.status != 200 {
            bail!("/metrics answered {}", response.status);
        }
        Ok(Metrics(response.body))
    }

    /// Fails if the operator has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!("the operator exited ({status}); see {}", self.log.display());
        }
        Ok(())
    }

    /// SIGTERM (the process we started, by pid), then SIGKILL after 30 s.
    pub async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            self.child.start_kill()?;
            self.child.wait().await?;
        }
        self.sampler.abort();
        Ok(())
    }
}
