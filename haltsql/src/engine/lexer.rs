//! A small, iterative pre-scan of the SQL text that follows PostgreSQL's own
//! lexical rules (standard strings, `E''` strings, dollar quotes, quoted
//! identifiers, nested block comments).
//!
//! It runs before sqlparser and serves three purposes:
//! - cheap resource limits (nesting depth, token count) so that the parser
//!   and the AST walk only ever see inputs of bounded depth;
//! - an independent statement count: if PostgreSQL would see a statement
//!   boundary that sqlparser does not (a lexer differential), the input is
//!   denied;
//! - the first keyword, to name a statement kind without formatting the AST.

use thiserror::Error;

/// Why the pre-scan refused the input.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ScanError {
    #[error("the SQL text contains a NUL character")]
    Nul,
    #[error("unterminated {0}")]
    Unterminated(&'static str),
    #[error(
        "string literal ends at a different place depending on standard_conforming_strings (backslash before a quote)"
    )]
    AmbiguousBackslash,
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
    #[error("more than {0} tokens")]
    TooManyTokens(usize),
    #[error("unbalanced parentheses")]
    Unbalanced,
}

/// Limits for the pre-scan.
#[derive(Debug, Clone, Copy)]
pub struct ScanLimits {
    pub max_depth: usize,
    pub max_tokens: usize,
}

/// What the pre-scan found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scan {
    /// Non-empty statements separated by `;` (outside strings and comments).
    pub statements: usize,
    /// Deepest nesting of `(` and `[`.
    pub max_depth: usize,
    /// Number of tokens (approximate: each punctuation character counts).
    pub tokens: usize,
    /// The first word of the first statement, lower-cased.
    pub first_word: Option<String>,
    /// Byte ranges of `U&"..."` identifiers (prefix included).
    pub unicode_idents: Vec<(usize, usize)>,
    /// Whether the word `UESCAPE` occurs outside strings.
    pub uescape: bool,
}

/// Why a `U&"..."` identifier cannot be decoded.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum UnicodeIdentError {
    #[error("invalid Unicode escape in a U&\"...\" identifier")]
    Invalid,
    #[error(
        "UESCAPE is not supported: write U&\"...\" identifiers with the default backslash escape"
    )]
    Uescape,
}

/// Rewrite every `U&"..."` identifier found by [`scan`] as the plain quoted
/// identifier it stands for (`U&"\0065mail"` is `"email"`), as PostgreSQL
/// reads it. sqlparser does not know this form.
pub fn decode_unicode_idents(sql: &str, scan: &Scan) -> Result<String, UnicodeIdentError> {
    if scan.uescape {
        return Err(UnicodeIdentError::Uescape);
    }
    let mut out = String::with_capacity(sql.len());
    let mut last = 0;
    for &(start, end) in &scan.unicode_idents {
        out.push_str(sql.get(last..start).ok_or(UnicodeIdentError::Invalid)?);
        // Between `U&"` and the closing `"`; `""` is one quote.
        let body = sql
            .get(start + 3..end - 1)
            .ok_or(UnicodeIdentError::Invalid)?
            .replace("\"\"", "\"");
        let decoded = unescape(&body)?;
        if decoded.is_empty() || decoded.contains('\0') {
            return Err(UnicodeIdentError::Invalid);
        }
        out.push('"');
        out.push_str(&decoded.replace('"', "\"\""));
        out.push('"');
        last = end;
    }
    out.push_str(sql.get(last..).ok_or(UnicodeIdentError::Invalid)?);
    Ok(out)
}

