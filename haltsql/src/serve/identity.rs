//! mTLS client identities: what a verified client certificate says about
//! its holder, and which `server.auth.mtls.identities` entry it matches.
//!
//! rustls has already verified the chain against `client_ca_file` when
//! this runs; only the leaf certificate's names are read here:
//! - `subject`: the subject distinguished name in RFC 4514 form, as
//!   `openssl x509 -noout -subject -nameopt RFC2253` prints it
//!   (`CN=orders-agent,O=Corp`: most specific first, `,` between RDNs, `+`
//!   inside one, no spaces), compared exactly;
//! - `dns_name`: a DNS subject alternative name, compared ignoring ASCII
//!   case (no wildcard expansion: `*.corp` matches only a SAN `*.corp`);
//! - `uri`: a URI subject alternative name (a SPIFFE ID, say), exactly.

use x509_parser::der_parser::asn1_rs::ToDer;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate, X509Name};

use crate::load::MtlsMatch;

/// The names of a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    pub subject: String,
    pub dns_names: Vec<String>,
    pub uris: Vec<String>,
}

impl PeerIdentity {
    /// Reads the names of a DER certificate; `None` when it does not parse
    /// (it then carries no identity).
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let mut dns_names = Vec::new();
        let mut uris = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(d) => dns_names.push((*d).to_string()),
                    GeneralName::URI(u) => uris.push((*u).to_string()),
                    _ => {}
                }
            }
        }
        Some(PeerIdentity {
            subject: rfc4514(cert.subject()),
            dns_names,
            uris,
        })
    }

    /// Whether this certificate matches `m`.
    pub fn matches(&self, m: &MtlsMatch) -> bool {
        match m {
            MtlsMatch::Subject(s) => self.subject == *s,
            MtlsMatch::DnsName(d) => self.dns_names.iter().any(|n| n.eq_ignore_ascii_case(d)),
            MtlsMatch::Uri(u) => self.uris.iter().any(|n| n == u),
        }
    }
}

fn short_name(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.4" => "SN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "street",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.12" => "title",
        "2.5.4.42" => "GN",
        "0.9.2342.19200300.100.1.1" => "UID",
        "0.9.2342.19200300.100.1.25" => "DC",
        "1.2.840.113549.1.9.1" => "emailAddress",
        _ => return None,
    })
}

/// RFC 4514 string form: RDNs in reverse order, short attribute names,
/// special characters escaped; unknown attributes as `OID=#<DER hex>`.
fn rfc4514(name: &X509Name<'_>) -> String {
    let rdns: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|atv| {
                    let oid = atv.attr_type().to_id_string();
                    match (short_name(&oid), atv.as_str()) {
                        (Some(short), Ok(v)) => format!("{short}={}", escape(v)),
                        _ => {
                            let der = atv.attr_value().to_der_vec().unwrap_or_default();
                            format!("{oid}=#{}", hex::encode(der))
                        }
                    }
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_rfc4514() {
        assert_eq!(escape("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape("#x "), "\\#x\\ ");
        assert_eq!(escape(" a"), "\\ a");
        assert_eq!(escape("plain name"), "plain name");
    }

    #[test]
    fn reads_subject_and_alternative_names_of_a_certificate() {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Corp, Inc.");
        dn.push(DnType::CommonName, "#agent");
        dn.push(DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 99999, 1]), "x");
        params.distinguished_name = dn;
        params.subject_alt_names = vec![
            SanType::DnsName("agent.corp.example".try_into().unwrap()),
            SanType::URI("spiffe://corp/sa/agent".try_into().unwrap()),
            SanType::IpAddress([127, 0, 0, 1].into()),
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let p = PeerIdentity::from_der(cert.der()).unwrap();
        // Reverse order, escaped values, an unknown attribute in hex.
        assert_eq!(
            p.subject,
            "1.3.6.1.4.1.99999.1=#0c0178,CN=\\#agent,O=Corp\\, Inc."
        );
        assert_eq!(p.dns_names, vec!["agent.corp.example".to_string()]);
        assert_eq!(p.uris, vec!["spiffe://corp/sa/agent".to_string()]);
        assert_eq!(PeerIdentity::from_der(b"not a certificate"), None);
    }

    #[test]
    fn matching_rules() {
        let p = PeerIdentity {
            subject: "CN=agent,O=Corp".into(),
            dns_names: vec!["Agent.Corp.Example".into()],
            uris: vec!["spiffe://corp/ns/a/sa/agent".into()],
        };
        assert!(p.matches(&MtlsMatch::Subject("CN=agent,O=Corp".into())));
        assert!(!p.matches(&MtlsMatch::Subject("O=Corp,CN=agent".into())));
        assert!(p.matches(&MtlsMatch::DnsName("agent.corp.example".into())));
        assert!(!p.matches(&MtlsMatch::DnsName("*.corp.example".into())));
        assert!(p.matches(&MtlsMatch::Uri("spiffe://corp/ns/a/sa/agent".into())));
        assert!(!p.matches(&MtlsMatch::Uri("spiffe://corp/ns/a/sa/Agent".into())));
    }
}
