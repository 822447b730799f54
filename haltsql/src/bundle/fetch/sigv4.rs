//! AWS Signature Version 4 for S3 requests (header form; GET and HEAD with
//! the empty payload, PUT with the payload's SHA-256). Tested against the worked example of the S3 documentation and,
//! end to end, against a real S3 server that checks signatures.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// SHA-256 of the empty payload.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// S3 credentials.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length, so this cannot fail.
    let mut m = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return Vec::new(),
    };
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// `(YYYYMMDD'T'HHMMSS'Z', YYYYMMDD)` in UTC.
pub fn amz_date(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}{m:02}{d:02}");
    let time = format!(
        "{date}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    );
    (time, date)
}

/// The request to sign.
pub struct Request<'a> {
    /// `GET` or `HEAD`.
    pub method: &'a str,
    /// The Host header (`host[:port]`).
    pub host: &'a str,
    /// The URI path as sent (already percent-encoded).
    pub path: &'a str,
    /// The canonical query string (sorted, encoded; empty for none).
    pub query: &'a str,
    /// Extra headers to sign, as `(lower-case name, value)`.
    pub signed: &'a [(&'a str, &'a str)],
}

/// The headers to add to a request: `x-amz-date`, `x-amz-content-sha256`,
/// `x-amz-security-token` (with a session token) and `authorization`.
pub fn sign(
    req: &Request<'_>,
    creds: &Credentials,
    region: &str,
    now: SystemTime,
) -> Vec<(String, String)> {
    sign_payload(req, creds, region, now, EMPTY_SHA256)
}

/// As [`sign`], for a request whose payload has the hex SHA-256
/// `payload_sha256`.
pub fn sign_payload(
    req: &Request<'_>,
    creds: &Credentials,
    region: &str,
    now: SystemTime,
    payload_sha256: &str,
) -> Vec<(String, String)> {
    let Request {
        method,
        host,
        path,
        query,
        signed,
    } = *req;
    let (amz, date) = amz_date(now);
    let mut headers: Vec<(String, String)> = vec![
        ("host".into(), host.into()),
        ("x-amz-content-sha256".into(), payload_sha256.into()),
        ("x-amz-date".into(), amz.clone()),
    ];
    if let Some(t) = &creds.session_token {
        headers.push(("x-amz-security-token".into(), t.clone()));
    }
    for (k, v) in signed {
        headers.push(((*k).to_ascii_lowercase(), v.trim().to_string()));
    }
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_names = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical =
        format!("{method}\n{path}\n{query}\n{canonical_headers}\n{signed_names}\n{payload_sha256}");
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let k_date = hmac(
        format!("AWS4{}", creds.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, b"s3");
    let k_signing = hmac(&k_service, b"aws4_request");
    let signature = hex::encode(hmac(&k_signing, to_sign.as_bytes()));
    let mut out: Vec<(String, String)> = headers
        .into_iter()
        .filter(|(k, _)| k.starts_with("x-amz-"))
        .collect();
    out.push((
        "authorization".into(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_names}, Signature={signature}",
            creds.access_key_id
        ),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates() {
        assert_eq!(
            amz_date(UNIX_EPOCH + Duration::from_secs(1_369_353_600)),
            ("20130524T000000Z".to_string(), "20130524".to_string())
        );
        assert_eq!(
            amz_date(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661)).0,
            "20000229T010101Z"
        );
    }

    /// The "GET Object" example of the S3 SigV4 documentation.
    #[test]
    fn documented_example() {
        let creds = Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let h = sign(
            &Request {
                method: "GET",
                host: "examplebucket.s3.amazonaws.com",
                path: "/test.txt",
                query: "",
                signed: &[("range", "bytes=0-9")],
            },
            &creds,
            "us-east-1",
            UNIX_EPOCH + Duration::from_secs(1_369_353_600),
        );
        let auth = &h.iter().find(|(k, _)| k == "authorization").unwrap().1;
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }
}