fn unescape(body: &str) -> Result<String, UnicodeIdentError> {
    let mut out = String::new();
    let mut chars = body.chars();
    let mut pending_high: Option<u32> = None;
    while let Some(c) = chars.next() {
        if c != '\\' {
            if pending_high.is_some() {
                return Err(UnicodeIdentError::Invalid);
            }
            out.push(c);
            continue;
        }
        let digits = match chars.clone().next() {
            Some('\\') => {
                chars.next();
                if pending_high.is_some() {
                    return Err(UnicodeIdentError::Invalid);
                }
                out.push('\\');
                continue;
            }
            Some('+') => {
                chars.next();
                6
            }
            _ => 4,
        };
        let hex: String = chars.by_ref().take(digits).collect();
        if hex.len() != digits || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(UnicodeIdentError::Invalid);
        }
        let code = u32::from_str_radix(&hex, 16).map_err(|_| UnicodeIdentError::Invalid)?;
        match (pending_high.take(), code) {
            (None, 0xD800..=0xDBFF) => pending_high = Some(code),
            (Some(high), 0xDC00..=0xDFFF) => {
                let c = 0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00);
                out.push(char::from_u32(c).ok_or(UnicodeIdentError::Invalid)?);
            }
            (None, c) => out.push(char::from_u32(c).ok_or(UnicodeIdentError::Invalid)?),
            (Some(_), _) => return Err(UnicodeIdentError::Invalid),
        }
    }
    if pending_high.is_some() {
        return Err(UnicodeIdentError::Invalid);
    }
    Ok(out)
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

