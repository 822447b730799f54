//! Command-line flags of `haltsql-operator`.
//!
//! Only the Kubernetes ecosystem's own variables are read from the
//! environment: `KUBECONFIG` (by the client, falling back to in-cluster
//! credentials), `RUST_LOG` (log levels), and `POD_NAMESPACE` / `POD_NAME`
//! (set through the downward API; they name the lease's namespace and holder).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{ArgAction, Args, Parser, Subcommand};

use crate::controllers::context::{
    DEFAULT_CONCURRENCY, DEFAULT_RESYNC, DEFAULT_ROLLOUT_DEADLINE, DEFAULT_VALIDATOR_TIMEOUT,
};

/// Where the operator image puts the haltsql CLI.
const DEFAULT_HALTSQL_BINARY: &str = "/usr/local/bin/haltsql";

const AFTER_HELP: &str = "\
Environment:
  KUBECONFIG      kubeconfig to use; in a pod, the service account is used instead
  RUST_LOG        log levels, e.g. `info` (default) or `info,haltsql_operator=debug`;
                  logs are JSON lines unless standard error is a terminal
  POD_NAMESPACE   namespace of the leader-election Lease (downward API)
  POD_NAME        this replica's identity in the Lease (downward API)

Endpoints:
  /metrics        Prometheus metrics (--metrics-bind-address)
  /healthz        200 while the process runs (--health-probe-bind-address)
  /readyz         200 once the caches have synced and the controllers run,
                  or while this replica waits for the leader lease

Examples:
  haltsql-operator --leader-elect --watch-namespaces=team-a,team-b
  haltsql-operator render -f server.yaml -f policies.yaml | kubectl apply --dry-run=server -f -";

/// Runs haltsql servers on Kubernetes: validates HaltSQLPolicy objects with
/// the real `haltsql validate` and rolls HaltSQLServer Deployments safely.
///
/// Without a subcommand, runs the controller manager.
#[derive(Debug, Parser)]
#[command(
    name = "haltsql-operator",
    version,
    about,
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the objects the operator would create for the given HaltSQLServer
    /// and HaltSQLPolicy manifests, offline (like `helm template`).
    ///
    /// Every policy is validated with the same haltsql CLI the operator uses;
    /// an invalid policy or server fails the command (exit code 1) with the
    /// located errors, so a pipeline stops before applying anything.
    Render(RenderArgs),
}

/// Flags of the controller manager (the default command).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The haltsql CLI used to validate policies. The operator exits at
    /// startup if it is missing or not executable.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_HALTSQL_BINARY)]
    pub haltsql_binary: PathBuf,

    /// Comma-separated namespaces to watch [default: all]. With a list,
    /// RoleBindings in those namespaces are enough: the watches are then
    /// namespaced. An identity that may list and watch everywhere gets one
    /// cluster-wide watch per kind instead, keeping only those namespaces' objects.
    #[arg(
        long,
        value_name = "NS[,NS...]",
        value_delimiter = ',',
        value_parser = parse_namespace
    )]
    pub watch_namespaces: Vec<String>,

    /// Run the controllers only while holding the leader lease (needed with
    /// more than one replica).
    #[arg(
        long,
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true"
    )]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease [default: POD_NAMESPACE, the
    /// service account's namespace, or the kubeconfig context's namespace].
    #[arg(long, value_name = "NS", value_parser = parse_namespace)]
    pub leader_election_namespace: Option<String>,

    /// Address of the Prometheus metrics endpoint (`/metrics`), as `:PORT` or
    /// `IP:PORT`; `0` disables it.
    #[arg(long, value_name = "ADDR", default_value = ":8080")]
    pub metrics_bind_address: BindAddress,

    /// Address of the `/healthz` and `/readyz` endpoints; `0` disables them.
    #[arg(long, value_name = "ADDR", default_value = ":8081")]
    pub health_probe_bind_address: BindAddress,

    /// Seconds a rollout may go without progress before the server reports
    /// `Progressing=False` / `RolloutFailed`.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = DEFAULT_ROLLOUT_DEADLINE.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64)
    )]
    pub rollout_deadline_seconds: u64,

    /// Seconds one `haltsql validate` run may take.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = DEFAULT_VALIDATOR_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub validator_timeout_seconds: u64,

    /// Reconciles that may run at once in each of the two controllers, over
    /// every watched namespace together (however they are watched). Twice
    /// this is the bound on the requests the controllers have waiting for the
    /// API server's answer at once.
    #[arg(
        long,
        value_name = "N",
        default_value_t = DEFAULT_CONCURRENCY,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub concurrency: u16,

    /// `haltsql validate` processes that may run at once; policies that
    /// wait are judged together by the next one. Default: the number of
    /// CPUs the operator may use.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub validator_concurrency: Option<u16>,

    /// Seconds between full re-reconciles of every object (catches anything
    /// a watch missed).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = DEFAULT_RESYNC.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub resync_seconds: u64,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Manifest files holding HaltSQLServer and HaltSQLPolicy objects (YAML,
    /// several documents per file; other kinds are skipped); `-` reads
    /// standard input. Repeat for several files.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,

    /// The haltsql CLI used to validate the policies.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_HALTSQL_BINARY)]
    pub haltsql_binary: PathBuf,

    /// Namespace for objects that set none.
    #[arg(short = 'n', long, default_value = "default", value_parser = parse_namespace)]
    pub namespace: String,
}

