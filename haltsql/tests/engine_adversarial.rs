//! Table-driven adversarial suite for the verify engine: bypass attempts
//! that must be denied, and legitimate queries that must be allowed.

#[path = "common/adversarial_cases.rs"]
mod cases;

use Code::*;
use P::*;
use Want::*;
use cases::*;
use haltsql::engine::{Code, Decision, Policy, verify};

fn policy(p: P) -> Policy {
    match p {
        Read => read_policy(),
        Write => write_policy(),
    }
}

fn check(name: &str, p: P, sql: &str, want: Want) -> Result<(), String> {
    let d: Decision = verify(&policy(p), sql);
    match want {
        Allow if d.allowed && d.violations.is_empty() => Ok(()),
        Deny(code) if !d.allowed && d.violations.iter().any(|v| v.code == code) => Ok(()),
        _ => Err(format!(
            "{name}: {sql:?}\n   wanted {want:?}, got allowed={} {:?}",
            d.allowed, d.violations
        )),
    }
}

#[test]
fn adversarial_table() {
    assert!(CASES.len() >= 100, "only {} cases", CASES.len());
    let denied = CASES.iter().filter(|c| matches!(c.3, Deny(_))).count();
    assert!(denied >= 100, "only {denied} deny cases");
    let failures: Vec<String> = CASES
        .iter()
        .filter_map(|(name, p, sql, want)| check(name, *p, sql, *want).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

/// The violation names the table and the column.
#[test]
fn column_violation_names_table_and_column() {
    let d = verify(
        &read_policy(),
        "SELECT id FROM orders WHERE email = 'x' LIMIT 1",
    );
    assert!(!d.allowed);
    let v = d
        .violations
        .iter()
        .find(|v| v.code == ColumnNotAllowed)
        .cloned();
    let v = v.unwrap_or_else(|| panic!("no column violation in {d:?}"));
    assert_eq!(v.table.as_deref(), Some("app.orders"));
    assert_eq!(v.column.as_deref(), Some("email"));
    assert!(v.message.contains("email"), "{}", v.message);

    let d = verify(&read_policy(), "SELECT 1 FROM secrets LIMIT 1");
    assert_eq!(d.violations.len(), 1, "{d:?}");
    assert_eq!(d.violations[0].code, TableNotAllowed);
    assert_eq!(d.violations[0].table.as_deref(), Some("app.secrets"));
}

#[test]
fn statement_kind_is_reported() {
    let d = verify(&read_policy(), "COPY orders TO STDOUT");
    assert_eq!(d.statement.as_deref(), Some("copy"));
    let d = verify(&write_policy(), "DELETE FROM orders WHERE id = 1");
    assert_eq!(d.statement.as_deref(), Some("delete"));
    assert!(d.allowed, "{d:?}");
    let d = verify(&read_policy(), "SELECT (");
    assert_eq!(d.statement, None);
}

// ---------------------------------------------------------------- resource exhaustion

fn assert_too_complex(sql: &str) {
    let d = verify(&read_policy(), sql);
    assert!(!d.allowed);
    assert!(
        d.violations.iter().any(|v| v.code == TooComplex),
        "{:?}",
        d.violations
    );
}

#[test]
fn deep_parentheses() {
    let n = 100_000;
    assert_too_complex(&format!(
        "SELECT {}1{} LIMIT 1",
        "(".repeat(n),
        ")".repeat(n)
    ));
}

#[test]
fn deep_subqueries() {
    let mut sql = "SELECT 1".to_string();
    for _ in 0..60 {
        sql = format!("SELECT * FROM ({sql}) s");
    }
    assert_too_complex(&format!("{sql} LIMIT 1"));
}

#[test]
fn long_operator_chain() {
    // Parsed iteratively into a left-deep tree: the walker's depth cap applies.
    assert_too_complex(&format!("SELECT {}1 LIMIT 1", "1 + ".repeat(5_000)));
    // Past the token cap.
    assert_too_complex(&format!("SELECT {}1 LIMIT 1", "1+".repeat(60_000)));
}

#[test]
fn deep_prefix_operators() {
    assert_too_complex(&format!("SELECT {}true LIMIT 1", "NOT ".repeat(10_000)));
    assert_too_complex(&format!("SELECT {}1 LIMIT 1", "- ".repeat(10_000)));
}

#[test]
fn nested_case() {
    let mut e = "1".to_string();
    for _ in 0..200 {
        e = format!("CASE WHEN true THEN {e} END");
    }
    assert_too_complex(&format!("SELECT {e} LIMIT 1"));
}

#[test]
fn huge_input() {
    let sql = format!(
        "SELECT id FROM orders WHERE status = '{}' LIMIT 1",
        "x".repeat(2 << 20)
    );
    assert_too_complex(&sql);
}

#[test]
fn large_but_flat_input_is_fine() {
    let list: Vec<String> = (0..5_000).map(|i| i.to_string()).collect();
    let sql = format!(
        "SELECT id FROM orders WHERE id IN ({}) LIMIT 1",
        list.join(", ")
    );
    let d = verify(&read_policy(), &sql);
    assert!(d.allowed, "{:?}", d.violations);
}
