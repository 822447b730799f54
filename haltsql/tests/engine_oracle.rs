//! The verify engine's differential oracle: PostgreSQL itself.
//!
//! A real PostgreSQL (started by `hack/postgres.sh`, which `make test` runs;
//! its unix socket directory in `HALTSQL_ORACLE_PGHOST`) gets a schema made
//! from the adversarial suite's policy: every listed table with its listed
//! columns plus columns the policy does not list, tables the policy does not
//! list, and one role per policy whose privileges are exactly the policy
//! (column grants; EXECUTE revoked from PUBLIC on every function, then
//! granted on the engine's default list, `functions.allow`, and the functions
//! behind operators, casts, type input/output and the SQL syntax the engine
//! allows).
//!
//! Every query is verified by the engine and run by PostgreSQL under the
//! policy's role, in a rolled-back transaction (read-only for select
//! policies) with a statement timeout:
//! - engine allows, PostgreSQL refuses for permissions (42501, or 25006 when
//!   a select policy's query tried to write): a **bypass**, the test fails;
//! - engine denies, PostgreSQL runs it: an **over-block**, counted, printed
//!   and sorted by the contract rule that justifies it; one that no rule
//!   justifies fails the test.
//!
//! Queries: the adversarial suite, mutations of it (case, quoting, nesting,
//! moved into EXISTS / LATERAL / CTE / scalar subqueries under an outer
//! table), a generated grid of outer-reference and attribute-notation
//! attacks, and SQLsmith (Debian's `sqlsmith`) against the same schema.
//!
//! Knobs: `HALTSQL_ORACLE_SQLSMITH_QUERIES` (default 1000),
//! `HALTSQL_ORACLE_SEED` (default 14), `HALTSQL_ORACLE_PGPORT` (5432),
//! `HALTSQL_ORACLE_VERBOSE=1` prints every over-block.

#[path = "common/adversarial_cases.rs"]
mod cases;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

use cases::{CASES, P, rules};
use haltsql::engine::functions::DEFAULT_FUNCTIONS;
use haltsql::engine::{Code, Decision, Policy, StatementKind, verify};
use postgres::error::SqlState;
use postgres::{Client, NoTls};

const DB: &str = "haltsql_oracle";

/// Functions PostgreSQL calls for SQL syntax the engine allows as syntax
/// (EXTRACT, SUBSTRING, TRIM, POSITION, OVERLAY, AT TIME ZONE, CEIL, FLOOR,
/// LIKE/SIMILAR ... ESCAPE, IS NORMALIZED).
const SYNTAX_FUNCTIONS: &[&str] = &[
    "extract",
    "date_part",
    "substring",
    "btrim",
    "ltrim",
    "rtrim",
    "position",
    "overlay",
    "timezone",
    "ceil",
    "floor",
    "like_escape",
    "similar_to_escape",
    "similar_escape",
    "is_normalized",
    "normalize",
];

/// Columns every listed table gets on top of its listed ones.
const EXTRA_COLUMNS: &[&str] = &["email", "secret", "ssn", "password", "notes"];

/// Columns of tables the policy lists without a column list.
const OPEN_TABLE_COLUMNS: &[&str] = &["id", "name", "price_cents", "description", "email"];

fn column_type(c: &str) -> &'static str {
    match c {
        "day" => "date",
        "created_at" => "timestamptz",
        c if c == "id" || c.ends_with("_id") || c.ends_with("_cents") || c == "revenue" => "bigint",
        _ => "text",
    }
}

/// Every column of a policy table in the oracle's schema, in table order.
fn table_columns(listed: &Option<Vec<String>>) -> Vec<String> {
    let mut all: Vec<String> = match listed {
        Some(c) => c.clone(),
        None => OPEN_TABLE_COLUMNS.iter().map(|s| s.to_string()).collect(),
    };
    if listed.is_some() {
        for e in EXTRA_COLUMNS {
            if !all.iter().any(|c| c == e) {
                all.push(e.to_string());
            }
        }
    }
    all
}

/// The policy with a catalog that describes the oracle's schema exactly.
fn with_catalog(kinds: Vec<StatementKind>, limit: Option<u64>) -> Policy {
    let mut r = rules(kinds, limit);
    r.catalog = r
        .tables
        .iter()
        .map(|(key, cols)| {
            let key = match key.split_once('.') {
                Some(_) => key.clone(),
                None => format!("{}.{key}", r.search_path[0]),
            };
            (key, table_columns(cols))
        })
        .collect();
    Policy::new(&r)
}