/// A listen address: `:PORT` (all interfaces), `IP:PORT`, or `0` (disabled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

impl FromStr for BindAddress {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        parse_bind_address(value).map(BindAddress)
    }
}

impl fmt::Display for BindAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(addr) => write!(f, "{addr}"),
            None => f.write_str("0"),
        }
    }
}

/// Parses `:8080`, `0.0.0.0:8080`, `127.0.0.1:8080` or `[::1]:8080`; `0`
/// disables the endpoint.
pub fn parse_bind_address(value: &str) -> Result<Option<SocketAddr>, String> {
    if value == "0" {
        return Ok(None);
    }
    let full = if value.starts_with(':') {
        format!("0.0.0.0{value}")
    } else {
        value.to_owned()
    };
    full.parse::<SocketAddr>()
        .map(Some)
        .map_err(|e| format!("{value:?} is not `:PORT`, `IP:PORT` or `0`: {e}"))
}

/// A namespace name (an RFC 1123 label), so a typo fails at startup rather
/// than as a watch that is forbidden or never sees anything.
pub fn parse_namespace(value: &str) -> Result<String, String> {
    let value = value.trim();
    if haltsql_names::is_dns1123_label(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (lower-case letters, digits and '-', at most 63)"
        ))
    }
}

impl RunArgs {
    /// The namespaces to watch, without duplicates; `None` means all.
    pub fn namespaces(&self) -> Option<Vec<String>> {
        if self.watch_namespaces.is_empty() {
            return None;
        }
        let mut namespaces = Vec::new();
        for ns in &self.watch_namespaces {
            if !namespaces.contains(ns) {
                namespaces.push(ns.clone());
            }
        }
        Some(namespaces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn bind_addresses() {
        assert_eq!(parse_bind_address("0"), Ok(None));
        assert_eq!(parse_bind_address(":8080").unwrap().unwrap().port(), 8080);
        assert!(
            parse_bind_address("127.0.0.1:9")
                .unwrap()
                .unwrap()
                .ip()
                .is_loopback()
        );
        assert!(
            parse_bind_address("[::1]:9")
                .unwrap()
                .unwrap()
                .ip()
                .is_loopback()
        );
        assert!(parse_bind_address("nonsense").is_err());
        assert!(parse_bind_address("8080").is_err());
    }

    #[test]
    fn flags_have_the_guide_defaults() {
        let cli = Cli::try_parse_from(["haltsql-operator"]).unwrap();
        assert_eq!(
            cli.run.haltsql_binary,
            PathBuf::from("/usr/local/bin/haltsql")
        );
        assert!(cli.run.watch_namespaces.is_empty());
        assert_eq!(cli.run.namespaces(), None);
        assert_eq!(cli.run.concurrency, DEFAULT_CONCURRENCY);
        assert!(!cli.run.leader_elect);
        assert_eq!(cli.run.metrics_bind_address, ":8080".parse().unwrap());
        assert_eq!(
            cli.run.metrics_bind_address.0.unwrap(),
            "0.0.0.0:8080".parse().unwrap()
        );
        assert_eq!(
            cli.run.health_probe_bind_address.0.unwrap(),
            "0.0.0.0:8081".parse().unwrap()
        );
        let cli = Cli::try_parse_from([
            "haltsql-operator",
            "--watch-namespaces=a,b,a",
            "--leader-elect",
        ])
        .unwrap();
        assert_eq!(cli.run.watch_namespaces, vec!["a", "b", "a"]);
        assert_eq!(cli.run.namespaces(), Some(vec!["a".into(), "b".into()]));
        assert!(cli.run.leader_elect);
    }

    #[test]
    fn leader_elect_takes_an_optional_value() {
        for (args, want) in [
            (vec!["--leader-elect=true"], true),
            (vec!["--leader-elect=false"], false),
            (vec!["--leader-elect", "--metrics-bind-address=0"], true),
        ] {
            let cli = Cli::try_parse_from(std::iter::once("haltsql-operator").chain(args.clone()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(cli.run.leader_elect, want, "{args:?}");
        }
        let cli = Cli::try_parse_from(["haltsql-operator", "--metrics-bind-address=0"]).unwrap();
        assert_eq!(cli.run.metrics_bind_address, BindAddress(None));
    }

    #[test]
    fn bad_values_fail_at_parse_time() {
        for bad in [
            vec!["--watch-namespaces=a,,b"],
            vec!["--watch-namespaces=Team_A"],
            vec!["--metrics-bind-address=8080"],
            vec!["--resync-seconds=0"],
            vec!["--concurrency=0"],
            vec!["--leader-elect=maybe"],
            vec!["render"],
        ] {
            assert!(
                Cli::try_parse_from(std::iter::once("haltsql-operator").chain(bad.clone()))
                    .is_err(),
                "{bad:?} parsed"
            );
        }
    }

    #[test]
    fn help_is_consistent() {
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        for flag in [
            "--haltsql-binary",
            "--watch-namespaces",
            "--leader-elect",
            "--metrics-bind-address",
            "--health-probe-bind-address",
            "KUBECONFIG",
            "RUST_LOG",
            "render",
        ] {
            assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
        }
    }
}