fn is_ident_cont(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// End (exclusive) of a quoted section starting after the opening quote at
/// `start`, where a doubled quote character is an escaped quote.
/// With `backslash`, a backslash escapes the next byte.
fn quoted_end(s: &[u8], start: usize, quote: u8, backslash: bool) -> Option<usize> {
    let mut i = start;
    while i < s.len() {
        let b = s[i];
        if backslash && b == b'\\' {
            i += 2;
            continue;
        }
        if b == quote {
            if i + 1 < s.len() && s[i + 1] == quote {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// Scan `sql` with PostgreSQL's lexical rules.
pub fn scan(sql: &str, limits: ScanLimits) -> Result<Scan, ScanError> {
    let s = sql.as_bytes();
    // PostgreSQL refuses NUL anywhere in a query; so do we.
    if s.contains(&0) {
        return Err(ScanError::Nul);
    }
    let mut out = Scan::default();
    let mut i = 0usize;
    let mut depth = 0usize;
    let mut tokens_in_stmt = 0usize;

    let bump = |out: &mut Scan, tokens_in_stmt: &mut usize| -> Result<(), ScanError> {
        out.tokens += 1;
        *tokens_in_stmt += 1;
        if out.tokens > limits.max_tokens {
            return Err(ScanError::TooManyTokens(limits.max_tokens));
        }
        Ok(())
    };

    while i < s.len() {
        let b = s[i];
        if b == 0 {
            return Err(ScanError::Nul);
        }
        if b.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if b == b'-' && s.get(i + 1) == Some(&b'-') {
            i = line_comment_end(s, i)?;
            continue;
        }
        if b == b'/' && s.get(i + 1) == Some(&b'*') {
            i = block_comment_end(s, i)?;
            continue;
        }
        if b == b';' {
            if tokens_in_stmt > 0 {
                out.statements += 1;
            }
            tokens_in_stmt = 0;
            i += 1;
            continue;
        }
        bump(&mut out, &mut tokens_in_stmt)?;
        // Standard string literal.
        if b == b'\'' {
            i = string_end(s, i + 1)?;
            continue;
        }
        // Quoted identifier.
        if b == b'"' {
            i = quoted_end(s, i + 1, b'"', false)
                .ok_or(ScanError::Unterminated("quoted identifier"))?;
            continue;
        }
        if b == b'$' {
            i = dollar_end(s, i)?;
            continue;
        }
        if is_ident_start(b) {
            let start = i;
            while i < s.len() && is_ident_cont(s[i]) {
                i += 1;
            }
            let word = &sql[start..i];
            if i - start == 1
                && let Some(end) = prefixed_literal_end(s, b, start, i, &mut out)?
            {
                i = end;
                continue;
            }
            if word.eq_ignore_ascii_case("uescape") {
                out.uescape = true;
            }
            if out.first_word.is_none() && out.statements == 0 {
                out.first_word = Some(word.to_ascii_lowercase());
            }
            continue;
        }
        if b.is_ascii_digit() || (b == b'.' && s.get(i + 1).is_some_and(|c| c.is_ascii_digit())) {
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_' || s[i] == b'.') {
                i += 1;
            }
            continue;
        }
        match b {
            b'(' | b'[' => {
                depth += 1;
                if depth > out.max_depth {
                    out.max_depth = depth;
                }
                if depth > limits.max_depth {
                    return Err(ScanError::TooDeep(limits.max_depth));
                }
            }
            b')' | b']' => {
                depth = depth.checked_sub(1).ok_or(ScanError::Unbalanced)?;
            }
            _ => {}
        }
        i += 1;
    }
    if tokens_in_stmt > 0 {
        out.statements += 1;
    }
    if depth != 0 {
        return Err(ScanError::Unbalanced);
    }
    Ok(out)
}

/// The end of a one-letter-prefixed literal whose prefix `b` is at `start`
/// and whose quote is at `i`: E'..', B'..', X'..', N'..', U&'..', U&".."
/// (recorded in `out.unicode_idents`); `None` when none starts there.
fn prefixed_literal_end(
    s: &[u8],
    b: u8,
    start: usize,
    i: usize,
    out: &mut Scan,
) -> Result<Option<usize>, ScanError> {
    let p = b.to_ascii_lowercase();
    if s.get(i) == Some(&b'\'') && matches!(p, b'e' | b'b' | b'x' | b'n') {
        let end = if p == b'e' {
            quoted_end(s, i + 1, b'\'', true).ok_or(ScanError::Unterminated("string literal"))?
        } else {
            string_end(s, i + 1)?
        };
        return Ok(Some(end));
    }
    if p == b'u' && s.get(i) == Some(&b'&') {
        match s.get(i + 1) {
            Some(b'\'') => {
                return Ok(Some(string_end(s, i + 2)?));
            }
            Some(b'"') => {
                let end = quoted_end(s, i + 2, b'"', false)
                    .ok_or(ScanError::Unterminated("quoted identifier"))?;
                out.unicode_idents.push((start, end));
                return Ok(Some(end));
            }
            _ => {}
        }
    }
    Ok(None)
}

/// The end of a `--` comment starting at `i` (the line break is left).
fn line_comment_end(s: &[u8], mut i: usize) -> Result<usize, ScanError> {
    while i < s.len() && s[i] != b'\n' && s[i] != b'\r' {
        if s[i] == 0 {
            return Err(ScanError::Nul);
        }
        i += 1;
    }
    Ok(i)
}

/// The end of a `/* */` comment starting at `i`, nested as in PostgreSQL.
fn block_comment_end(s: &[u8], mut i: usize) -> Result<usize, ScanError> {
    let mut nest = 1usize;
    i += 2;
    while nest > 0 {
        if i >= s.len() {
            return Err(ScanError::Unterminated("block comment"));
        }
        if s[i] == 0 {
            return Err(ScanError::Nul);
        }
        if s[i] == b'/' && s.get(i + 1) == Some(&b'*') {
            nest += 1;
            i += 2;
        } else if s[i] == b'*' && s.get(i + 1) == Some(&b'/') {
            nest -= 1;
            i += 2;
        } else {
            i += 1;
        }
    }
    Ok(i)
}

/// The end of what starts with `$` at `i`: a `$1` parameter, a
/// dollar-quoted string (`$$...$$`, `$tag$...$tag$`), or the `$` alone.
fn dollar_end(s: &[u8], i: usize) -> Result<usize, ScanError> {
    if s.get(i + 1).is_some_and(|c| c.is_ascii_digit()) {
        let mut i = i + 1;
        while i < s.len() && s[i].is_ascii_digit() {
            i += 1;
        }
        return Ok(i);
    }
    let mut j = i + 1;
    if j < s.len() && is_ident_start(s[j]) {
        j += 1;
        while j < s.len() && is_ident_cont(s[j]) && s[j] != b'$' {
            j += 1;
        }
    }
    if s.get(j) == Some(&b'$') {
        let tag = &s[i..=j];
        let body = j + 1;
        let close = find(s, body, tag).ok_or(ScanError::Unterminated("dollar quote"))?;
        if s[body..close].contains(&0) {
            return Err(ScanError::Nul);
        }
        return Ok(close + tag.len());
    }
    Ok(i + 1)
}

/// End of a standard (`'...'`) string literal. PostgreSQL treats a
/// backslash literally when `standard_conforming_strings` is on (the
/// default) and as an escape when it is off; the server's setting is not
/// known here, so a literal whose end differs between the two readings is
/// refused.
fn string_end(s: &[u8], start: usize) -> Result<usize, ScanError> {
    let conforming =
        quoted_end(s, start, b'\'', false).ok_or(ScanError::Unterminated("string literal"))?;
    let legacy = quoted_end(s, start, b'\'', true);
    if legacy != Some(conforming) {
        return Err(ScanError::AmbiguousBackslash);
    }
    Ok(conforming)
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: ScanLimits = ScanLimits {
        max_depth: 8,
        max_tokens: 1000,
    };

    #[test]
    fn counts_statements_like_postgres() {
        assert_eq!(scan("SELECT 1", L).map(|s| s.statements), Ok(1));
        assert_eq!(scan("SELECT 1;", L).map(|s| s.statements), Ok(1));
        assert_eq!(scan(";;SELECT 1;;", L).map(|s| s.statements), Ok(1));
        assert_eq!(scan("SELECT 1; SELECT 2", L).map(|s| s.statements), Ok(2));
        assert_eq!(scan("SELECT ';'", L).map(|s| s.statements), Ok(1));
        assert_eq!(scan("SELECT $$;$$", L).map(|s| s.statements), Ok(1));
        assert_eq!(scan("SELECT $a$ $$; $a$", L).map(|s| s.statements), Ok(1));
        assert_eq!(scan("SELECT E'\\'; x'", L).map(|s| s.statements), Ok(1));
        assert_eq!(
            scan("SELECT 1 /* /* */ ; */", L).map(|s| s.statements),
            Ok(1)
        );
        assert_eq!(scan("SELECT 1 -- ;\n", L).map(|s| s.statements), Ok(1));
        assert_eq!(scan("SELECT \"a;\"", L).map(|s| s.statements), Ok(1));
        assert_eq!(
            scan("SELECT a$b$; SELECT 1", L).map(|s| s.statements),
            Ok(2)
        );
        assert_eq!(scan("SELECT $1; SELECT 1", L).map(|s| s.statements), Ok(2));
    }

    #[test]
    fn refuses_ambiguous_and_broken_input() {
        assert_eq!(
            scan("SELECT 'x\\'' ; DROP TABLE t; --'", L),
            Err(ScanError::AmbiguousBackslash)
        );
        assert_eq!(
            scan("SELECT 'abc", L),
            Err(ScanError::Unterminated("string literal"))
        );
        assert_eq!(
            scan("SELECT 1 /* /* */", L),
            Err(ScanError::Unterminated("block comment"))
        );
        assert_eq!(scan("SELECT '\0'", L), Err(ScanError::Nul));
        assert_eq!(scan("SELECT ((1)", L), Err(ScanError::Unbalanced));
        assert_eq!(scan("SELECT 1)", L), Err(ScanError::Unbalanced));
        assert_eq!(
            scan(&format!("SELECT {}1{}", "(".repeat(9), ")".repeat(9)), L),
            Err(ScanError::TooDeep(8))
        );
        assert_eq!(
            scan(&"1+".repeat(600), L),
            Err(ScanError::TooManyTokens(1000))
        );
        // A backslash that does not change where the literal ends is fine.
        assert!(scan("SELECT 'a\\b'", L).is_ok());
    }

    #[test]
    fn first_word() {
        let s = scan("  /* c */ -- x\n copy t to stdout", L);
        assert_eq!(s.map(|s| s.first_word), Ok(Some("copy".to_string())));
    }
}