struct Role {
    name: &'static str,
    policy: Policy,
    write: bool,
}

fn setup_sql(roles: &[(&str, &[StatementKind])]) -> String {
    let r = rules(vec![StatementKind::Select], None);
    let search_path = r.search_path.join(", ");
    let mut sql = String::new();
    let mut schemas: Vec<String> = r.search_path.clone();
    schemas.push("public".into());
    for (key, _) in r.tables.iter() {
        if let Some((s, _)) = key.split_once('.')
            && !schemas.contains(&s.to_string())
        {
            schemas.push(s.to_string());
        }
    }
    for s in &schemas {
        sql += &format!("CREATE SCHEMA IF NOT EXISTS {s};\n");
    }
    let role_names: Vec<&str> = roles.iter().map(|(n, _)| *n).collect();
    let all_roles = role_names.join(", ");
    sql += &format!(
        "REVOKE ALL ON DATABASE {DB} FROM PUBLIC; REVOKE ALL ON SCHEMA public FROM PUBLIC;\n"
    );
    for n in &role_names {
        sql += &format!(
            "GRANT CONNECT ON DATABASE {DB} TO {n}; ALTER ROLE {n} IN DATABASE {DB} SET search_path = {search_path};\n"
        );
    }
    sql += &format!(
        "GRANT USAGE ON SCHEMA {} TO {all_roles};\n",
        schemas.join(", ")
    );
    for (key, cols) in &r.tables {
        let (schema, table) = match key.split_once('.') {
            Some((s, t)) => (s.to_string(), t.to_string()),
            None => (r.search_path[0].clone(), key.clone()),
        };
        let all = table_columns(cols);
        let defs: Vec<String> = all
            .iter()
            .map(|c| format!("{c} {}", column_type(c)))
            .collect();
        sql += &format!("CREATE TABLE {schema}.{table} ({});\n", defs.join(", "));
        let values: Vec<String> = all
            .iter()
            .map(|c| match column_type(c) {
                "bigint" => "1".to_string(),
                "date" => "'2026-01-01'".to_string(),
                "timestamptz" => "'2026-01-01 00:00:00+00'".to_string(),
                _ => format!("'{c}-value'"),
            })
            .collect();
        for _ in 0..3 {
            sql += &format!(
                "INSERT INTO {schema}.{table} VALUES ({});\n",
                values.join(", ")
            );
        }
        for (role, kinds) in roles {
            for kind in kinds.iter() {
                let priv_ = kind.as_str().to_ascii_uppercase();
                match (cols, kind) {
                    (_, StatementKind::Delete) | (None, _) => {
                        sql += &format!("GRANT {priv_} ON {schema}.{table} TO {role};\n")
                    }
                    (Some(c), _) => {
                        sql += &format!(
                            "GRANT {priv_} ({}) ON {schema}.{table} TO {role};\n",
                            c.join(", ")
                        )
                    }
                }
            }
        }
    }
    // Tables and objects the policy does not list.
    sql += "CREATE TABLE app.secrets (id bigint, secret text); INSERT INTO app.secrets VALUES (1, 's');\n";
    sql += "CREATE TABLE reporting.orders (id bigint, email text); INSERT INTO reporting.orders VALUES (1, 'e');\n";
    sql += "CREATE TABLE public.orders (id bigint, email text); INSERT INTO public.orders VALUES (1, 'e');\n";
    sql += "CREATE SEQUENCE app.orders_seq;\n";
    sql += "CREATE FUNCTION app.safe_fn(x bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS 'SELECT x';\n";
    sql += "CREATE FUNCTION app.unsafe_fn(x bigint) RETURNS bigint LANGUAGE sql IMMUTABLE AS 'SELECT x';\n";
    // Functions: nothing for PUBLIC, then exactly what the engine allows.
    sql += &format!(
        "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pg_catalog, information_schema, {} FROM PUBLIC;\n",
        schemas.join(", ")
    );
    let mut names: Vec<String> = DEFAULT_FUNCTIONS.iter().map(|s| s.to_string()).collect();
    names.extend(SYNTAX_FUNCTIONS.iter().map(|s| s.to_string()));
    let mut qualified = Vec::new();
    for f in &r.extra_functions {
        match f.split_once('.') {
            Some(_) => qualified.push(f.clone()),
            None => names.push(f.clone()),
        }
    }
    let list = names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(",");
    sql += &format!(
        "DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT p.oid::regprocedure AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'pg_catalog' AND p.prokind IN ('f', 'a', 'w')
      AND (p.proname = ANY (ARRAY[{list}])
           OR p.oid IN (SELECT oprcode::oid FROM pg_operator)
           OR p.oid IN (SELECT castfunc FROM pg_cast)
           OR p.oid IN (SELECT typinput FROM pg_type UNION SELECT typoutput FROM pg_type))
  LOOP EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {all_roles}', r.f); END LOOP;
END $$;\n"
    );
    for q in qualified {
        sql += &format!(
            "DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT p.oid::regprocedure AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname || '.' || p.proname = '{q}'
  LOOP EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {all_roles}', r.f); END LOOP;
END $$;\n"
        );
    }
    sql
}

