//! DNS-1123 name checks shared by the `haltsql` crate and the operator.
//!
//! Kubernetes and DNS disagree on one point: Kubernetes checks an object
//! name (a DNS-1123 subdomain) without capping its labels, DNS caps each
//! label at 63 characters. Both rules are here, each named for what it is.

/// Longest DNS-1123 subdomain.
pub const MAX_SUBDOMAIN: usize = 253;

/// Longest DNS-1123 label.
pub const MAX_LABEL: usize = 63;

/// A DNS-1123 label, as Kubernetes checks namespace names: at most 63
/// lower-case letters, digits and `-`, starting and ending with a letter or
/// digit.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= MAX_LABEL && is_label_of_any_length(s)
}

/// A DNS-1123 subdomain, as Kubernetes checks object names (Secret names,
/// ...): at most 253 characters, labels as in [`is_dns1123_label`]
/// separated by dots, each label of any length. Such a name is also one
/// safe path component (no `/`, not `.` or `..`).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN && s.split('.').all(is_label_of_any_length)
}

/// A DNS-1123 subdomain whose every label is also a DNS-1123 label (at most
/// 63 characters): a host name as RFC 1123 and DNS allow it. What haltsql
/// requires of policy and bundle source names.
pub fn is_dns1123_hostname(s: &str) -> bool {
    is_dns1123_subdomain(s) && s.split('.').all(is_dns1123_label)
}

fn is_label_of_any_length(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert!(is_dns1123_label("prod"));
        assert!(is_dns1123_label("a-1"));
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(!is_dns1123_label(""));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label("a-"));
        assert!(!is_dns1123_label("Prod"));
        assert!(!is_dns1123_label("a_b"));
    }

    #[test]
    fn subdomains() {
        for ok in [
            "orders-agent",
            "prod.orders-agent",
            "haltsql-tokens",
            "a.b-c",
        ] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
            assert!(is_dns1123_hostname(ok), "{ok}");
        }
        for bad in ["Orders", "-a", "a..b", "a.", ".a", "", "a/b", ".", ".."] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
            assert!(!is_dns1123_hostname(bad), "{bad}");
        }
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
    }

    #[test]
    fn only_host_names_cap_their_labels() {
        let long_label = format!("{}.b", "a".repeat(64));
        assert!(is_dns1123_subdomain(&long_label));
        assert!(!is_dns1123_hostname(&long_label));
    }
}
