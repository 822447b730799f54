//! Detached Ed25519 signatures over a bundle's SHA-256, and key files.
//!
//! The signed message is `haltsql.dev/bundle/v1\nsha256:<hex>\n`: binding
//! the purpose into the message keeps a bundle key from being tricked into
//! signing something that verifies as another kind of object.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _, EncodePublicKey as _};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::load;

/// Largest signature file read (it is about 300 bytes).
pub const MAX_SIGNATURE_BYTES: u64 = 64 * 1024;

/// The signature file (`bundle.tar.gz.sig`), JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SignatureFile {
    /// `haltsql.dev/v1`.
    pub api_version: String,
    /// `BundleSignature`.
    pub kind: String,
    /// `sha256:<64 hex>` of the archive.
    pub digest: String,
    /// Base64 of the 64-byte Ed25519 signature of the message above.
    pub signature: String,
    /// Base64 of the signer's 32-byte public key (a hint for humans and
    /// logs: verification tries every configured key regardless).
    pub public_key: String,
}

#[derive(Debug, Error)]
pub enum VerifyError {
    #[error("the signature file is not valid: {0}")]
    Malformed(String),
    #[error("the signature is for {signed}, but the bundle is sha256:{actual}")]
    DigestMismatch { signed: String, actual: String },
    #[error("the bundle is not signed by any of the {0} trusted public keys")]
    UntrustedKey(usize),
}

#[derive(Debug, Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----)")]
    BadPrivate { path: String },
    #[error("{path}: invalid public key: {reason}")]
    BadPublic { path: String, reason: String },
    #[error("cannot get random bytes from the operating system: {0}")]
    Random(String),
    #[error("cannot encode the key: {0}")]
    Encode(String),
}

fn message(digest_hex: &str) -> Vec<u8> {
    format!("haltsql.dev/bundle/v1\nsha256:{digest_hex}\n").into_bytes()
}

/// Signs an archive.
pub fn sign_bytes(bundle: &[u8], key: &SigningKey) -> SignatureFile {
    let digest = hex::encode(Sha256::digest(bundle));
    let sig = key.sign(&message(&digest));
    SignatureFile {
        api_version: load::API_VERSION.to_string(),
        kind: "BundleSignature".to_string(),
        digest: format!("sha256:{digest}"),
        signature: B64.encode(sig.to_bytes()),
        public_key: B64.encode(key.verifying_key().to_bytes()),
    }
}

/// Verifies `signature` (a signature file's bytes) over `bundle` against
/// `keys`; returns the index of the key that signed.
pub fn verify_bytes(
    bundle: &[u8],
    signature: &[u8],
    keys: &[[u8; 32]],
) -> Result<usize, VerifyError> {
    if signature.len() as u64 > MAX_SIGNATURE_BYTES {
        return Err(VerifyError::Malformed(format!(
            "larger than {MAX_SIGNATURE_BYTES} bytes"
        )));
    }
    let file: SignatureFile =
        serde_json::from_slice(signature).map_err(|e| VerifyError::Malformed(e.to_string()))?;
    if file.api_version != load::API_VERSION || file.kind != "BundleSignature" {
        return Err(VerifyError::Malformed(format!(
            "expected apiVersion {} and kind BundleSignature",
            load::API_VERSION
        )));
    }
    let actual = hex::encode(Sha256::digest(bundle));
    if file.digest != format!("sha256:{actual}") {
        return Err(VerifyError::DigestMismatch {
            signed: file.digest,
            actual,
        });
    }
    let raw = B64
        .decode(file.signature.as_bytes())
        .map_err(|e| VerifyError::Malformed(format!("signature: {e}")))?;
    let sig = Signature::from_slice(&raw)
        .map_err(|_| VerifyError::Malformed("signature: expected 64 bytes".to_string()))?;
    let msg = message(&actual);
    for (i, k) in keys.iter().enumerate() {
        if let Ok(vk) = VerifyingKey::from_bytes(k)
            && vk.verify_strict(&msg, &sig).is_ok()
        {
            return Ok(i);
        }
    }
    Err(VerifyError::UntrustedKey(keys.len()))
}

/// A new random key pair.
pub fn generate() -> Result<SigningKey, KeyError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// PKCS#8 PEM of a private key.
pub fn private_pem(key: &SigningKey) -> Result<String, KeyError> {
    key.to_pkcs8_pem(LineEnding::LF)
        .map(|s| s.to_string())
        .map_err(|e| KeyError::Encode(e.to_string()))
}

/// SubjectPublicKeyInfo PEM of a public key (what `public_keys` takes).
pub fn public_pem(key: &SigningKey) -> Result<String, KeyError> {
    key.verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| KeyError::Encode(e.to_string()))
}

/// Reads a PKCS#8 PEM private key file.
pub fn read_private(path: &Path) -> Result<SigningKey, KeyError> {
    let shown = path.display().to_string();
    let bytes = load::fs::read_capped(path, MAX_SIGNATURE_BYTES).map_err(|e| KeyError::Io {
        path: shown.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| KeyError::BadPrivate {
        path: shown.clone(),
    })?;
    SigningKey::from_pkcs8_pem(text.trim()).map_err(|_| KeyError::BadPrivate { path: shown })
}

/// Reads a public key file: PEM or base64 of the 32 raw bytes, as in
/// `public_keys`.
pub fn read_public(path: &Path) -> Result<[u8; 32], KeyError> {
    let shown = path.display().to_string();
    let bytes = load::fs::read_capped(path, MAX_SIGNATURE_BYTES).map_err(|e| KeyError::Io {
        path: shown.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let text = String::from_utf8_lossy(&bytes);
    load::parse_ed25519_public_key(text.trim()).map_err(|reason| KeyError::BadPublic {
        path: shown,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_then_verify_and_refuse_changes() {
        let k = SigningKey::from_bytes(&[7u8; 32]);
        let other = SigningKey::from_bytes(&[8u8; 32]);
        let data = b"bundle bytes".to_vec();
        let sig = serde_json::to_vec(&sign_bytes(&data, &k)).unwrap();
        let pk = k.verifying_key().to_bytes();
        let opk = other.verifying_key().to_bytes();
        assert_eq!(verify_bytes(&data, &sig, &[opk, pk]).unwrap(), 1);
        assert!(matches!(
            verify_bytes(&data, &sig, &[opk]),
            Err(VerifyError::UntrustedKey(1))
        ));
        let mut tampered = data.clone();
        tampered[0] ^= 1;
        assert!(matches!(
            verify_bytes(&tampered, &sig, &[pk]),
            Err(VerifyError::DigestMismatch { .. })
        ));
        // A signature file whose digest was edited to match still fails.
        let mut f: SignatureFile = serde_json::from_slice(&sig).unwrap();
        f.digest = format!("sha256:{}", hex::encode(Sha256::digest(&tampered)));
        let forged = serde_json::to_vec(&f).unwrap();
        assert!(matches!(
            verify_bytes(&tampered, &forged, &[pk]),
            Err(VerifyError::UntrustedKey(1))
        ));
    }

    #[test]
    fn pem_round_trip() {
        let k = generate().unwrap();
        let pem = private_pem(&k).unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let back = SigningKey::from_pkcs8_pem(&pem).unwrap();
        assert_eq!(back.to_bytes(), k.to_bytes());
        let pubpem = public_pem(&k).unwrap();
        assert_eq!(
            load::parse_ed25519_public_key(&pubpem).unwrap(),
            k.verifying_key().to_bytes()
        );
    }
}