fn config(host: &str, port: u16, user: &str, db: &str) -> postgres::Config {
    let mut c = postgres::Config::new();
    c.host_path(host).port(port).user(user).dbname(db);
    c.connect_timeout(std::time::Duration::from_secs(10));
    c
}

struct Oracle {
    host: String,
    port: u16,
    clients: BTreeMap<&'static str, Client>,
}

/// What PostgreSQL did with a query.
#[derive(Debug)]
enum Pg {
    Ran,
    Refused(String),
    Failed,
    NotRun,
}

impl Oracle {
    fn client(&mut self, role: &'static str) -> &mut Client {
        let closed = self.clients.get(role).is_none_or(|c| c.is_closed());
        if closed {
            let c = config(&self.host, self.port, role, DB)
                .connect(NoTls)
                .unwrap_or_else(|e| panic!("connect as {role}: {e}"));
            self.clients.insert(role, c);
        }
        self.clients.get_mut(role).unwrap()
    }

    fn run(&mut self, role: &'static str, write: bool, sql: &str) -> Pg {
        let c = self.client(role);
        let begin = if write { "BEGIN" } else { "BEGIN READ ONLY" };
        if let Err(_e) = c.batch_execute(&format!(
            "{begin}; SET LOCAL statement_timeout = 2000; SET LOCAL lock_timeout = 500"
        )) {
            return Pg::Failed;
        }
        let r = c.query(sql, &[]);
        let _ = c.batch_execute("ROLLBACK");
        match r {
            Ok(_) => Pg::Ran,
            Err(e) => {
                let msg = e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_else(|| e.to_string());
                match e.code() {
                    Some(c)
                        if *c == SqlState::INSUFFICIENT_PRIVILEGE
                            || *c == SqlState::READ_ONLY_SQL_TRANSACTION =>
                    {
                        Pg::Refused(msg)
                    }
                    _ => Pg::Failed,
                }
            }
        }
    }
}

/// The contract rule that justifies an over-block, or None.
fn justification(d: &Decision) -> Option<&'static str> {
    let codes = d.codes();
    let has = |c: Code| codes.contains(&c);
    if has(Code::MultipleStatements) {
        return Some("exactly one statement");
    }
    if has(Code::StatementNotAllowed) {
        return Some("statement kind not allowed");
    }
    if has(Code::ParseError) || has(Code::SyntaxNotAllowed) {
        return Some("syntax the engine does not model (deny by default)");
    }
    if has(Code::TooComplex) {
        return Some("too_complex");
    }
    if has(Code::LockingNotAllowed) {
        return Some("locking clause");
    }
    if has(Code::LimitRequired) || has(Code::LimitTooLarge) {
        return Some("require_limit");
    }
    if has(Code::FunctionNotAllowed) {
        return Some("function or cast not on the allow-list");
    }
    if has(Code::WildcardNotAllowed) {
        return Some("* or whole-row reference on a table with a column list");
    }
    if has(Code::TableNotAllowed) {
        return Some("table not listed, or not resolvable with certainty");
    }
    let uncertain = d.violations.iter().all(|v| {
        v.code == Code::ColumnNotAllowed
            && (v.message.contains("certain") || v.message.contains("system column"))
    });
    if uncertain {
        return Some("name not bound with certainty, or a system column");
    }
    None
}

