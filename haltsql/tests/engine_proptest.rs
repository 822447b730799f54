//! Property tests for the verify engine, bounded so they run in `cargo test`.
//!
//! 1. Arbitrary input never crashes the engine and never yields an internal error.
//! 2. Queries generated from a small grammar that mention a forbidden table,
//!    column or function are always denied (soundness of the walk).

use std::collections::BTreeMap;

use haltsql::engine::{Code, Dialect, Policy, Rules, StatementKind, verify};
use proptest::prelude::*;

fn policy() -> Policy {
    let mut tables = BTreeMap::new();
    tables.insert(
        "app.orders".to_string(),
        Some(vec!["id".into(), "status".into(), "total_cents".into()]),
    );
    tables.insert(
        "app.customers".to_string(),
        Some(vec!["id".into(), "name".into()]),
    );
    Policy::new(&Rules {
        name: "prop".into(),
        dialect: Dialect::Postgres,
        search_path: vec!["app".into()],
        allowed_statements: vec![StatementKind::Select],
        require_limit_max: Some(100),
        tables,
        extra_functions: vec![],
        catalog: Default::default(),
    })
}

const FORBIDDEN: &[&str] = &["secrets", "email", "ssn", "pg_sleep"];

fn ident() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("id"),
        Just("status"),
        Just("name"),
        Just("total_cents"),
        Just("email"),
        Just("ssn"),
    ]
    .prop_map(String::from)
}

fn table() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("orders"),
        Just("customers"),
        Just("app.orders"),
        Just("secrets"),
        Just("\"orders\""),
    ]
    .prop_map(String::from)
}

fn qualifier() -> impl Strategy<Value = String> {
    prop_oneof![Just("t0"), Just("t1"), Just("orders"), Just("d0")].prop_map(String::from)
}

fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        ident(),
        (qualifier(), ident()).prop_map(|(q, c)| format!("{q}.{c}")),
        (0u32..1000).prop_map(|n| n.to_string()),
        Just("'x'".to_string()),
    ];
    leaf.prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop_oneof![Just("+"), Just("="), Just("AND"), Just("||")],
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (
                prop_oneof![
                    Just("lower"),
                    Just("coalesce"),
                    Just("pg_sleep"),
                    Just("count")
                ],
                inner.clone()
            )
                .prop_map(|(f, a)| format!("{f}({a})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("CASE WHEN {a} THEN {b} END")),
            (ident(), table(), inner.clone())
                .prop_map(|(c, t, w)| format!("(SELECT {c} FROM {t} WHERE {w} LIMIT 1)")),
            (inner.clone(), table())
                .prop_map(|(a, t)| format!("EXISTS (SELECT 1 FROM {t} WHERE {a})")),
            (inner, ident(), table()).prop_map(|(a, c, t)| format!("{a} IN (SELECT {c} FROM {t})")),
        ]
    })
}

fn from_item() -> impl Strategy<Value = String> {
    prop_oneof![
        (table(), 0..2u8).prop_map(|(t, i)| format!("{t} t{i}")),
        table(),
        (ident(), table(), expr())
            .prop_map(|(c, t, w)| format!("(SELECT {c} FROM {t} WHERE {w}) d0")),
    ]
}

fn query() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(expr(), 1..4),
        from_item(),
        prop::option::of((from_item(), expr())),
        prop::option::of(expr()),
        prop::option::of(expr()),
        prop::option::of(expr()),
        1u32..200,
    )
        .prop_map(|(items, from, join, wh, group, order, limit)| {
            let mut sql = format!("SELECT {} FROM {from}", items.join(", "));
            if let Some((j, on)) = join {
                sql.push_str(&format!(" JOIN {j} ON {on}"));
            }
            if let Some(w) = wh {
                sql.push_str(&format!(" WHERE {w}"));
            }
            if let Some(g) = group {
                sql.push_str(&format!(" GROUP BY {g}"));
            }
            if let Some(o) = order {
                sql.push_str(&format!(" ORDER BY {o}"));
            }
            sql.push_str(&format!(" LIMIT {limit}"));
            sql
        })
}

fn mentions_forbidden(sql: &str) -> bool {
    sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| FORBIDDEN.contains(&w))
}

/// 300 cases, or `HALTSQL_FUZZ_CASES` (`make fuzz` raises it).
fn fuzz_cases() -> u32 {
    std::env::var("HALTSQL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: fuzz_cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_crash(s in "\\PC{0,200}") {
        let d = verify(&policy(), &s);
        prop_assert!(!d.violations.iter().any(|v| v.code == Code::InternalError), "{:?}", d);
        prop_assert_eq!(d.allowed, d.violations.is_empty());
    }

    #[test]
    fn sql_like_noise_never_crashes(parts in prop::collection::vec(prop_oneof![
        Just("SELECT"), Just("FROM"), Just("("), Just(")"), Just(","), Just("orders"),
        Just("id"), Just("'"), Just("\""), Just("$$"), Just("/*"), Just("*/"), Just("--\n"),
        Just(";"), Just("WITH"), Just("AS"), Just("LIMIT"), Just("1"), Just("E'\\''"),
        Just("UNION"), Just("NOT"), Just("CASE"), Just("WHEN"), Just("THEN"), Just("END"),
        Just("::"), Just("["), Just("]"), Just("LATERAL"), Just("TABLE"), Just("*"),
    ], 0..80)) {
        let sql = parts.join(" ");
        let d = verify(&policy(), &sql);
        prop_assert!(!d.violations.iter().any(|v| v.code == Code::InternalError), "{:?}", d);
    }

    #[test]
    fn forbidden_names_are_always_denied(sql in query()) {
        let d = verify(&policy(), &sql);
        prop_assert!(!d.violations.iter().any(|v| v.code == Code::InternalError), "{:?}", d);
        if mentions_forbidden(&sql) {
            prop_assert!(!d.allowed, "allowed although it mentions a forbidden name: {}", sql);
        }
    }
}

/// The generator is not vacuous: some generated queries are allowed.
#[test]
fn generator_produces_allowed_queries() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = query();
    let mut allowed = 0;
    for _ in 0..400 {
        let Ok(tree) = strategy.new_tree(&mut runner) else {
            continue;
        };
        if verify(&policy(), &tree.current()).allowed {
            allowed += 1;
        }
    }
    assert!(allowed > 0, "no generated query was allowed");
}
