//! Command-line flags of `haltsql-operator`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Runs haltsql servers on Kubernetes: validates HaltSQLPolicy objects with
/// the real `haltsql validate` and rolls HaltSQLServer Deployments safely.
#[derive(Debug, Parser)]
#[command(name = "haltsql-operator", version, about, long_about = None)]
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
    Render(RenderArgs),
}

/// Flags of the controller manager (the default command).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The haltsql CLI used to validate policies. The operator exits at
    /// startup if it is missing or not executable.
    #[arg(long, value_name = "PATH", default_value = "/usr/local/bin/haltsql")]
    pub haltsql_binary: PathBuf,

    /// Comma-separated namespaces to watch; all namespaces when unset.
    #[arg(long, value_name = "NS[,NS...]", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,

    /// Run the controllers only while holding the leader lease (needed with
    /// more than one replica).
    #[arg(long, default_value_t = false)]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease; defaults to the pod's namespace
    /// (POD_NAMESPACE, or the service account's namespace file).
    #[arg(long, value_name = "NS")]
    pub leader_election_namespace: Option<String>,

    /// Address of the Prometheus metrics endpoint (`/metrics`); `0` disables it.
    #[arg(long, value_name = "ADDR", default_value = ":8080")]
    pub metrics_bind_address: String,

    /// Address of the `/healthz` and `/readyz` endpoints; `0` disables them.
    #[arg(long, value_name = "ADDR", default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Seconds a rollout may go without progress before the server reports
    /// `Progressing=False` / `RolloutFailed`.
    #[arg(long, value_name = "SECONDS", default_value_t = 180)]
    pub rollout_deadline_seconds: u64,

    /// Seconds one `haltsql validate` run may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub validator_timeout_seconds: u64,

    /// Seconds between full re-reconciles of every object (catches anything missed).
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub resync_seconds: u64,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Manifest files holding HaltSQLServer and HaltSQLPolicy objects (YAML,
    /// several documents per file allowed); `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,

    /// The haltsql CLI used to validate the policies.
    #[arg(long, value_name = "PATH", default_value = "/usr/local/bin/haltsql")]
    pub haltsql_binary: PathBuf,

    /// Namespace for objects that set none.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
}

/// Parses `:8080`, `0.0.0.0:8080` or `127.0.0.1:8080`; `0` disables the endpoint.
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
        .map_err(|e| format!("invalid bind address {value:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(parse_bind_address("nonsense").is_err());
    }

    #[test]
    fn flags_have_the_guide_defaults() {
        let cli = Cli::try_parse_from(["haltsql-operator"]).unwrap();
        assert_eq!(
            cli.run.haltsql_binary,
            PathBuf::from("/usr/local/bin/haltsql")
        );
        assert!(cli.run.watch_namespaces.is_empty());
        assert!(!cli.run.leader_elect);
        assert_eq!(cli.run.metrics_bind_address, ":8080");
        assert_eq!(cli.run.health_probe_bind_address, ":8081");
        let cli = Cli::try_parse_from(["haltsql-operator", "--watch-namespaces=a,b"]).unwrap();
        assert_eq!(cli.run.watch_namespaces, vec!["a", "b"]);
    }
}
