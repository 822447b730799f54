//! JSON Web Key Sets: the public keys an issuer signs with.
//!
//! Keys of a type this server cannot verify with, or marked for encryption
//! (`"use": "enc"`), are skipped rather than refused, so an issuer that also
//! publishes such keys keeps working.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use serde::Deserialize;
use thiserror::Error;

use super::alg::Alg;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum JwksError {
    #[error("not a JWKS document (a JSON object with a \"keys\" array): {0}")]
    Json(String),
    #[error("no usable signing key (RSA, EC P-256/P-384 or Ed25519)")]
    NoKeys,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyMaterial {
    /// Big-endian modulus (no leading zeros) and exponent.
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// Uncompressed point `04 || x || y`.
    P256 {
        point: Vec<u8>,
    },
    P384 {
        point: Vec<u8>,
    },
    Ed25519 {
        x: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwk {
    pub kid: Option<String>,
    /// The key's own `alg`, when it names one.
    pub alg: Option<String>,
    pub material: KeyMaterial,
}

impl Jwk {
    /// Whether this key may verify a token signed with `alg`.
    pub fn suits(&self, alg: Alg) -> bool {
        if self.alg.as_deref().is_some_and(|a| a != alg.name()) {
            return false;
        }
        matches!(
            (&self.material, alg),
            (
                KeyMaterial::Rsa { .. },
                Alg::Rs256 | Alg::Rs384 | Alg::Rs512 | Alg::Ps256 | Alg::Ps384 | Alg::Ps512
            ) | (KeyMaterial::P256 { .. }, Alg::Es256)
                | (KeyMaterial::P384 { .. }, Alg::Es384)
                | (KeyMaterial::Ed25519 { .. }, Alg::EdDsa)
        )
    }
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawKey {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

fn b64(s: Option<&String>) -> Option<Vec<u8>> {
    B64URL.decode(s?.trim_end_matches('=')).ok()
}

fn fixed(s: Option<&String>, len: usize) -> Option<Vec<u8>> {
    b64(s).filter(|v| v.len() == len)
}

fn key(raw: RawKey) -> Option<Jwk> {
    if raw.use_.as_deref().is_some_and(|u| u != "sig") {
        return None;
    }
    let material = match (raw.kty.as_str(), raw.crv.as_deref()) {
        ("RSA", _) => {
            let mut n = b64(raw.n.as_ref())?;
            let lead = n.iter().take_while(|b| **b == 0).count();
            n.drain(..lead);
            let e = b64(raw.e.as_ref())?;
            if n.is_empty() || e.is_empty() {
                return None;
            }
            KeyMaterial::Rsa { n, e }
        }
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let len = if crv == "P-256" { 32 } else { 48 };
            let mut point = vec![4u8];
            point.extend(fixed(raw.x.as_ref(), len)?);
            point.extend(fixed(raw.y.as_ref(), len)?);
            if len == 32 {
                KeyMaterial::P256 { point }
            } else {
                KeyMaterial::P384 { point }
            }
        }
        ("OKP", Some("Ed25519")) => KeyMaterial::Ed25519 {
            x: fixed(raw.x.as_ref(), 32)?,
        },
        _ => return None,
    };
    Some(Jwk {
        kid: raw.kid,
        alg: raw.alg,
        material,
    })
}

/// Parses a JWKS document; at least one usable key is required.
pub fn parse(json: &[u8]) -> Result<Vec<Jwk>, JwksError> {
    let set: RawSet = serde_json::from_slice(json).map_err(|e| JwksError::Json(e.to_string()))?;
    let keys: Vec<Jwk> = set
        .keys
        .into_iter()
        .filter_map(|v| serde_json::from_value::<RawKey>(v).ok())
        .filter_map(key)
        .collect();
    if keys.is_empty() {
        return Err(JwksError::NoKeys);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_supported_kinds_and_skips_the_rest() {
        let x32 = B64URL.encode([7u8; 32]);
        let doc = format!(
            r#"{{"keys":[
              {{"kty":"RSA","kid":"r","n":"AAEC","e":"AQAB"}},
              {{"kty":"EC","crv":"P-256","kid":"e","x":"{x32}","y":"{x32}"}},
              {{"kty":"OKP","crv":"Ed25519","kid":"o","x":"{x32}"}},
              {{"kty":"oct","k":"c2VjcmV0"}},
              {{"kty":"RSA","use":"enc","n":"AQ","e":"AQAB"}},
              {{"kty":"EC","crv":"P-256","x":"AQ","y":"AQ"}}
            ]}}"#
        );
        let keys = parse(doc.as_bytes()).unwrap();
        assert_eq!(keys.len(), 3);
        assert_eq!(
            keys[0].material,
            KeyMaterial::Rsa {
                n: vec![1, 2],
                e: vec![1, 0, 1]
            }
        );
        assert!(keys[0].suits(Alg::Rs256) && !keys[0].suits(Alg::Es256));
        assert!(keys[1].suits(Alg::Es256) && !keys[1].suits(Alg::Es384));
        assert!(keys[2].suits(Alg::EdDsa));
    }

    #[test]
    fn a_key_alg_restricts_the_token_alg() {
        let doc = r#"{"keys":[{"kty":"RSA","alg":"PS256","n":"AQ","e":"AQAB"}]}"#;
        let keys = parse(doc.as_bytes()).unwrap();
        assert!(keys[0].suits(Alg::Ps256));
        assert!(!keys[0].suits(Alg::Rs256));
    }

    #[test]
    fn refuses_documents_without_usable_keys() {
        assert_eq!(
            parse(br#"{"keys":[{"kty":"oct","k":"AA"}]}"#),
            Err(JwksError::NoKeys)
        );
        assert!(matches!(parse(b"[]"), Err(JwksError::Json(_))));
    }
}
