//! The verify engine: decides whether one SQL statement is allowed by a
//! policy. Deny by default: anything the engine does not understand is a
//! violation.
//!
//! The pipeline for one request:
//! 1. a size cap, then a PostgreSQL-faithful pre-scan ([`lexer`]) for
//!    nesting depth, token count and statement boundaries;
//! 2. sqlparser (pinned version) with a recursion limit, on a thread with a
//!    large stack ([`verify`], or in the server the runtime's threads and
//!    [`pool::VerifyPool`]);
//! 3. an explicit walk of the whole AST ([`walk`]) that checks statement
//!    kinds, tables, columns, functions, casts, CTE scopes and LIMIT.

mod from_load;
pub mod functions;
pub mod lexer;
pub mod pool;
mod walk;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqlparser::dialect::{
    Dialect as SqlDialect, GenericDialect, MySqlDialect, PostgreSqlDialect, SQLiteDialect,
};
use sqlparser::parser::{Parser, ParserError};

/// The statement kinds a policy allows: the loader's type (the engine
/// depends on the loader, not the other way round).
pub use crate::load::StatementKind;

/// Hard cap on the SQL text the engine looks at, whatever the HTTP limit.
pub const MAX_SQL_BYTES: usize = 1024 * 1024;
/// Deepest `(` / `[` nesting accepted by the pre-scan.
pub const MAX_NESTING: usize = 64;
/// Most tokens accepted by the pre-scan.
pub const MAX_TOKENS: usize = 50_000;
/// sqlparser's recursion limit.
pub const PARSER_RECURSION_LIMIT: usize = 64;
/// Deepest AST recursion the walker follows.
pub const MAX_WALK_DEPTH: usize = 400;
/// Most relations (tables, subqueries, functions) in one statement.
pub const MAX_RELATIONS: usize = 32;
/// Stack size of the threads that parse and walk.
pub const ENGINE_STACK_BYTES: usize = 64 * 1024 * 1024;

thread_local! {
    /// Set by [`mark_engine_stack`] on threads started with a stack of
    /// [`ENGINE_STACK_BYTES`].
    static ENGINE_STACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Declares that the current thread was started with a stack of
/// [`ENGINE_STACK_BYTES`], so the server may verify on it directly
/// ([`pool::VerifyPool::verify`]). Call it only from such a thread (the
/// server's runtime calls it in `on_thread_start`).
pub fn mark_engine_stack() {
    ENGINE_STACK.with(|c| c.set(true));
}

/// Whether [`mark_engine_stack`] was called on this thread.
pub(crate) fn on_engine_stack() -> bool {
    ENGINE_STACK.with(std::cell::Cell::get)
}

/// SQL dialect of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    #[default]
    Postgres,
    Mysql,
    Sqlite,
    Generic,
}

/// The engine's input: one policy, as resolved by the loader.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    /// Policy name, echoed in decisions.
    pub name: String,
    pub dialect: Dialect,
    /// Schemas for unqualified table names, in order (empty means `[public]`).
    pub search_path: Vec<String>,
    pub allowed_statements: Vec<StatementKind>,
    /// `require_limit.max`, when the policy requires a LIMIT.
    pub require_limit_max: Option<u64>,
    /// `schema.table` (or `table`, then the first search_path schema) to the
    /// columns that may be read or written; `None` allows every column.
    pub tables: BTreeMap<String, Option<Vec<String>>>,
    /// `functions.allow`: added to [`functions::DEFAULT_FUNCTIONS`].
    pub extra_functions: Vec<String>,
    /// The policy's catalog: `schema.table` to every column in table order.
    /// With it, names bind with certainty (empty: no catalog).
    pub catalog: BTreeMap<String, Vec<String>>,
}

/// A policy prepared for fast checking.
#[derive(Debug, Clone)]
pub struct Policy {
    name: String,
    dialect: Dialect,
    search_path: Vec<String>,
    allowed_statements: BTreeSet<StatementKind>,
    require_limit_max: Option<u64>,
    /// `schema.table` -> allowed columns (None: all); shared with each
    /// request's walk instead of copied.
    tables: BTreeMap<(String, String), Option<Arc<HashSet<String>>>>,
    /// Unqualified function names allowed.
    functions: HashSet<String>,
    /// Schema-qualified function names allowed exactly as written (`schema.name`).
    qualified_functions: HashSet<String>,
    /// Catalog columns of policy tables, in table order.
    catalog: BTreeMap<(String, String), Vec<String>>,
}

