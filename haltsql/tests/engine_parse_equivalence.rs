//! The engine drives sqlparser through `PrefixDialect`, which skips
//! sqlparser's typed-literal attempt where it cannot succeed
//! (`src/engine/prefix.rs`). That must change nothing: for every input
//! here, the statements (with their spans) or the error are the same as
//! with the plain dialect, for each of the four dialects and several
//! recursion limits.
//!
//! Corpus: every string literal of the engine's sources and its tests (the
//! adversarial cases, the oracle's queries and grid, the property tests'
//! pieces), each also upper-cased and cut short after every token, the
//! oracle grid's templates filled in, and random token sequences.

use haltsql::engine::{Dialect, PARSER_RECURSION_LIMIT, parse_debug};
use proptest::prelude::*;

const DIALECTS: [Dialect; 4] = [
    Dialect::Postgres,
    Dialect::Mysql,
    Dialect::Sqlite,
    Dialect::Generic,
];

const SOURCES: &[&str] = &[
    include_str!("../src/engine/mod.rs"),
    include_str!("../src/engine/walk.rs"),
    include_str!("../src/engine/lexer.rs"),
    include_str!("../src/engine/functions.rs"),
    include_str!("common/adversarial_cases.rs"),
    include_str!("engine_adversarial.rs"),
    include_str!("engine_oracle.rs"),
    include_str!("engine_proptest.rs"),
    include_str!("check_cli.rs"),
    include_str!("serve_api.rs"),
];

/// The string literals of Rust source text (plain and raw), unescaped well
/// enough for a corpus (`\n`, `\t`, `\\`, `\"`, `\'`; other escapes kept).
fn string_literals(src: &str) -> Vec<String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\'' => {
                // A char literal ('x', '\'', '"') or a lifetime: skip it.
                if b.get(i + 1) == Some(&b'\\') {
                    i += 4;
                } else if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
                && (i == 0 || !b[i - 1].is_ascii_alphanumeric() && b[i - 1] != b'_') =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let body_start = j + 1;
                match src[body_start..].find(&close) {
                    Some(k) => {
                        out.push(src[body_start..body_start + k].to_string());
                        i = body_start + k + close.len();
                    }
                    None => break,
                }
            }
            b'"' => {
                let mut s = String::new();
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' && j + 1 < b.len() {
                        match b[j + 1] {
                            b'n' => s.push('\n'),
                            b't' => s.push('\t'),
                            b'\\' => s.push('\\'),
                            b'"' => s.push('"'),
                            b'\'' => s.push('\''),
                            b'\n' => {
                                // A line continuation: drop the leading blanks.
                                j += 2;
                                while j < b.len() && b[j].is_ascii_whitespace() {
                                    j += 1;
                                }
                                continue;
                            }
                            c => {
                                s.push('\\');
                                s.push(c as char);
                            }
                        }
                        j += 2;
                        continue;
                    }
                    let len = src[j..].chars().next().map_or(1, char::len_utf8);
                    s.push_str(&src[j..j + len]);
                    j += len;
                }
                out.push(s);
                i = j + 1;
            }
            _ => i += 1,
        }
    }
    out
}

fn corpus() -> Vec<String> {
    let mut out: Vec<String> = SOURCES.iter().flat_map(|s| string_literals(s)).collect();
    out.sort();
    out.dedup();
    out
}

fn same(dialect: Dialect, sql: &str, limit: usize) -> Result<(), String> {
    let plain = parse_debug(dialect, sql, limit, false);
    let engine = parse_debug(dialect, sql, limit, true);
    if plain == engine {
        Ok(())
    } else {
        Err(format!(
            "{dialect:?}, recursion limit {limit}, input {sql:?}:\nplain:  {plain}\nengine: {engine}"
        ))
    }
}

