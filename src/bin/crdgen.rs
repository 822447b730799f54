//! Writes the generated manifests (CRDs and RBAC roles) into the repository.
//!
//! Usage: `crdgen [ROOT]` (default: the current directory). `make manifests`
//! runs it from the repository root.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    match haltsql_operator::manifests::write_generated_files(&root) {
        Ok(paths) => {
            for path in paths {
                println!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("crdgen: {err}");
            ExitCode::FAILURE
        }
    }
}