impl Policy {
    pub fn new(rules: &Rules) -> Self {
        let search_path = if rules.search_path.is_empty() {
            vec!["public".to_string()]
        } else {
            rules.search_path.clone()
        };
        let mut tables = BTreeMap::new();
        for (key, cols) in &rules.tables {
            let (schema, table) = match key.split_once('.') {
                Some((s, t)) => (s.to_string(), t.to_string()),
                None => (search_path[0].clone(), key.clone()),
            };
            let cols = cols
                .as_ref()
                .map(|c| Arc::new(c.iter().cloned().collect::<HashSet<_>>()));
            tables.insert((schema, table), cols);
        }
        let mut functions: HashSet<String> = functions::DEFAULT_FUNCTIONS
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut qualified_functions = HashSet::new();
        for f in &rules.extra_functions {
            if f.contains('.') {
                qualified_functions.insert(f.clone());
            } else {
                functions.insert(f.clone());
            }
        }
        let catalog = rules
            .catalog
            .iter()
            .filter_map(|(k, cols)| {
                let (s, t) = k.split_once('.')?;
                Some(((s.to_string(), t.to_string()), cols.clone()))
            })
            .collect();
        Policy {
            catalog,
            name: rules.name.clone(),
            dialect: rules.dialect,
            search_path,
            allowed_statements: rules.allowed_statements.iter().copied().collect(),
            require_limit_max: rules.require_limit_max,
            tables,
            functions,
            qualified_functions,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Violation codes (the contract's list plus a few of our own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    ParseError,
    MultipleStatements,
    StatementNotAllowed,
    TableNotAllowed,
    ColumnNotAllowed,
    WildcardNotAllowed,
    FunctionNotAllowed,
    LimitRequired,
    LimitTooLarge,
    LockingNotAllowed,
    TooComplex,
    /// Valid SQL the engine does not support; denied by default.
    SyntaxNotAllowed,
    /// The engine failed; denied.
    InternalError,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::ParseError => "parse_error",
            Code::MultipleStatements => "multiple_statements",
            Code::StatementNotAllowed => "statement_not_allowed",
            Code::TableNotAllowed => "table_not_allowed",
            Code::ColumnNotAllowed => "column_not_allowed",
            Code::WildcardNotAllowed => "wildcard_not_allowed",
            Code::FunctionNotAllowed => "function_not_allowed",
            Code::LimitRequired => "limit_required",
            Code::LimitTooLarge => "limit_too_large",
            Code::LockingNotAllowed => "locking_not_allowed",
            Code::TooComplex => "too_complex",
            Code::SyntaxNotAllowed => "syntax_not_allowed",
            Code::InternalError => "internal_error",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reason for a deny.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub code: Code,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
}

impl Violation {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Violation {
            code,
            message: message.into(),
            table: None,
            column: None,
        }
    }

    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = Some(table.into());
        self
    }

    pub fn column(mut self, column: impl Into<String>) -> Self {
        self.column = Some(column.into());
        self
    }
}

/// A verify decision, serialized exactly as the API's response body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    pub policy: String,
    /// The statement kind (`select`, `insert`, ..., or the first keyword of
    /// a statement kind that is not supported); null when unparsable.
    pub statement: Option<String>,
    pub violations: Vec<Violation>,
}

impl Decision {
    fn from_violations(
        policy: &str,
        statement: Option<String>,
        violations: Vec<Violation>,
    ) -> Self {
        Decision {
            allowed: violations.is_empty(),
            policy: policy.to_string(),
            statement,
            violations,
        }
    }

    fn deny(policy: &str, statement: Option<String>, v: Violation) -> Self {
        Self::from_violations(policy, statement, vec![v])
    }

    /// The violation codes, in order, without duplicates.
    pub fn codes(&self) -> Vec<Code> {
        let mut out = Vec::new();
        for v in &self.violations {
            if !out.contains(&v.code) {
                out.push(v.code);
            }
        }
        out
    }
}

/// Verify `sql` against `policy` on a fresh thread with a large stack.
/// For the CLI and tests; the server uses [`pool::VerifyPool::verify`].
pub fn verify(policy: &Policy, sql: &str) -> Decision {
    let result = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("haltsql-verify".into())
            .stack_size(ENGINE_STACK_BYTES)
            .spawn_scoped(scope, || verify_guarded(policy, sql))
            .map(|h| h.join())
    });
    match result {
        Ok(Ok(d)) => d,
        Ok(Err(_)) => internal_error(policy, "the verify thread failed"),
        Err(e) => internal_error(policy, &format!("cannot start the verify thread: {e}")),
    }
}

fn internal_error(policy: &Policy, what: &str) -> Decision {
    Decision::deny(
        &policy.name,
        None,
        Violation::new(Code::InternalError, what.to_string()),
    )
}

/// Verify on the current thread, catching panics. The caller must run on a
/// thread with a stack of [`ENGINE_STACK_BYTES`].
pub(crate) fn verify_guarded(policy: &Policy, sql: &str) -> Decision {
    match catch_unwind(AssertUnwindSafe(|| verify_here(policy, sql))) {
        Ok(d) => d,
        Err(_) => internal_error(policy, "the verify engine failed on this input"),
    }
}

fn verify_here(policy: &Policy, sql: &str) -> Decision {
    let name = policy.name.as_str();
    let checked = prescan(sql).and_then(|scan| {
        let sql = decode_unicode_idents(sql, &scan)?;
        let statement = parse_one(policy.dialect, &sql)?;
        Ok((scan, statement))
    });
    match checked {
        Ok((scan, statement)) => {
            let (kind, violations) =
                walk::check_statement(policy, &statement, scan.first_word.as_deref());
            Decision::from_violations(name, Some(kind), violations)
        }
        Err(v) => Decision::deny(name, None, v),
    }
}

