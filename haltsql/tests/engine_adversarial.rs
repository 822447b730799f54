//! Table-driven adversarial suite for the verify engine: bypass attempts
//! that must be denied, and legitimate queries that must be allowed.

use std::collections::BTreeMap;

use haltsql::engine::{Code, Decision, Dialect, Policy, Rules, StatementKind, verify};

/// The policy most cases run against: select only, LIMIT <= 100.
fn read_policy() -> Policy {
    Policy::new(&rules(vec![StatementKind::Select], Some(100)))
}

/// Same tables, all statement kinds, no LIMIT requirement.
fn write_policy() -> Policy {
    Policy::new(&rules(
        vec![
            StatementKind::Select,
            StatementKind::Insert,
            StatementKind::Update,
            StatementKind::Delete,
        ],
        None,
    ))
}

fn rules(allowed: Vec<StatementKind>, limit: Option<u64>) -> Rules {
    let mut tables = BTreeMap::new();
    let cols = |c: &[&str]| Some(c.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    tables.insert(
        "app.orders".to_string(),
        cols(&["id", "status", "total_cents", "customer_id", "created_at"]),
    );
    tables.insert("customers".to_string(), cols(&["id", "name", "region"]));
    // No column list: every column may be read.
    tables.insert("app.products".to_string(), None);
    tables.insert("reporting.daily".to_string(), cols(&["day", "revenue"]));
    Rules {
        name: "test".into(),
        dialect: Dialect::Postgres,
        search_path: vec!["app".into(), "reporting".into()],
        allowed_statements: allowed,
        require_limit_max: limit,
        tables,
        extra_functions: vec!["app.safe_fn".into()],
    }
}

#[derive(Debug, Clone, Copy)]
enum P {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy)]
enum Want {
    Allow,
    /// Denied, and this code is among the violations.
    Deny(Code),
}

use Code::*;
use P::*;
use Want::*;

