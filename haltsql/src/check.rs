//! `haltsql check`: one verify decision offline, printed as the API's JSON.

use std::io::Write;
use std::path::PathBuf;

use clap::{ArgGroup, Args};
use thiserror::Error;

use crate::engine::{self, Decision, Policy, Rules};
use crate::load::{self, LoadedConfig};

const CHECK_LONG: &str = "\
Load a Config document (as `haltsql serve` does) and print the verify \
decision for one SQL statement, exactly as POST /v1/verify would return it, \
under the policy of a token (--token-name) or a policy named directly \
(--policy). No audit event is written.

The SQL is the argument (it may start with `--` or `-`: a comment is read as \
SQL, not as an option), or the content of --file FILE (`-` for standard \
input), or standard input when neither is given. At most 1 MiB is read.

Exit codes:
  0  allowed
  1  denied
  2  error (the config does not load, unknown token or policy, usage error)";

/// Arguments of `haltsql check`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Print one verify decision for a SQL statement",
    long_about = CHECK_LONG,
    group(ArgGroup::new("who").required(true).args(["token_name", "policy"]))
)]
pub struct CheckArgs {
    /// The Config document.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,

    /// Use the policy of this token (its `name` in server.auth.tokens).
    #[arg(long, value_name = "NAME")]
    pub token_name: Option<String>,

    /// Use this policy.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,

    /// Read the SQL from FILE (`-`: standard input) instead of the argument.
    #[arg(long, value_name = "FILE", conflicts_with = "sql")]
    pub file: Option<PathBuf>,

    /// The SQL statement (text starting with `-`, such as a `--` comment, is
    /// taken as SQL). Without it and without --file, standard input is read.
    #[arg(value_name = "SQL", allow_hyphen_values = true)]
    pub sql: Option<String>,
}

/// Largest SQL text `check` reads from a file or standard input.
pub const MAX_SQL_INPUT: u64 = engine::MAX_SQL_BYTES as u64;

/// The SQL to check: the argument, the file, or standard input.
fn read_sql(args: &CheckArgs) -> Result<String, String> {
    use std::io::Read;
    if let Some(sql) = &args.sql {
        return Ok(sql.clone());
    }
    let mut buf = Vec::new();
    let (what, read) = match &args.file {
        Some(p) if p.as_os_str() != "-" => (
            p.display().to_string(),
            std::fs::File::open(p).and_then(|f| f.take(MAX_SQL_INPUT + 1).read_to_end(&mut buf)),
        ),
        _ => (
            "standard input".to_string(),
            std::io::stdin()
                .lock()
                .take(MAX_SQL_INPUT + 1)
                .read_to_end(&mut buf),
        ),
    };
    read.map_err(|e| format!("cannot read {what}: {e}"))?;
    if buf.len() as u64 > MAX_SQL_INPUT {
        return Err(format!("{what} holds more than {MAX_SQL_INPUT} bytes"));
    }
    String::from_utf8(buf).map_err(|_| format!("{what} is not UTF-8"))
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CheckError {
    #[error("no token named {0} in server.auth.tokens")]
    UnknownToken(String),
    #[error("no policy named {0} is loaded")]
    UnknownPolicy(String),
    #[error("give --token-name or --policy")]
    NoSelector,
}

/// The decision for `sql` under the selected policy of `config`.
pub fn decide(
    config: &LoadedConfig,
    token_name: Option<&str>,
    policy: Option<&str>,
    sql: &str,
) -> Result<Decision, CheckError> {
    let policy_name = match (token_name, policy) {
        (Some(t), _) => config
            .server
            .auth
            .tokens
            .iter()
            .find(|x| x.name == t)
            .map(|x| x.policy.clone())
            .ok_or_else(|| CheckError::UnknownToken(t.to_string()))?,
        (None, Some(p)) => p.to_string(),
        (None, None) => return Err(CheckError::NoSelector),
    };
    let loaded = config
        .policy(&policy_name)
        .ok_or(CheckError::UnknownPolicy(policy_name))?;
    Ok(engine::verify(&Policy::new(&Rules::from(loaded)), sql))
}

/// Run `haltsql check`; returns the exit code.
pub fn run(args: &CheckArgs) -> i32 {
    let config = match load::load_config(&args.config) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            return 2;
        }
    };
    let sql = match read_sql(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("haltsql check: {e}");
            return 2;
        }
    };
    let decision = match decide(
        &config,
        args.token_name.as_deref(),
        args.policy.as_deref(),
        &sql,
    ) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("haltsql check: {e}");
            return 2;
        }
    };
    let json = match serde_json::to_string(&decision) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("haltsql check: cannot encode the decision: {e}");
            return 2;
        }
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{json}").and_then(|()| out.flush()).is_err() {
        return 2;
    }
    if decision.allowed { 0 } else { 1 }
}