#[derive(Default)]
struct Tally {
    tried: usize,
    run: usize,
    agree_allow: usize,
    agree_deny: usize,
    allowed_pg_error: usize,
    bypasses: Vec<String>,
    over_blocks: BTreeMap<&'static str, Vec<String>>,
    unjustified: Vec<String>,
}

impl Tally {
    fn merge(&mut self, x: Tally) {
        self.tried += x.tried;
        self.run += x.run;
        self.agree_allow += x.agree_allow;
        self.agree_deny += x.agree_deny;
        self.allowed_pg_error += x.allowed_pg_error;
        self.bypasses.extend(x.bypasses);
        self.unjustified.extend(x.unjustified);
        for (k, v) in x.over_blocks {
            self.over_blocks.entry(k).or_default().extend(v);
        }
    }

    fn over_block_count(&self) -> usize {
        self.over_blocks.values().map(Vec::len).sum::<usize>() + self.unjustified.len()
    }
}

fn check(oracle: &mut Oracle, role: &Role, origin: &str, sql: &str, t: &mut Tally) {
    t.tried += 1;
    let d = verify(&role.policy, sql);
    let kind = d.statement.as_deref().unwrap_or("");
    let runnable = ["select", "insert", "update", "delete"].contains(&kind);
    let pg = if runnable {
        t.run += 1;
        oracle.run(role.name, role.write, sql)
    } else {
        Pg::NotRun
    };
    match (&pg, d.allowed) {
        (Pg::Refused(m), true) => t.bypasses.push(format!(
            "[{origin}] {} allowed, PostgreSQL refused ({m}): {sql}",
            role.name
        )),
        (Pg::Ran, true) => t.agree_allow += 1,
        (Pg::Failed, true) => t.allowed_pg_error += 1,
        (Pg::NotRun, true) => t.bypasses.push(format!(
            "[{origin}] {} allowed a {kind:?} statement: {sql}",
            role.name
        )),
        (Pg::Ran, false) => {
            let line = format!(
                "[{origin}] {}: {:?}: {sql}",
                role.name,
                d.violations
                    .iter()
                    .map(|v| format!("{}: {}", v.code, v.message))
                    .collect::<Vec<_>>()
            );
            match justification(&d) {
                Some(j) => t.over_blocks.entry(j).or_default().push(line),
                None => t.unjustified.push(line),
            }
        }
        (_, false) => t.agree_deny += 1,
    }
}

/// Connections that run queries at once.
const WORKERS: usize = 3;

/// Check `jobs` on [`WORKERS`] connections.
fn run_jobs(jobs: &[(&Role, String, String)], host: &str, port: u16) -> Tally {
    let chunk = jobs.len().div_ceil(WORKERS).max(1);
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut oracle = Oracle {
                        host: host.to_string(),
                        port,
                        clients: BTreeMap::new(),
                    };
                    let mut t = Tally::default();
                    for (r, origin, sql) in part {
                        check(&mut oracle, r, origin, sql, &mut t);
                    }
                    t
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut t = Tally::default();
    for x in tallies {
        t.merge(x);
    }
    t
}