const CASES: &[(&str, P, &str, Want)] = &[
    // ------------------------------------------------------------ allowed
    (
        "quick start",
        Read,
        "SELECT id, status FROM orders LIMIT 10",
        Allow,
    ),
    (
        "join with aliases",
        Read,
        "SELECT o.id, c.name FROM orders o JOIN customers c ON c.id = o.customer_id LIMIT 10",
        Allow,
    ),
    (
        "aggregate",
        Read,
        "SELECT status, count(*) FROM orders GROUP BY status LIMIT 10",
        Allow,
    ),
    (
        "having and order by alias",
        Read,
        "SELECT status, sum(total_cents) AS total FROM orders GROUP BY status HAVING sum(total_cents) > 100 ORDER BY total DESC LIMIT 5",
        Allow,
    ),
    (
        "in subquery",
        Read,
        "SELECT id FROM orders WHERE customer_id IN (SELECT id FROM customers WHERE region = 'eu') LIMIT 10",
        Allow,
    ),
    (
        "cte",
        Read,
        "WITH recent AS (SELECT id, total_cents FROM orders WHERE created_at > now() - interval '7 days') SELECT id FROM recent LIMIT 10",
        Allow,
    ),
    (
        "star on table without column list",
        Read,
        "SELECT * FROM products LIMIT 10",
        Allow,
    ),
    (
        "qualified star on table without column list",
        Read,
        "SELECT p.* FROM products p LIMIT 10",
        Allow,
    ),
    (
        "schema-qualified column",
        Read,
        "SELECT app.orders.id FROM app.orders LIMIT 1",
        Allow,
    ),
    (
        "quoted lower-case names",
        Read,
        "SELECT \"id\" FROM \"orders\" LIMIT 1",
        Allow,
    ),
    (
        "folding of unquoted names",
        Read,
        "SELECT ID, Status FROM Orders LIMIT 1",
        Allow,
    ),
    (
        "fetch first",
        Read,
        "SELECT id FROM orders ORDER BY created_at DESC FETCH FIRST 10 ROWS ONLY",
        Allow,
    ),
    (
        "safe functions",
        Read,
        "SELECT lower(status), coalesce(total_cents, 0), round(total_cents / 100.0, 2) FROM orders LIMIT 10",
        Allow,
    ),
    (
        "union",
        Read,
        "SELECT id FROM orders UNION SELECT id FROM customers LIMIT 10",
        Allow,
    ),
    (
        "window function",
        Read,
        "SELECT id, row_number() OVER (PARTITION BY status ORDER BY created_at) FROM orders LIMIT 10",
        Allow,
    ),
    (
        "count star",
        Read,
        "SELECT count(*) FROM orders LIMIT 1",
        Allow,
    ),
    (
        "correlated exists",
        Read,
        "SELECT o.id FROM orders o WHERE EXISTS (SELECT 1 FROM customers c WHERE c.id = o.customer_id) LIMIT 10",
        Allow,
    ),
    (
        "derived table",
        Read,
        "SELECT d.n FROM (SELECT count(*) AS n FROM orders) d LIMIT 1",
        Allow,
    ),
    (
        "casts to plain types",
        Read,
        "SELECT id::text, CAST(total_cents AS numeric(10,2)) / 100 FROM orders LIMIT 5",
        Allow,
    ),
    (
        "case",
        Read,
        "SELECT CASE WHEN total_cents > 100 THEN 'big' ELSE 'small' END FROM orders LIMIT 5",
        Allow,
    ),
    (
        "any array",
        Read,
        "SELECT id FROM orders WHERE status = ANY(ARRAY['new', 'paid']) LIMIT 5",
        Allow,
    ),
    (
        "group by ordinal",
        Read,
        "SELECT date_trunc('day', created_at) AS day, count(*) FROM orders GROUP BY 1 ORDER BY day LIMIT 30",
        Allow,
    ),
    (
        "scalar subquery",
        Read,
        "SELECT (SELECT c.name FROM customers c WHERE c.id = o.customer_id) FROM orders o LIMIT 5",
        Allow,
    ),
    (
        "parenthesised query with limit",
        Read,
        "(SELECT id FROM orders LIMIT 5)",
        Allow,
    ),
    (
        "limit at max",
        Read,
        "SELECT id FROM orders LIMIT 100",
        Allow,
    ),
    ("no table", Read, "SELECT 1 LIMIT 1", Allow),
    (
        "like and between",
        Read,
        "SELECT id FROM orders WHERE status LIKE 'p%' AND total_cents BETWEEN 1 AND 10 LIMIT 3",
        Allow,
    ),
    (
        "derived with alias",
        Read,
        "SELECT x.id FROM (SELECT id FROM orders) AS x LIMIT 5",
        Allow,
    ),
    (
        "using on allowed column",
        Read,
        "SELECT o.status, c.name FROM orders o JOIN customers c USING (id) LIMIT 5",
        Allow,
    ),
    (
        "string_agg order by",
        Read,
        "SELECT string_agg(status, ',' ORDER BY id) FROM orders LIMIT 1",
        Allow,
    ),
    (
        "scalar subquery in where",
        Read,
        "SELECT id FROM orders o WHERE o.total_cents > (SELECT avg(total_cents) FROM orders) LIMIT 5",
        Allow,
    ),
    (
        "extract",
        Read,
        "SELECT extract(year FROM created_at) FROM orders LIMIT 1",
        Allow,
    ),
    (
        "typed literal",
        Read,
        "SELECT id FROM orders WHERE created_at > DATE '2024-01-01' LIMIT 1",
        Allow,
    ),
    (
        "comments",
        Read,
        "SELECT id /* the id */ FROM orders -- trailing\n LIMIT 1;",
        Allow,
    ),
    (
        "chained ctes",
        Read,
        "WITH a AS (SELECT id FROM orders), b AS (SELECT id FROM a) SELECT id FROM b LIMIT 1",
        Allow,
    ),
    (
        "pg_catalog-qualified safe function",
        Read,
        "SELECT pg_catalog.lower(status) FROM orders LIMIT 1",
        Allow,
    ),
    (
        "policy function, qualified",
        Read,
        "SELECT app.safe_fn(status) FROM orders LIMIT 1",
        Allow,
    ),
    (
        "placeholder",
        Read,
        "SELECT id FROM orders WHERE id = $1 LIMIT 1",
        Allow,
    ),
    (
        "output alias shadows a hidden column in ORDER BY",
        Read,
        "SELECT id AS email FROM orders ORDER BY email LIMIT 1",
        Allow,
    ),
    (
        "table in second search_path schema, qualified",
        Read,
        "SELECT day, revenue FROM reporting.daily LIMIT 7",
        Allow,
    ),
    (
        "nested comment hides the rest (as in PostgreSQL)",
        Read,
        "SELECT id FROM orders LIMIT 1 /* /* */ ; DROP TABLE orders; */",
        Allow,
    ),
    (
        "dollar-quoted string with semicolon",
        Read,
        "SELECT id FROM orders WHERE status = $$a;b$$ LIMIT 1",
        Allow,
    ),
    (
        "insert with columns",
        Write,
        "INSERT INTO orders (id, status) VALUES (1, 'new')",
        Allow,
    ),
    (
        "update",
        Write,
        "UPDATE orders SET status = 'paid' WHERE id = 1",
        Allow,
    ),
    ("delete", Write, "DELETE FROM orders WHERE id = 1", Allow),
    (
        "upsert with returning",
        Write,
        "INSERT INTO orders (id, status) VALUES (1, 'x') ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status RETURNING id",
        Allow,
    ),
    (
        "update from",
        Write,
        "UPDATE orders o SET status = 'x' FROM customers c WHERE c.id = o.customer_id AND c.region = 'eu'",
        Allow,
    ),
    (
        "insert select",
        Write,
        "INSERT INTO orders (id, status) SELECT id, 'new' FROM customers WHERE region = 'eu'",
        Allow,
    ),
    // ------------------------------------------------------------ multiple statements and lexer tricks
    (
        "two statements",
        Read,
        "SELECT 1 LIMIT 1; DROP TABLE orders",
        Deny(MultipleStatements),
    ),
    (
        "two statements, no space",
        Read,
        "SELECT 1 LIMIT 1;DELETE FROM orders",
        Deny(MultipleStatements),
    ),
    (
        "semicolon after a comment",
        Read,
        "SELECT 1 /* ; */ ; SELECT 2",
        Deny(MultipleStatements),
    ),
    (
        "semicolon after a dollar quote",
        Read,
        "SELECT $$;$$ LIMIT 1; DELETE FROM orders",
        Deny(MultipleStatements),
    ),
    (
        "semicolon on the next line after a line comment",
        Read,
        "SELECT id FROM orders LIMIT 1 --\n; DROP TABLE x",
        Deny(MultipleStatements),
    ),
    (
        "escaped backslash ends an E string",
        Read,
        "SELECT E'\\\\'; DROP TABLE orders; --' LIMIT 1",
        Deny(MultipleStatements),
    ),
    (
        "backslash-quote depends on standard_conforming_strings",
        Read,
        "SELECT 'x\\'' ; DROP TABLE orders; --' LIMIT 1",
        Deny(ParseError),
    ),
    (
        "backslash at the end of a string",
        Read,
        "SELECT 'a\\'; DROP TABLE orders; --'",
        Deny(ParseError),
    ),
    (
        "unterminated nested comment",
        Read,
        "SELECT id FROM orders LIMIT 1 /* /* */ ; DROP TABLE orders;",
        Deny(ParseError),
    ),
    (
        "unterminated string",
        Read,
        "SELECT 'abc FROM orders LIMIT 1",
        Deny(ParseError),
    ),
    (
        "unterminated dollar quote",
        Read,
        "SELECT $x$ abc FROM orders LIMIT 1",
        Deny(ParseError),
    ),
    (
        "NUL byte",
        Read,
        "SELECT id FROM orders LIMIT 1\u{0}; DROP TABLE orders",
        Deny(ParseError),
    ),
    (
        "an escaped quote in a U& string stays inside the literal",
        Read,
        "SELECT U&'\\0027; DROP TABLE orders; --' LIMIT 1",
        Allow,
    ),
    ("empty", Read, "  -- nothing\n ; ", Deny(ParseError)),
    // ------------------------------------------------------------ statement kinds
    (
        "writable cte delete",
        Read,
        "WITH d AS (DELETE FROM orders RETURNING id) SELECT id FROM d LIMIT 1",
        Deny(StatementNotAllowed),
    ),
    (
        "writable cte update",
        Read,
        "WITH u AS (UPDATE orders SET status = 'x' RETURNING id) SELECT id FROM u LIMIT 1",
        Deny(StatementNotAllowed),
    ),
    (
        "writable cte insert",
        Read,
        "WITH i AS (INSERT INTO orders (id) VALUES (1) RETURNING id) SELECT id FROM i LIMIT 1",
        Deny(StatementNotAllowed),
    ),
    (
        "writable cte even when writes are allowed",
        Write,
        "WITH d AS (DELETE FROM orders RETURNING id) SELECT id FROM d",
        Deny(StatementNotAllowed),
    ),
    (
        "with then delete",
        Read,
        "WITH x AS (SELECT id FROM orders) DELETE FROM orders WHERE id IN (SELECT id FROM x)",
        Deny(StatementNotAllowed),
    ),
    (
        "copy to stdout",
        Read,
        "COPY orders TO STDOUT",
        Deny(StatementNotAllowed),
    ),
    (
        "copy query to file",
        Read,
        "COPY (SELECT id FROM orders) TO '/tmp/x'",
        Deny(StatementNotAllowed),
    ),
    (
        "copy from program",
        Write,
        "COPY orders FROM PROGRAM 'id'",
        Deny(StatementNotAllowed),
    ),
    (
        "set search_path",
        Read,
        "SET search_path = evil",
        Deny(StatementNotAllowed),
    ),
    (
        "set role",
        Read,
        "SET ROLE postgres",
        Deny(StatementNotAllowed),
    ),
    ("reset", Read, "RESET ALL", Deny(StatementNotAllowed)),
    ("call", Read, "CALL do_things()", Deny(StatementNotAllowed)),
    (
        "prepare",
        Read,
        "PREPARE p AS SELECT 1",
        Deny(StatementNotAllowed),
    ),
    ("execute", Read, "EXECUTE p", Deny(StatementNotAllowed)),
    (
        "explain",
        Read,
        "EXPLAIN SELECT id FROM orders LIMIT 1",
        Deny(StatementNotAllowed),
    ),
    (
        "explain analyze delete",
        Read,
        "EXPLAIN ANALYZE DELETE FROM orders",
        Deny(StatementNotAllowed),
    ),
    (
        "create table",
        Write,
        "CREATE TABLE x (a int)",
        Deny(StatementNotAllowed),
    ),
    (
        "drop table",
        Write,
        "DROP TABLE orders",
        Deny(StatementNotAllowed),
    ),
    (
        "truncate",
        Write,
        "TRUNCATE orders",
        Deny(StatementNotAllowed),
    ),
    (
        "alter table",
        Write,
        "ALTER TABLE orders ADD COLUMN x int",
        Deny(StatementNotAllowed),
    ),
    (
        "grant",
        Write,
        "GRANT ALL ON orders TO public",
        Deny(StatementNotAllowed),
    ),
    ("begin", Read, "BEGIN", Deny(StatementNotAllowed)),
    ("show", Read, "SHOW ALL", Deny(StatementNotAllowed)),
    (
        "declare cursor",
        Read,
        "DECLARE c CURSOR FOR SELECT id FROM orders",
        Deny(StatementNotAllowed),
    ),
    (
        "lock table",
        Write,
        "LOCK TABLE orders",
        Deny(StatementNotAllowed),
    ),
    (
        "merge",
        Write,
        "MERGE INTO orders o USING customers c ON o.id = c.id WHEN MATCHED THEN DELETE",
        Deny(StatementNotAllowed),
    ),
    (
        "select into",
        Read,
        "SELECT id INTO newtab FROM orders LIMIT 1",
        Deny(StatementNotAllowed),
    ),
    (
        "insert under a read policy",
        Read,
        "INSERT INTO orders (id) VALUES (1)",
        Deny(StatementNotAllowed),
    ),
    (
        "update under a read policy",
        Read,
        "UPDATE orders SET status = 'x'",
        Deny(StatementNotAllowed),
    ),
    (
        "delete under a read policy",
        Read,
        "DELETE FROM orders",
        Deny(StatementNotAllowed),
    ),
    (
        "for update",
        Read,
        "SELECT id FROM orders LIMIT 1 FOR UPDATE",
        Deny(LockingNotAllowed),
    ),
    (
        "for share in a subquery",
        Read,
        "SELECT id FROM (SELECT id FROM orders FOR SHARE) s LIMIT 1",
        Deny(LockingNotAllowed),
    ),
    // ------------------------------------------------------------ functions
    (
        "pg_sleep",
        Read,
        "SELECT pg_sleep(10) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "pg_read_file",
        Read,
        "SELECT pg_read_file('/etc/passwd') LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "lo_import",
        Read,
        "SELECT lo_import('/etc/passwd') LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "set_config",
        Read,
        "SELECT set_config('role', 'postgres', false) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "current_setting",
        Read,
        "SELECT current_setting('data_directory') LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "query_to_xml runs SQL",
        Read,
        "SELECT query_to_xml('select * from secrets', true, true, '') LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "dblink",
        Read,
        "SELECT dblink('host=evil', 'select 1') LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "version",
        Read,
        "SELECT version() LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "current_user keyword",
        Read,
        "SELECT current_user LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "current_schema bare word",
        Read,
        "SELECT current_schema LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "function in where",
        Read,
        "SELECT id FROM orders WHERE pg_sleep(1) IS NOT NULL LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "function in order by",
        Read,
        "SELECT id FROM orders ORDER BY pg_sleep(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "function in having",
        Read,
        "SELECT id FROM orders GROUP BY id HAVING pg_sleep(1) IS NULL LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "function in filter",
        Read,
        "SELECT count(*) FILTER (WHERE pg_sleep(1) IS NULL) FROM orders LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "function in offset",
        Read,
        "SELECT id FROM orders LIMIT 1 OFFSET (SELECT pg_sleep(1))::int",
        Deny(FunctionNotAllowed),
    ),
    (
        "function inside a safe function",
        Read,
        "SELECT lower(pg_sleep(1)::text) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "function in from",
        Read,
        "SELECT * FROM pg_sleep(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "generate_series in from",
        Read,
        "SELECT x FROM generate_series(1, 1000000000) x LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "lateral function",
        Read,
        "SELECT o.id FROM orders o, LATERAL pg_read_file('/etc/passwd') f LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "lateral subquery",
        Read,
        "SELECT o.id FROM orders o CROSS JOIN LATERAL (SELECT pg_sleep(1)) s LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "function with column definition list",
        Read,
        "SELECT * FROM dblink('x', 'y') AS t(a int) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "quoted function name",
        Read,
        "SELECT \"pg_sleep\"(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "upper-case function name",
        Read,
        "SELECT PG_SLEEP(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "pg_catalog-qualified",
        Read,
        "SELECT pg_catalog.pg_sleep(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "quoted and qualified",
        Read,
        "SELECT \"pg_catalog\".\"pg_sleep\"(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "safe name in another schema",
        Read,
        "SELECT public.lower(status) FROM orders LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "quoted upper-case safe name",
        Read,
        "SELECT \"LOWER\"(status) FROM orders LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "comment between name and parenthesis",
        Read,
        "SELECT pg_sleep/**/(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "three-part function name",
        Read,
        "SELECT postgres.pg_catalog.pg_sleep(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "unicode-escaped function name",
        Read,
        "SELECT U&\"pg\\005fsleep\"(1) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "policy function without its schema",
        Read,
        "SELECT safe_fn(status) FROM orders LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "custom operator",
        Read,
        "SELECT 1 OPERATOR(pg_catalog.+) 1 LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "cast to regclass",
        Read,
        "SELECT 'orders'::regclass LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "cast to regproc",
        Read,
        "SELECT CAST('pg_sleep' AS regproc) LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "cast to a custom type",
        Read,
        "SELECT status::app.evil_type FROM orders LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "txid_current",
        Read,
        "SELECT txid_current() LIMIT 1",
        Deny(FunctionNotAllowed),
    ),
    (
        "star outside count",
        Read,
        "SELECT json_agg(*) FROM products LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    // ------------------------------------------------------------ tables
    (
        "unknown table",
        Read,
        "SELECT * FROM secrets LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "in table",
        Read,
        "SELECT id FROM orders WHERE id IN (TABLE secrets) LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "in table with column list",
        Read,
        "SELECT id FROM orders WHERE id IN (TABLE customers) LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    ("table statement", Read, "TABLE secrets", Deny(ParseError)),
    (
        "table in a derived table",
        Read,
        "SELECT id FROM (TABLE secrets) t LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "table on a listed table in a cte",
        Read,
        "WITH t AS (TABLE orders) SELECT id FROM t LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "in subquery",
        Read,
        "SELECT id FROM orders WHERE id IN (SELECT id FROM secrets) LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "scalar subquery",
        Read,
        "SELECT (SELECT password FROM users LIMIT 1) LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "exists",
        Read,
        "SELECT id FROM orders WHERE EXISTS (SELECT 1 FROM secrets) LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "derived",
        Read,
        "SELECT id FROM (SELECT * FROM secrets) s LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "join",
        Read,
        "SELECT o.id FROM orders o JOIN secrets s ON s.id = o.id LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "nested join",
        Read,
        "SELECT o.id FROM (orders o JOIN secrets s ON s.id = o.id) LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "union",
        Read,
        "SELECT id FROM orders UNION SELECT password FROM users LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "intersect",
        Read,
        "SELECT id FROM orders INTERSECT SELECT id FROM secrets LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "except",
        Read,
        "SELECT id FROM orders EXCEPT (SELECT id FROM secrets) LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "cte over a denied table",
        Read,
        "WITH x AS (SELECT * FROM secrets) SELECT * FROM x LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "cte out of scope",
        Read,
        "SELECT a.id FROM (WITH s AS (SELECT id FROM orders) SELECT id FROM s) a, s LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "cte forward reference",
        Read,
        "WITH a AS (SELECT id FROM b), b AS (SELECT id FROM orders) SELECT id FROM a LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "recursive cte",
        Read,
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r LIMIT 1",
        Deny(TooComplex),
    ),
    (
        "quoted upper-case table",
        Read,
        "SELECT id FROM \"Orders\" LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "quoted name with a dot",
        Read,
        "SELECT id FROM \"app.orders\" LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "three-part table name",
        Read,
        "SELECT id FROM postgres.app.orders LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "other schema",
        Read,
        "SELECT id FROM public.orders LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "pg_catalog table",
        Read,
        "SELECT usename FROM pg_catalog.pg_user LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "unqualified pg_ table",
        Read,
        "SELECT usename FROM pg_user LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "information_schema",
        Read,
        "SELECT * FROM information_schema.tables LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "later search_path schema needs qualification",
        Read,
        "SELECT day FROM daily LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "insert into a denied table",
        Write,
        "INSERT INTO secrets (id) VALUES (1)",
        Deny(TableNotAllowed),
    ),
    (
        "update from a denied table",
        Write,
        "UPDATE orders SET status = s.x FROM secrets s WHERE s.id = orders.id",
        Deny(TableNotAllowed),
    ),
    (
        "delete using a denied table",
        Write,
        "DELETE FROM orders USING secrets s WHERE s.id = orders.id",
        Deny(TableNotAllowed),
    ),
    (
        "too many relations",
        Read,
        "SELECT 1 FROM orders a1, orders a2, orders a3, orders a4, orders a5, orders a6, orders a7, orders a8, orders a9, orders a10, orders a11, orders a12, orders a13, orders a14, orders a15, orders a16, orders a17, orders a18, orders a19, orders a20, orders a21, orders a22, orders a23, orders a24, orders a25, orders a26, orders a27, orders a28, orders a29, orders a30, orders a31, orders a32, orders a33 LIMIT 1",
        Deny(TooComplex),
    ),
    // ------------------------------------------------------------ columns
    (
        "column in select list",
        Read,
        "SELECT id, email FROM orders LIMIT 10",
        Deny(ColumnNotAllowed),
    ),
    (
        "quoted column",
        Read,
        "SELECT \"email\" FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "quoted upper-case column",
        Read,
        "SELECT \"ID\" FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "qualified column",
        Read,
        "SELECT orders.email FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "schema-qualified column",
        Read,
        "SELECT app.orders.email FROM app.orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "four-part column",
        Read,
        "SELECT db.app.orders.id FROM app.orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in where",
        Read,
        "SELECT id FROM orders WHERE email = 'x' LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in order by",
        Read,
        "SELECT id FROM orders ORDER BY email LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in group by",
        Read,
        "SELECT count(*) FROM orders GROUP BY email LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in having",
        Read,
        "SELECT count(*) FROM orders HAVING max(email) > 'a' LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in join on",
        Read,
        "SELECT o.id FROM orders o JOIN customers c ON c.ssn = o.id LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in using",
        Read,
        "SELECT o.id FROM orders o JOIN customers c USING (email) LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in a window",
        Read,
        "SELECT row_number() OVER (ORDER BY email) FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column only in distinct on",
        Read,
        "SELECT DISTINCT ON (email) id FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column in a subquery's where",
        Read,
        "SELECT id FROM orders WHERE customer_id IN (SELECT id FROM customers WHERE ssn LIKE '1%') LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column in offset subquery",
        Read,
        "SELECT id FROM orders LIMIT 1 OFFSET (SELECT count(c.email) FROM customers c)",
        Deny(ColumnNotAllowed),
    ),
    (
        "column in a function argument",
        Read,
        "SELECT lower(email) FROM customers LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column in exists",
        Read,
        "SELECT id FROM orders o WHERE EXISTS (SELECT 1 FROM customers c WHERE c.email = 'x') LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "correlated unqualified column resolves to the inner table",
        Read,
        "SELECT id FROM customers WHERE EXISTS (SELECT 1 FROM orders WHERE name = 'x') LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "ambiguous unqualified column",
        Read,
        "SELECT o.id FROM orders o, customers c WHERE name = 'x' LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "union arm column",
        Read,
        "SELECT id FROM orders UNION ALL SELECT email FROM customers LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "except arm column",
        Read,
        "SELECT id FROM orders EXCEPT (SELECT ssn FROM customers) LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "cte shadowing a table name",
        Read,
        "WITH orders AS (SELECT email AS id FROM customers) SELECT id FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "qualified name bypasses the cte",
        Read,
        "WITH customers AS (SELECT id, email FROM app.products) SELECT email FROM public.customers LIMIT 1",
        Deny(TableNotAllowed),
    ),
    (
        "cte of the same name does not shadow schema.table",
        Read,
        "WITH orders AS (SELECT 1 AS email) SELECT email FROM app.orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "derived column not in output",
        Read,
        "SELECT s.email FROM (SELECT id FROM orders) s LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "column alias list on a table",
        Read,
        "SELECT o.email FROM orders AS o(email) LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "update writes a hidden column",
        Write,
        "UPDATE orders SET email = 'x' WHERE id = 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "update reads a hidden column",
        Write,
        "UPDATE orders SET status = 'x' WHERE email = 'y'",
        Deny(ColumnNotAllowed),
    ),
    (
        "insert writes a hidden column",
        Write,
        "INSERT INTO orders (id, email) VALUES (1, 'x')",
        Deny(ColumnNotAllowed),
    ),
    (
        "upsert writes a hidden column",
        Write,
        "INSERT INTO orders (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET email = 'x'",
        Deny(ColumnNotAllowed),
    ),
    (
        "returning a hidden column",
        Write,
        "DELETE FROM orders WHERE id = 1 RETURNING email",
        Deny(ColumnNotAllowed),
    ),
    (
        "delete filtered on a hidden column",
        Write,
        "DELETE FROM orders WHERE email = 'x'",
        Deny(ColumnNotAllowed),
    ),
    (
        "excluded hidden column",
        Write,
        "INSERT INTO orders (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET status = excluded.email",
        Deny(ColumnNotAllowed),
    ),
    // ------------------------------------------------------------ wildcards and whole rows
    (
        "star",
        Read,
        "SELECT * FROM orders LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "qualified star",
        Read,
        "SELECT o.* FROM orders o LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "star over a join",
        Read,
        "SELECT * FROM products p JOIN orders o ON o.id = p.id LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "star inside a cte",
        Read,
        "WITH x AS (SELECT * FROM orders) SELECT id FROM x LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "whole-row reference",
        Read,
        "SELECT o FROM orders o LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "whole row in an allowed aggregate",
        Read,
        "SELECT json_agg(o) FROM orders o LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "whole row by table name",
        Read,
        "SELECT to_json(orders) FROM orders LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "field of a whole row",
        Read,
        "SELECT (o).email FROM orders o LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "count of a whole row",
        Read,
        "SELECT count(o.*) FROM orders o LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "whole row compared",
        Read,
        "SELECT o.id FROM orders o WHERE o = o LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "natural join",
        Read,
        "SELECT o.id FROM orders o NATURAL JOIN customers c LIMIT 1",
        Deny(WildcardNotAllowed),
    ),
    (
        "insert without a column list",
        Write,
        "INSERT INTO orders VALUES (1, 'x')",
        Deny(WildcardNotAllowed),
    ),
    (
        "returning star",
        Write,
        "DELETE FROM orders WHERE id = 1 RETURNING *",
        Deny(WildcardNotAllowed),
    ),
    // ------------------------------------------------------------ system columns
    (
        "ctid",
        Read,
        "SELECT ctid FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "xmin",
        Read,
        "SELECT xmin, id FROM orders LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "qualified xmax",
        Read,
        "SELECT o.xmax FROM orders o LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "tableoid on a table without column list",
        Read,
        "SELECT tableoid FROM products LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    (
        "ctid in where",
        Read,
        "SELECT id FROM orders WHERE ctid = '(0,1)' LIMIT 1",
        Deny(ColumnNotAllowed),
    ),
    // ------------------------------------------------------------ LIMIT
    (
        "no limit",
        Read,
        "SELECT id FROM orders",
        Deny(LimitRequired),
    ),
    (
        "limit too large",
        Read,
        "SELECT id FROM orders LIMIT 1000",
        Deny(LimitTooLarge),
    ),
    (
        "limit all",
        Read,
        "SELECT id FROM orders LIMIT ALL",
        Deny(LimitRequired),
    ),
    (
        "limit null",
        Read,
        "SELECT id FROM orders LIMIT NULL",
        Deny(LimitRequired),
    ),
    (
        "limit zero",
        Read,
        "SELECT id FROM orders LIMIT 0",
        Deny(LimitRequired),
    ),
    (
        "negative limit",
        Read,
        "SELECT id FROM orders LIMIT -1",
        Deny(LimitRequired),
    ),
    (
        "fractional limit",
        Read,
        "SELECT id FROM orders LIMIT 10.5",
        Deny(LimitRequired),
    ),
    (
        "exponent limit",
        Read,
        "SELECT id FROM orders LIMIT 1e3",
        Deny(LimitRequired),
    ),
    (
        "parenthesised limit",
        Read,
        "SELECT id FROM orders LIMIT (10)",
        Deny(LimitRequired),
    ),
    (
        "arithmetic limit",
        Read,
        "SELECT id FROM orders LIMIT 10 + 1000",
        Deny(LimitRequired),
    ),
    (
        "subquery limit",
        Read,
        "SELECT id FROM orders LIMIT (SELECT 5)",
        Deny(LimitRequired),
    ),
    (
        "parameter limit",
        Read,
        "SELECT id FROM orders LIMIT $1",
        Deny(LimitRequired),
    ),
    (
        "string limit",
        Read,
        "SELECT id FROM orders LIMIT '10'",
        Deny(LimitRequired),
    ),
    (
        "cast limit",
        Read,
        "SELECT id FROM orders LIMIT 10::bigint",
        Deny(LimitRequired),
    ),
    (
        "fetch too many",
        Read,
        "SELECT id FROM orders FETCH FIRST 1000 ROWS ONLY",
        Deny(LimitTooLarge),
    ),
    (
        "fetch with ties",
        Read,
        "SELECT id FROM orders ORDER BY status FETCH FIRST 10 ROWS WITH TIES",
        Deny(LimitRequired),
    ),
    (
        "huge limit",
        Read,
        "SELECT id FROM orders LIMIT 99999999999999999999999",
        Deny(LimitTooLarge),
    ),
    (
        "limit only inside a derived table",
        Read,
        "SELECT id FROM (SELECT id FROM orders LIMIT 10) s",
        Deny(LimitRequired),
    ),
    (
        "limit only inside a subquery",
        Read,
        "SELECT id FROM orders WHERE id IN (SELECT id FROM orders LIMIT 1)",
        Deny(LimitRequired),
    ),
    (
        "limit only inside a cte",
        Read,
        "WITH x AS (SELECT id FROM orders LIMIT 1) SELECT id FROM x",
        Deny(LimitRequired),
    ),
    (
        "limit on one union arm",
        Read,
        "(SELECT id FROM orders LIMIT 10) UNION ALL (SELECT id FROM orders)",
        Deny(LimitRequired),
    ),
    // ------------------------------------------------------------ unsupported syntax is denied
    (
        "tablesample",
        Read,
        "SELECT id FROM orders TABLESAMPLE SYSTEM (10) LIMIT 1",
        Deny(SyntaxNotAllowed),
    ),
    (
        "rows from",
        Read,
        "SELECT * FROM ROWS FROM (pg_sleep(1)) LIMIT 1",
        Deny(ParseError),
    ),
    (
        "optimizer hint comment",
        Read,
        "SELECT /*+ Set(statement_timeout 0) */ id FROM orders LIMIT 1",
        Deny(SyntaxNotAllowed),
    ),
    (
        "do block",
        Read,
        "DO $$ BEGIN PERFORM pg_sleep(10); END $$",
        Deny(ParseError),
    ),
];

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