/// The length cap and the lexer's pre-scan (nesting, token count), and
/// exactly one statement.
fn prescan(sql: &str) -> Result<lexer::Scan, Violation> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(Violation::new(
            Code::TooComplex,
            format!("SQL text longer than {MAX_SQL_BYTES} bytes"),
        ));
    }
    let scan = match lexer::scan(
        sql,
        lexer::ScanLimits {
            max_depth: MAX_NESTING,
            max_tokens: MAX_TOKENS,
        },
    ) {
        Ok(s) => s,
        Err(e @ (lexer::ScanError::TooDeep(_) | lexer::ScanError::TooManyTokens(_))) => {
            return Err(Violation::new(Code::TooComplex, e.to_string()));
        }
        Err(e) => return Err(Violation::new(Code::ParseError, e.to_string())),
    };
    match scan.statements {
        0 => Err(Violation::new(Code::ParseError, "no SQL statement")),
        1 => Ok(scan),
        n => Err(Violation::new(
            Code::MultipleStatements,
            format!("{n} statements; exactly one is allowed"),
        )),
    }
}

/// `U&"..."` identifiers, which sqlparser reads as `U & "..."`, decoded.
fn decode_unicode_idents<'s>(
    sql: &'s str,
    scan: &lexer::Scan,
) -> Result<std::borrow::Cow<'s, str>, Violation> {
    if scan.unicode_idents.is_empty() {
        return Ok(std::borrow::Cow::Borrowed(sql));
    }
    match lexer::decode_unicode_idents(sql, scan) {
        Ok(s) => Ok(std::borrow::Cow::Owned(s)),
        Err(e @ lexer::UnicodeIdentError::Uescape) => {
            Err(Violation::new(Code::SyntaxNotAllowed, e.to_string()))
        }
        Err(e) => Err(Violation::new(Code::ParseError, e.to_string())),
    }
}

/// Parses exactly one statement with the policy's dialect.
fn parse_one(dialect: Dialect, sql: &str) -> Result<sqlparser::ast::Statement, Violation> {
    // The dialects are unit structs: borrowed as statics, not boxed per call.
    let dialect: &dyn SqlDialect = match dialect {
        Dialect::Postgres => &PostgreSqlDialect {},
        Dialect::Mysql => &MySqlDialect {},
        Dialect::Sqlite => &SQLiteDialect {},
        Dialect::Generic => &GenericDialect {},
    };
    let parse = |limit: usize| {
        Parser::new(dialect)
            .with_recursion_limit(limit)
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_statements())
    };
    let too_deep = || {
        Violation::new(
            Code::TooComplex,
            "nesting exceeds the parser's recursion limit",
        )
    };
    let mut statements = match parse(PARSER_RECURSION_LIMIT) {
        Ok(s) => s,
        Err(ParserError::RecursionLimitExceeded) => return Err(too_deep()),
        Err(e) => {
            // sqlparser sometimes backtracks over a recursion-limit error and
            // reports a syntax error instead. If a deeper parse (sqlparser
            // grows its stack on the heap) gets further, the input was too
            // deep rather than wrong.
            return match parse(PARSER_RECURSION_LIMIT * 8) {
                Err(e2) if e2 == e => Err(Violation::new(Code::ParseError, e.to_string())),
                _ => Err(too_deep()),
            };
        }
    };
    match statements.len() {
        1 => Ok(statements.remove(0)),
        0 => Err(Violation::new(Code::ParseError, "no SQL statement")),
        n => Err(Violation::new(
            Code::MultipleStatements,
            format!("{n} statements; exactly one is allowed"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick_start() -> Policy {
        let mut tables = BTreeMap::new();
        tables.insert(
            "app.orders".to_string(),
            Some(vec!["id".into(), "status".into(), "total_cents".into()]),
        );
        Policy::new(&Rules {
            name: "orders-agent".into(),
            dialect: Dialect::Postgres,
            search_path: vec!["app".into()],
            allowed_statements: vec![StatementKind::Select],
            require_limit_max: Some(100),
            tables,
            extra_functions: vec![],
            catalog: BTreeMap::new(),
        })
    }

    #[test]
    fn decision_json_shape() {
        let d = verify(&quick_start(), "SELECT id, email FROM orders LIMIT 10");
        let v = serde_json::to_value(&d).unwrap_or_default();
        assert_eq!(v["allowed"], false);
        assert_eq!(v["policy"], "orders-agent");
        assert_eq!(v["statement"], "select");
        assert_eq!(v["violations"][0]["code"], "column_not_allowed");
        assert_eq!(v["violations"][0]["table"], "app.orders");
        assert_eq!(v["violations"][0]["column"], "email");
    }

    #[test]
    fn quick_start_allows() {
        let d = verify(&quick_start(), "SELECT id, status FROM orders LIMIT 10");
        assert!(d.allowed, "{d:?}");
        assert!(d.violations.is_empty());
    }
}
