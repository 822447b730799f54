//! The last verified bundle of a source, kept in its `cache_dir`.
//!
//! One file holds the archive and its signature together, replaced by an
//! atomic rename, so a crash never leaves a bundle next to another bundle's
//! signature. What is read back is verified again (the keys may have
//! changed since it was written).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

use super::archive::MAX_BUNDLE_BYTES;

const FILE: &str = "last-good.bundle";
const MAGIC: &[u8] = b"haltsql-bundle-cache/v1\n";

/// A cached bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    /// The source's version of it (ETag or manifest digest), if any.
    pub version: Option<String>,
    /// The archive.
    pub bundle: Vec<u8>,
    /// The signature file.
    pub signature: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: Option<String>,
    signature: String,
    bundle_len: u64,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Writes the cache atomically (temporary file, fsync, rename).
pub fn write(dir: &Path, c: &Cached) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let header = Header {
        version: c.version.clone(),
        signature: B64.encode(&c.signature),
        bundle_len: c.bundle.len() as u64,
    };
    let mut data = MAGIC.to_vec();
    serde_json::to_writer(&mut data, &header).map_err(std::io::Error::other)?;
    data.push(b'\n');
    data.extend_from_slice(&c.bundle);
    let tmp = dir.join(format!(".{FILE}.{}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path(dir))?;
    // The rename is durable once the folder is synced.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads the cache: `Ok(None)` when there is none, an error when it is
/// unreadable or malformed.
pub fn read(dir: &Path) -> std::io::Result<Option<Cached>> {
    let p = path(dir);
    let cap = MAX_BUNDLE_BYTES + 128 * 1024;
    let data = match crate::load::fs::read_capped(&p, cap) {
        Ok(d) => d,
        Err(crate::load::ReadError::NotFound) => return Ok(None),
        Err(e) => return Err(std::io::Error::other(e.to_string())),
    };
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let rest = data
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("not a haltsql bundle cache file"))?;
    let nl = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| bad("truncated header"))?;
    let header: Header =
        serde_json::from_slice(&rest[..nl]).map_err(|e| bad(&format!("header: {e}")))?;
    let bundle = &rest[nl + 1..];
    if bundle.len() as u64 != header.bundle_len {
        return Err(bad("truncated bundle"));
    }
    let signature = B64
        .decode(header.signature.as_bytes())
        .map_err(|e| bad(&format!("signature: {e}")))?;
    Ok(Some(Cached {
        version: header.version,
        bundle: bundle.to_vec(),
        signature,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("sub");
        assert_eq!(read(&d).unwrap(), None);
        let c = Cached {
            version: Some("\"etag\"".into()),
            bundle: vec![1, 2, 3, b'\n', 4],
            signature: b"{}".to_vec(),
        };
        write(&d, &c).unwrap();
        assert_eq!(read(&d).unwrap(), Some(c));
        let p = path(&d);
        let data = std::fs::read(&p).unwrap();
        std::fs::write(&p, &data[..data.len() - 1]).unwrap();
        assert!(read(&d).is_err());
    }
}
