//! How a server pod sees its rendered files: the ConfigMap in `etc/haltsql`,
//! each mounted Secret key in `var/run/haltsql/secrets/<secret>`, the TLS
//! Secret's keys in `var/run/haltsql/tls`, all under one root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where the config file and the mounted Secret keys are, relative to the root.
pub const CONFIG_DIR: &str = "etc/haltsql";
pub const SECRETS_DIR: &str = "var/run/haltsql/secrets";
pub const TLS_DIR: &str = "var/run/haltsql/tls";
const TLS_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

/// What a pod mounts: the ConfigMap's data and the Secret keys it references.
pub struct PodFiles<'a> {
    pub config_map: &'a BTreeMap<String, String>,
    /// `(secret, key)` pairs.
    pub secret_keys: &'a [(String, String)],
    /// The TLS Secret, whose certificate keys go to [`TLS_DIR`].
    pub tls_secret: Option<&'a str>,
}

impl PodFiles<'_> {
    /// Writes the files under `root` (Secret keys with [`secret_value`]) and
    /// returns the config file's path.
    pub fn write(&self, root: &Path) -> std::io::Result<PathBuf> {
        let etc = root.join(CONFIG_DIR);
        std::fs::create_dir_all(&etc)?;
        for (k, v) in self.config_map {
            std::fs::write(etc.join(k), v)?;
        }
        for (secret, key) in self.secret_keys {
            let dir =
                if Some(secret.as_str()) == self.tls_secret && TLS_KEYS.contains(&key.as_str()) {
                    root.join(TLS_DIR)
                } else {
                    root.join(SECRETS_DIR).join(secret)
                };
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join(key), secret_value(secret, key))?;
        }
        Ok(etc.join("config.yaml"))
    }
}

/// A plausible value for a mounted Secret key: 64 hex digits for token
/// hashes (distinct per key), PEM-looking text for TLS files, a word
/// otherwise.
pub fn secret_value(secret: &str, key: &str) -> String {
    if key == "sha256" || key.ends_with(".sha256") {
        // As `kubectl create secret --from-literal` would store it, plus
        // the trailing newline a hand-made Secret often has.
        let token = format!("token-of-{secret}-{key}");
        format!("{}\n", hex::encode(Sha256::digest(token.as_bytes())))
    } else if key.ends_with(".crt") {
        "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n".to_owned()
    } else if key.ends_with(".key") {
        "-----BEGIN PRIVATE KEY-----\nMC4Cfake\n-----END PRIVATE KEY-----\n".to_owned()
    } else {
        format!("{secret}-{key}-value")
    }
}
