//! The `haltsql` command: a thin dispatcher over [`haltsql::cli`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use haltsql::cli;

/// mimalloc instead of glibc malloc: a verify decision makes a few hundred
/// small allocations (mostly sqlparser's tokens and AST), and malloc/free
/// were the largest user-space cost under load (hack/verify-bench.sh).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// haltsql: check SQL against policies before it reaches the database.
#[derive(Debug, Parser)]
#[command(name = "haltsql", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Validate(cli::ValidateArgs),
    HashToken(cli::HashTokenArgs),
    Serve(haltsql::serve::ServeArgs),
    Check(haltsql::check::CheckArgs),
    Bundle(haltsql::bundle::cli::BundleArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match &cli.command {
        Command::Validate(args) => cli::validate(args),
        Command::HashToken(args) => cli::hash_token(args),
        Command::Serve(args) => haltsql::serve::run(args),
        Command::Check(args) => haltsql::check::run(args),
        Command::Bundle(args) => haltsql::bundle::cli::run(args),
    };
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}