/// Apply `f` to the text outside string literals and quoted identifiers.
fn outside_quotes(sql: &str, f: impl Fn(&str) -> String) -> String {
    let mut out = String::new();
    let mut plain = String::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' || c == '"' || c == '$' {
            out += &f(&plain);
            plain.clear();
            if c == '$' {
                // Leave dollar quotes and parameters alone: copy the rest.
                out.push(c);
                out.extend(chars.by_ref());
                break;
            }
            out.push(c);
            for d in chars.by_ref() {
                out.push(d);
                if d == c {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    out += &f(&plain);
    out
}

/// Quote every whole-word occurrence of `names` (outside quotes).
fn quote_names(sql: &str, names: &[&str]) -> String {
    outside_quotes(sql, |s| {
        let mut out = String::new();
        let mut word = String::new();
        let flush = |word: &mut String, out: &mut String| {
            let lower = word.to_ascii_lowercase();
            if names.contains(&lower.as_str()) {
                out.push('"');
                out.push_str(&lower);
                out.push('"');
            } else {
                out.push_str(word);
            }
            word.clear();
        };
        for c in s.chars() {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
            } else {
                flush(&mut word, &mut out);
                out.push(c);
            }
        }
        flush(&mut word, &mut out);
        out
    })
}

const QUOTABLE: &[&str] = &[
    "orders",
    "customers",
    "products",
    "daily",
    "app",
    "reporting",
    "id",
    "status",
    "email",
    "secret",
    "name",
    "total_cents",
    "pg_sleep",
    "current_setting",
    "lower",
    "count",
    "nextval",
    "ctid",
    "unnest",
];

fn mutations(sql: &str) -> Vec<(&'static str, String)> {
    let q = sql.trim().trim_end_matches(';').trim();
    let mut out = vec![
        ("upper", outside_quotes(q, |s| s.to_ascii_uppercase())),
        ("quoted", quote_names(q, QUOTABLE)),
    ];
    let lower = q.to_ascii_lowercase();
    if lower.starts_with("select") || lower.starts_with("with") || lower.starts_with("(") {
        out.push((
            "exists",
            format!("SELECT o.id FROM orders o WHERE EXISTS ({q}) LIMIT 5"),
        ));
        out.push((
            "lateral",
            format!("SELECT o.id FROM orders o, LATERAL ({q}) s LIMIT 5"),
        ));
        out.push(("cte", format!("WITH c AS ({q}) SELECT 1 FROM c LIMIT 5")));
        out.push((
            "scalar",
            format!("SELECT (SELECT count(*) FROM ({q}) s) FROM orders o LIMIT 5"),
        ));
        out.push((
            "derived",
            format!("SELECT 1 FROM (SELECT 1 FROM customers c WHERE EXISTS ({q})) s LIMIT 5"),
        ));
    }
    out
}

/// The outer-reference and attribute-notation grid.
fn grid() -> Vec<(P, String)> {
    let froms = [
        "lower('x') f",
        "lower('x') AS f(c)",
        "lower('x') WITH ORDINALITY f",
        "unnest(ARRAY[1,2]) f",
        "unnest(ARRAY[1,2]) WITH ORDINALITY AS f(a, n)",
        "(SELECT 1) f",
        "(VALUES (1)) f(c)",
        "(VALUES (1)) f",
        "products f",
        "customers f",
        "app.safe_fn(1) f",
        "json_each('{}') f",
        "generate_series(1, 2) f",
        "(SELECT * FROM products) f",
        "reporting.daily f",
        "customers f JOIN products p ON p.id = f.id",
    ];
    let refs = [
        "email",
        "\"email\"",
        "EMAIL",
        "U&\"\\0065mail\"",
        "U&\"\\0063tid\"",
        "secret",
        "ctid",
        "xmin",
        "current_user",
        "current_schema",
        "current_role",
        "session_user",
        "orders",
        "o",
        "o.email",
        "f.email",
        "name",
        "id",
        "status",
        "f",
        "c",
        "ordinality",
        "o.to_json",
        "f.to_json",
        "f.row_to_json",
        "(f).to_jsonb",
        "f.lower",
        "(o.status).length",
        "('0.01').pg_sleep",
        "('max_connections').current_setting",
        "('app.orders_seq').nextval",
        "(o.id).unsafe_fn",
        "o.id.pg_sleep",
        "f.f",
        "f.name",
        "f.description",
    ];
    let reads = [
        "SELECT (SELECT {r} FROM {from} LIMIT 1) FROM orders o LIMIT 5",
        "SELECT o.id FROM orders o WHERE EXISTS (SELECT 1 FROM {from} WHERE {r} IS NOT NULL) LIMIT 5",
        "SELECT o.id FROM orders o, LATERAL (SELECT {r} AS v FROM {from}) s LIMIT 5",
        "SELECT o.id FROM orders o WHERE o.id IN (SELECT 1 FROM {from} ORDER BY {r} LIMIT 1) LIMIT 5",
        "SELECT (SELECT count(*) FROM {from} GROUP BY {r} LIMIT 1) FROM orders o LIMIT 5",
        "SELECT (WITH c AS (SELECT {r} AS v FROM {from}) SELECT count(*) FROM c) FROM orders o LIMIT 5",
        "SELECT {r} FROM {from} LIMIT 5",
    ];
    let writes = [
        "UPDATE orders o SET status = (SELECT {r}::text FROM {from} LIMIT 1) WHERE o.id = 1",
        "DELETE FROM orders o WHERE EXISTS (SELECT 1 FROM {from} WHERE {r} IS NOT NULL)",
        "INSERT INTO customers (id, name) SELECT 1, {r}::text FROM {from} LIMIT 1",
    ];
    let mut out = Vec::new();
    for from in froms {
        for r in refs {
            for t in reads {
                out.push((P::Read, t.replace("{from}", from).replace("{r}", r)));
            }
            for t in writes {
                out.push((P::Write, t.replace("{from}", from).replace("{r}", r)));
            }
        }
    }
    out
}

fn sqlsmith(host: &str, port: u16, n: usize, seed: u64) -> Vec<String> {
    let target = format!("host={host} port={port} user=postgres dbname={DB}");
    let out = Command::new("sqlsmith")
        .arg(format!("--target={target}"))
        .arg("--exclude-catalog")
        .arg("--dry-run")
        .arg(format!("--max-queries={n}"))
        .arg(format!("--seed={seed}"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run sqlsmith (hack/postgres.sh installs it): {e}"));
    assert!(
        out.status.success() || !out.stdout.is_empty(),
        "sqlsmith failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut queries = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        cur.push_str(line);
        cur.push('\n');
        if line.ends_with(';') {
            let q = cur.trim().trim_end_matches(';').trim().to_string();
            if !q.is_empty() {
                queries.push(q);
            }
            cur.clear();
        }
    }
    queries
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn postgres_is_the_judge() {
    let start = Instant::now();
    let host = std::env::var("HALTSQL_ORACLE_PGHOST").unwrap_or_else(|_| {
        panic!("HALTSQL_ORACLE_PGHOST is not set: start PostgreSQL with `hack/postgres.sh up` and export the socket directory it prints (make test does both)")
    });
    let port = env_num("HALTSQL_ORACLE_PGPORT", 5432) as u16;
    let smith_n = env_num("HALTSQL_ORACLE_SQLSMITH_QUERIES", 1000) as usize;
    let seed = env_num("HALTSQL_ORACLE_SEED", 14);
    let verbose = std::env::var("HALTSQL_ORACLE_VERBOSE").is_ok_and(|v| v == "1");

    // A fresh database and roles whose privileges are the policies.
    let mut admin = config(&host, port, "postgres", "postgres")
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("PostgreSQL at {host}: {e} (run hack/postgres.sh up)"));
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"))
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .unwrap();
    let read_kinds = [StatementKind::Select];
    let write_kinds = [
        StatementKind::Select,
        StatementKind::Insert,
        StatementKind::Update,
        StatementKind::Delete,
    ];
    for role in ["hs_read", "hs_write"] {
        admin
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            ))
            .unwrap();
    }
    let mut db = config(&host, port, "postgres", DB).connect(NoTls).unwrap();
    db.batch_execute(&setup_sql(&[
        ("hs_read", &read_kinds),
        ("hs_write", &write_kinds),
    ]))
    .unwrap_or_else(|e| panic!("schema setup: {e:?}"));
    let setup_done = start.elapsed();

    let read = Role {
        name: "hs_read",
        policy: cases::read_policy(),
        write: false,
    };
    let write = Role {
        name: "hs_write",
        policy: cases::write_policy(),
        write: true,
    };
    let read_nolimit = Role {
        name: "hs_read",
        policy: Policy::new(&rules(vec![StatementKind::Select], None)),
        write: false,
    };
    // The same policies with a catalog: names bind with certainty.
    let read_cat = Role {
        name: "hs_read",
        policy: with_catalog(vec![StatementKind::Select], Some(100)),
        write: false,
    };
    let write_cat = Role {
        name: "hs_write",
        policy: with_catalog(write_kinds.to_vec(), None),
        write: true,
    };
    let role = |p: P, catalog: bool| match (p, catalog) {
        (P::Read, false) => &read,
        (P::Write, false) => &write,
        (P::Read, true) => &read_cat,
        (P::Write, true) => &write_cat,
    };
    // Every (role, origin, query), then run on a few connections at once.
    let mut jobs: Vec<(&Role, String, String)> = Vec::new();
    for catalog in [false, true] {
        let tag = if catalog { "catalog " } else { "" };
        for (name, p, sql, _) in CASES {
            let r = role(*p, catalog);
            jobs.push((r, format!("{tag}suite: {name}"), sql.to_string()));
            for (how, m) in mutations(sql) {
                jobs.push((r, format!("{tag}mutation {how}: {name}"), m));
            }
        }
        for (p, sql) in grid() {
            jobs.push((role(p, catalog), format!("{tag}grid"), sql));
        }
    }
    let suite = jobs.len();
    // SQLsmith generates while the suite runs.
    let smith_start = Instant::now();
    let (smith, smith_generated, mut t) = std::thread::scope(|scope| {
        let smith_host = host.clone();
        let generator = scope.spawn(move || {
            let q = sqlsmith(&smith_host, port, smith_n, seed);
            (q, smith_start.elapsed())
        });
        let t = run_jobs(&jobs, &host, port);
        let (q, took) = generator.join().unwrap();
        (q, took, t)
    });
    let mut smith_jobs: Vec<(&Role, String, String)> = Vec::new();
    for sql in &smith {
        smith_jobs.push((&read_nolimit, "sqlsmith".into(), sql.clone()));
        let lower = sql.trim_start().to_ascii_lowercase();
        if !lower.starts_with("select") && !lower.starts_with("with") {
            smith_jobs.push((&write, "sqlsmith".into(), sql.clone()));
        }
    }
    let smith_checks = smith_jobs.len();
    t.merge(run_jobs(&smith_jobs, &host, port));
    let catalog_blocks = t
        .over_blocks
        .values()
        .flatten()
        .chain(t.unjustified.iter())
        .filter(|l| l.starts_with("[catalog"))
        .count();

    // The figures go straight to standard error: the test harness captures
    // print! of a passing test, and `make test` must show them.
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    macro_rules! report {
        ($($arg:tt)*) => {
            let _ = writeln!(err, $($arg)*);
        };
    }
    report!("== verify engine vs PostgreSQL ==");
    report!(
        "queries tried: {} (suite + mutations + grid {suite}, half of them under the policies with a catalog; sqlsmith {smith_checks} checks of {} queries)",
        t.tried,
        smith.len()
    );
    report!(
        "run by PostgreSQL: {}; agree allow: {}; agree deny: {}; allowed but PostgreSQL failed for another reason: {}",
        t.run,
        t.agree_allow,
        t.agree_deny,
        t.allowed_pg_error
    );
    report!("bypasses: {}", t.bypasses.len());
    report!(
        "over-blocks: {} ({} under the policies with a catalog; {} without a contract rule)",
        t.over_block_count(),
        catalog_blocks,
        t.unjustified.len()
    );
    for (why, lines) in &t.over_blocks {
        report!("  {:>6}  {why}", lines.len());
        let shown = if verbose { lines.len() } else { 3 };
        for l in lines.iter().filter(|l| !l.contains("sqlsmith")).take(shown) {
            report!("          {}", short(l));
        }
    }
    for l in &t.unjustified {
        report!("  UNJUSTIFIED {}", short(l));
    }
    for b in &t.bypasses {
        report!("  BYPASS {b}");
    }
    report!(
        "time: {:.1} s (setup {:.1} s, sqlsmith generating {:.1} s, alongside; {WORKERS} connections)",
        start.elapsed().as_secs_f64(),
        setup_done.as_secs_f64(),
        smith_generated.as_secs_f64()
    );
    drop(err);
    drop(db);
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"));
    assert!(
        smith.len() >= smith_n / 2,
        "sqlsmith produced only {} queries",
        smith.len()
    );
    assert!(
        t.agree_allow >= 100,
        "PostgreSQL ran only {} allowed queries",
        t.agree_allow
    );
    assert!(t.bypasses.is_empty(), "{} bypasses", t.bypasses.len());
    assert!(
        t.unjustified.is_empty(),
        "{} over-blocks no contract rule justifies",
        t.unjustified.len()
    );
}

fn short(s: &str) -> String {
    let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > 300 {
        format!("{}...", one.chars().take(300).collect::<String>())
    } else {
        one
    }
}
