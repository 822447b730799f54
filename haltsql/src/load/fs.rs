//! Bounded file reading.

use std::fs::File;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use super::errors::ReadError;

/// Reads a regular file of at most `limit` bytes.
///
/// Symbolic links are followed (Kubernetes mounts Secret keys as links).
/// FIFOs, devices and folders are refused before they are opened, so a
/// hostile path cannot block the loader or feed it an endless stream; the
/// read itself is capped too, in case the file grows meanwhile.
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let meta = std::fs::metadata(path).map_err(io_error)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let file = File::open(path).map_err(io_error)?;
    let mut buf = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).min(1 << 20));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(io_error)?;
    if buf.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(buf)
}

/// Reads a regular file of at most `limit` bytes without following a
/// symbolic link in the last component (sealed mode).
///
/// The file is opened first (`O_NOFOLLOW`, and `O_NONBLOCK` so that a FIFO
/// cannot block the open) and checked through the open descriptor, so the
/// name cannot be swapped for a link between the check and the read.
pub fn read_capped_nofollow(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                ReadError::SymbolicLink
            } else {
                io_error(e)
            }
        })?;
    let meta = file.metadata().map_err(io_error)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let mut buf = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).min(1 << 20));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(io_error)?;
    if buf.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(buf)
}

fn io_error(e: std::io::Error) -> ReadError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::NotFound,
        _ => ReadError::Io(e),
    }
}

/// Maps an absolute path under `root` (`/a/b` -> `ROOT/a/b`); relative paths
/// and paths without a root are returned unchanged.
pub fn rooted(root: Option<&Path>, path: &Path) -> PathBuf {
    match root {
        Some(root) if path.is_absolute() => {
            let mut out = root.to_path_buf();
            for c in path.components() {
                if let Component::Normal(part) = c {
                    out.push(part);
                } else if let Component::ParentDir = c {
                    out.push("..");
                }
            }
            out
        }
        _ => path.to_path_buf(),
    }
}

/// Finds the 1-based line and column of a byte offset.
pub fn line_col(bytes: &[u8], offset: usize) -> (usize, usize) {
    let before = &bytes[..offset.min(bytes.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}
