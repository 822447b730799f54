//! Compact JWS (JWT) parsing and signature verification with `ring`.
//!
//! Only asymmetric algorithms are accepted: RS256/384/512, PS256/384/512,
//! ES256, ES384 and EdDSA (Ed25519). `none` and every HMAC algorithm are
//! refused before any key is looked at, so a token cannot choose to be
//! checked with a public key as an HMAC secret.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use thiserror::Error;

use super::alg::Alg;
use super::jwks::{Jwk, KeyMaterial};

/// Largest token accepted (the Authorization header is capped below this).
const MAX_TOKEN: usize = 16 * 1024;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum JwtError {
    #[error("not a compact JWS (three base64url parts)")]
    Format,
    #[error("the JOSE header is not valid JSON: {0}")]
    Header(String),
    #[error("the claims are not a JSON object")]
    Claims,
    #[error(
        "algorithm {0} is not accepted (RS256/384/512, PS256/384/512, ES256, ES384, EdDSA only)"
    )]
    Algorithm(String),
    #[error("the token has critical header parameters, none of which are supported")]
    Critical,
    #[error("bad signature")]
    Signature,
}

#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// A parsed, not yet verified token.
#[derive(Debug)]
pub struct Unverified {
    pub alg: Alg,
    pub kid: Option<String>,
    pub claims: serde_json::Map<String, serde_json::Value>,
    signing_input: Vec<u8>,
    signature: Vec<u8>,
}

/// Whether `token` has the shape of a compact JWS (cheap, no decoding):
/// static bearer tokens that do not look like one never reach OIDC.
pub fn looks_like_jwt(token: &[u8]) -> bool {
    token.len() <= MAX_TOKEN
        && token.iter().filter(|b| **b == b'.').count() == 2
        && token
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Splits and decodes a token; refuses unaccepted algorithms.
pub fn parse(token: &str) -> Result<Unverified, JwtError> {
    if token.len() > MAX_TOKEN {
        return Err(JwtError::Format);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Format);
    };
    let header = B64URL.decode(h).map_err(|_| JwtError::Format)?;
    let payload = B64URL.decode(p).map_err(|_| JwtError::Format)?;
    let signature = B64URL.decode(s).map_err(|_| JwtError::Format)?;
    let header: RawHeader =
        serde_json::from_slice(&header).map_err(|e| JwtError::Header(e.to_string()))?;
    let alg = Alg::parse(&header.alg)
        .ok_or_else(|| JwtError::Algorithm(header.alg.chars().take(32).collect()))?;
    if header.crit.is_some() {
        return Err(JwtError::Critical);
    }
    let claims: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&payload).map_err(|_| JwtError::Claims)?;
    Ok(Unverified {
        alg,
        kid: header.kid,
        claims,
        signing_input: token.as_bytes()[..h.len() + 1 + p.len()].to_vec(),
        signature,
    })
}

impl Unverified {
    /// Verifies the signature with `key` (which must suit the algorithm).
    pub fn verify(&self, key: &Jwk) -> Result<(), JwtError> {
        if !key.suits(self.alg) {
            return Err(JwtError::Signature);
        }
        let msg = &self.signing_input;
        let sig = &self.signature;
        let ok = match (&key.material, self.alg) {
            (KeyMaterial::Rsa { n, e }, alg) => {
                let params: &signature::RsaParameters = match alg {
                    Alg::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Alg::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    Alg::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    Alg::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
                    Alg::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
                    Alg::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
                    _ => return Err(JwtError::Signature),
                };
                RsaPublicKeyComponents { n, e }
                    .verify(params, msg, sig)
                    .is_ok()
            }
            (KeyMaterial::P256 { point }, Alg::Es256) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(msg, sig)
                    .is_ok()
            }
            (KeyMaterial::P384 { point }, Alg::Es384) => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(msg, sig)
                    .is_ok()
            }
            (KeyMaterial::Ed25519 { x }, Alg::EdDsa) => {
                UnparsedPublicKey::new(&signature::ED25519, x)
                    .verify(msg, sig)
                    .is_ok()
            }
            _ => false,
        };
        if ok { Ok(()) } else { Err(JwtError::Signature) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        B64URL.encode(s)
    }

    #[test]
    fn refuses_none_and_hmac_before_any_key() {
        for alg in ["none", "HS256", "HS384", "HS512", "", "rs256"] {
            let t = format!(
                "{}.{}.{}",
                b64(&format!("{{\"alg\":\"{alg}\"}}")),
                b64("{\"iss\":\"x\"}"),
                b64("sig")
            );
            assert!(
                matches!(parse(&t), Err(JwtError::Algorithm(_))),
                "{alg} accepted"
            );
        }
    }

    #[test]
    fn refuses_bad_shapes_and_crit() {
        assert_eq!(parse("a.b").err(), Some(JwtError::Format));
        assert_eq!(parse("a.b.c.d").err(), Some(JwtError::Format));
        assert_eq!(parse("!!.b.c").err(), Some(JwtError::Format));
        let t = format!(
            "{}.{}.",
            b64("{\"alg\":\"ES256\",\"crit\":[\"exp\"]}"),
            b64("{}")
        );
        assert_eq!(parse(&t).err(), Some(JwtError::Critical));
        let t = format!("{}.{}.", b64("{\"alg\":\"ES256\"}"), b64("[1]"));
        assert_eq!(parse(&t).err(), Some(JwtError::Claims));
        assert!(looks_like_jwt(b"a.b.c"));
        assert!(!looks_like_jwt(b"static-token"));
        assert!(!looks_like_jwt(b"a.b.c d"));
    }
}