fn check_all(inputs: &[String], dialects: &[Dialect], limits: &[usize]) {
    let mut failures = Vec::new();
    for sql in inputs {
        for &d in dialects {
            for &limit in limits {
                if let Err(e) = same(d, sql, limit) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences, the first:\n{}",
        failures.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_corpus_parses_the_same() {
    let corpus = corpus();
    assert!(corpus.len() > 1000, "only {} literals", corpus.len());
    check_all(
        &corpus,
        &DIALECTS,
        &[PARSER_RECURSION_LIMIT, PARSER_RECURSION_LIMIT * 8, 5],
    );
    let upper: Vec<String> = corpus.iter().map(|s| s.to_ascii_uppercase()).collect();
    check_all(&upper, &DIALECTS, &[PARSER_RECURSION_LIMIT]);
}

#[test]
fn every_cut_of_the_corpus_parses_the_same() {
    // Cut after each space: the error paths, from every position.
    let mut cuts = Vec::new();
    for sql in corpus().iter().filter(|s| s.len() < 400) {
        for (i, _) in sql.match_indices(' ') {
            cuts.push(sql[..i].to_string());
        }
    }
    check_all(
        &cuts,
        &[Dialect::Postgres, Dialect::Mysql],
        &[PARSER_RECURSION_LIMIT],
    );
}

#[test]
fn the_oracle_grid_parses_the_same() {
    let oracle = string_literals(include_str!("engine_oracle.rs"));
    let templates: Vec<&String> = oracle.iter().filter(|s| s.contains("{r}")).collect();
    let froms: Vec<&String> = oracle
        .iter()
        .filter(|s| s.ends_with(" f") || s.ends_with(" f(c)") || s.contains(" f JOIN "))
        .collect();
    let refs: Vec<&String> = oracle
        .iter()
        .filter(|s| s.len() < 40 && !s.contains('{'))
        .collect();
    assert!(templates.len() >= 10 && froms.len() >= 10 && refs.len() >= 30);
    let mut inputs = Vec::new();
    for t in &templates {
        for (k, from) in froms.iter().enumerate() {
            for r in refs.iter().skip(k % 3).step_by(3) {
                inputs.push(t.replace("{from}", from).replace("{r}", r));
            }
        }
    }
    check_all(&inputs, &[Dialect::Postgres], &[PARSER_RECURSION_LIMIT]);
}

/// Pieces that meet the skip's conditions and those that defeat it: type
/// keywords, `xml`, names followed by `.`, `(`, `[`, strings, `ARRAY`.
fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "SELECT",
        "FROM",
        "WHERE",
        "AND",
        "OR",
        "NOT",
        "LIMIT",
        "ORDER BY",
        "GROUP BY",
        "AS",
        "CAST(",
        "::",
        "id",
        "status",
        "name",
        "value",
        "\"q\"",
        "xml",
        "XML",
        "json",
        "DATE",
        "TIMESTAMP",
        "INTERVAL",
        "INT",
        "bool",
        "CHARACTER VARYING",
        "WITH TIME ZONE",
        "ARRAY",
        "ZEROFILL",
        "UNSIGNED",
        "SET",
        "TABLE",
        "NULL",
        "TRUE",
        "CASE",
        "WHEN",
        "THEN",
        "END",
        "EXISTS",
        "ANY",
        "TYPE",
        "BINARY",
        "MAP",
        "STRUCT",
        "orders",
        "t.",
        ".",
        ",",
        "(",
        ")",
        "[",
        "]",
        "'x'",
        "'2020-01-01'",
        "E'e'",
        "$$d$$",
        "X'ff'",
        "N'n'",
        "1",
        "1.5",
        "-",
        "+",
        "*",
        "/",
        "=",
        "<>",
        "<",
        ">=",
        "||",
        "%",
        "?",
        "$1",
        ":x",
        "@",
        "~",
        "!",
        "{",
        "}",
        ";",
        "IS",
        "IN",
        "BETWEEN",
        "LIKE",
        "COLLATE",
        "\"C\"",
        "date",
        "interval",
        "time",
        "u&'x'",
        "e",
        "b'01'",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_token_sequences_parse_the_same(
        pieces in prop::collection::vec(piece(), 1..24),
        sep in prop::sample::select(vec![" ", "", "\n"]),
        dialect in prop::sample::select(DIALECTS.to_vec()),
        limit in prop::sample::select(vec![3usize, 8, PARSER_RECURSION_LIMIT]),
    ) {
        let sql = format!("SELECT {}", pieces.join(sep));
        prop_assert!(same(dialect, &sql, limit).is_ok(), "{}", same(dialect, &sql, limit).err().unwrap_or_default());
        let bare = pieces.join(sep);
        prop_assert!(same(dialect, &bare, limit).is_ok(), "{}", same(dialect, &bare, limit).err().unwrap_or_default());
    }
}
