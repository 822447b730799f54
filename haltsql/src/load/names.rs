//! Name rules shared by the documents (the DNS-1123 rules are in the
//! `haltsql-names` crate, shared with the operator).

/// Longest SQL identifier a policy may name.
pub const MAX_IDENTIFIER: usize = 128;

/// A lower-case SQL identifier: `[a-z_][a-z0-9_$]*`, at most 128 bytes.
///
/// The verify engine folds unquoted identifiers to lower case, so policies
/// name tables, columns, schemas and functions in lower case.
pub fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_IDENTIFIER
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'$')
}

/// The rule text used in messages about identifiers.
pub const IDENTIFIER_RULE: &str =
    "a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)";

/// A token name: letters, digits, `.`, `_`, `-`, starting with a letter or
/// digit, at most 253 characters.
pub fn is_token_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("orders"));
        assert!(is_identifier("_x$1"));
        assert!(!is_identifier("Orders"));
        assert!(!is_identifier("1x"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(&"a".repeat(129)));
    }
}
