//! Where things are: the repository and the binaries built from it.

use std::path::{Path, PathBuf};

/// The repository's root (the workspace this kit is a member of).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, else `<repo>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// The `haltsql` CLI built from this workspace (`HALTSQL_BIN` overrides);
/// panics with a hint when it was not built.
pub fn haltsql_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("HALTSQL_BIN") {
        return PathBuf::from(path);
    }
    let path = target_dir().join("debug").join("haltsql");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p haltsql` or set HALTSQL_BIN",
        path.display()
    );
    path
}
