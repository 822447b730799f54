//! Policy document rules: for each, a good and a bad document, with the
//! exact located messages.

use std::collections::BTreeMap;
use std::path::PathBuf;

use haltsql::load::{self, Dialect, EnvSource, LoadOptions, StatementKind, TableName};

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        p
    }

    fn report(&self, files: &[&str]) -> load::LoadReport {
        let opts = LoadOptions {
            root: Some(self.dir.path().to_path_buf()),
            env: EnvSource::Map(BTreeMap::new()),
            ..LoadOptions::default()
        };
        let paths: Vec<PathBuf> = files.iter().map(|f| self.dir.path().join(f)).collect();
        load::load_files_with(&paths, &opts)
    }

    /// Errors in text form, file names relative to the fixture.
    fn errors(&self, files: &[&str]) -> Vec<String> {
        let prefix = format!("{}/", self.dir.path().display());
        self.report(files)
            .errors
            .iter()
            .map(|e| e.to_string().replace(&prefix, ""))
            .collect()
    }
}

/// Lines 1-8; tests append from line 9.
const BASE: &str = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: orders-agent
search_path: [app]
tables:
  app.orders:
    columns: [id, status, total_cents]
";

fn check(doc: &str, expected: &[&str]) {
    let f = Fixture::new();
    f.write("p.yaml", doc);
    assert_eq!(f.errors(&["p.yaml"]), expected, "document:\n{doc}");
}

fn with(extra: &str) -> String {
    format!("{BASE}{extra}")
}

#[test]
fn base_policy_loads_with_defaults() {
    let f = Fixture::new();
    f.write("p.yaml", BASE);
    let r = f.report(&["p.yaml"]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let p = &r.policies[0];
    assert_eq!(p.name, "orders-agent");
    assert_eq!(p.dialect, Dialect::Postgres);
    assert_eq!(p.search_path, vec!["app"]);
    assert_eq!(p.statements, vec![StatementKind::Select]);
    assert_eq!(p.require_limit, None);
    assert!(p.functions.is_empty());
    let t = TableName {
        schema: "app".into(),
        table: "orders".into(),
    };
    assert_eq!(
        p.tables[&t].columns.as_deref(),
        Some(&["id".to_string(), "status".into(), "total_cents".into()][..])
    );
    assert_eq!(r.documents.len(), 1);
    assert_eq!(r.documents[0].kind.as_deref(), Some("Policy"));
    assert_eq!(r.documents[0].name.as_deref(), Some("orders-agent"));
    assert_eq!(r.documents[0].sha256.len(), 64);
    assert_eq!(r.exit_code(), 0);
}

#[test]
fn contract_example_unknown_key() {
    check(
        "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: orders-agent\ntables:\n  app.orders:\n    colums: [id]\n",
        &["p.yaml:7:5: tables.app.orders.colums: unknown key, expected one of: columns"],
    );
}

#[test]
fn unknown_top_level_key_and_missing_tables_both_reported() {
    check(
        "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata:\n  name: orders-agent\ntabels:\n  orders: {}\n",
        &[
            "p.yaml:1:1: tables: required key is missing",
            "p.yaml:5:1: tabels: unknown key, expected one of: apiVersion, kind, metadata, dialect, search_path, catalog, statements, require_limit, tables, functions",
        ],
    );
}

#[test]
fn api_version_and_kind() {
    check(
        &BASE.replace("haltsql.dev/v1", "haltsql.dev/v2"),
        &[
            "p.yaml:1:13: apiVersion: unsupported apiVersion \"haltsql.dev/v2\", expected haltsql.dev/v1",
        ],
    );
    check(
        &BASE.replace("kind: Policy", "kind: Polcy"),
        &["p.yaml:2:7: kind: unknown kind \"Polcy\", expected Policy or Config"],
    );
    check(
        &BASE.replace("kind: Policy\n", ""),
        &["p.yaml:1:1: kind: required key is missing"],
    );
}

#[test]
fn metadata_name_rules() {
    check(
        &BASE.replace("orders-agent", "Orders_Agent"),
        &[
            "p.yaml:4:9: metadata.name: invalid name \"Orders_Agent\": must be a lower-case DNS-1123 subdomain (a-z, 0-9, '-' and '.', starting and ending with a letter or digit, at most 253 characters)",
        ],
    );
    let long =
        "a".repeat(63) + "." + &"b".repeat(63) + "." + &"c".repeat(63) + "." + &"d".repeat(63);
    assert_eq!(long.len(), 255);
    let errs = {
        let f = Fixture::new();
        f.write("p.yaml", &BASE.replace("orders-agent", &long));
        f.errors(&["p.yaml"])
    };
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("p.yaml:4:9: metadata.name: invalid name"),
        "{errs:?}"
    );
    // 253 characters is fine.
    check(&BASE.replace("orders-agent", &long[..253]), &[]);
    check(
        &BASE.replace("  name: orders-agent\n", "  description: x\n"),
        &["p.yaml:4:3: metadata.name: required key is missing"],
    );
    check(
        &BASE.replace("  name: orders-agent\n", "  name: 123\n"),
        &[
            "p.yaml:4:9: metadata.name: expected a string, found an integer (quote it to use it as text)",
        ],
    );
    check(
        &BASE.replace(
            "  name: orders-agent\n",
            "  name: orders-agent\n  labels: {}\n",
        ),
        &["p.yaml:5:3: metadata.labels: unknown key, expected one of: name, description"],
    );
    check(
        &BASE.replace(
            "  name: orders-agent\n",
            "  name: \"123\"\n  description: Orders, read only\n",
        ),
        &[],
    );
    let long_desc = "x".repeat(4097);
    check(
        &BASE.replace(
            "  name: orders-agent\n",
            &format!("  name: a\n  description: {long_desc}\n"),
        ),
        &["p.yaml:5:16: metadata.description: longer than 4096 characters"],
    );
}

#[test]
fn dialect() {
    check(&with("dialect: mysql\n"), &[]);
    check(
        &with("dialect: oracle\n"),
        &[
            "p.yaml:9:10: dialect: unknown value \"oracle\", expected one of: postgres, mysql, sqlite, generic",
        ],
    );
}

#[test]
fn search_path() {
    check(
        &BASE.replace("search_path: [app]", "search_path: []"),
        &["p.yaml:5:14: search_path: must not be empty"],
    );
    check(
        &BASE.replace("search_path: [app]", "search_path: [app, App, app]"),
        &[
            "p.yaml:5:20: search_path[1]: invalid name \"App\": must be a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)",
            "p.yaml:5:25: search_path[2]: duplicate entry \"app\"",
        ],
    );
    check(
        &BASE.replace("search_path: [app]", "search_path: app"),
        &["p.yaml:5:14: search_path: expected a sequence, found a string"],
    );
    // Unqualified tables use the first search_path schema.
    let f = Fixture::new();
    f.write(
        "p.yaml",
        &BASE
            .replace("app.orders:", "orders:")
            .replace("[app]", "[sales, app]"),
    );
    let r = f.report(&["p.yaml"]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(r.policies[0].tables.contains_key(&TableName {
        schema: "sales".into(),
        table: "orders".into()
    }));
}

#[test]
fn statements() {
    let f = Fixture::new();
    f.write(
        "p.yaml",
        &with("statements:\n  allow: [update, select, insert]\n"),
    );
    let r = f.report(&["p.yaml"]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        r.policies[0].statements,
        vec![
            StatementKind::Select,
            StatementKind::Insert,
            StatementKind::Update
        ]
    );
    check(
        &with("statements:\n  allow: [select, drop, select]\n"),
        &[
            "p.yaml:10:19: statements.allow[1]: unknown statement \"drop\", expected one of: select, insert, update, delete",
            "p.yaml:10:25: statements.allow[2]: duplicate entry \"select\"",
        ],
    );
    check(
        &with("statements:\n  allow: []\n"),
        &["p.yaml:10:10: statements.allow: must not be empty"],
    );
    check(
        &with("statements:\n  deny: [delete]\n"),
        &["p.yaml:10:3: statements.deny: unknown key, expected one of: allow"],
    );
}

#[test]
fn require_limit_range() {
    let f = Fixture::new();
    f.write("p.yaml", &with("require_limit:\n  max: 100\n"));
    assert_eq!(f.report(&["p.yaml"]).policies[0].require_limit, Some(100));
    check(&with("require_limit:\n  max: 1000000\n"), &[]);
    check(&with("require_limit:\n  max: 1\n"), &[]);
    check(
        &with("require_limit:\n  max: 0\n"),
        &["p.yaml:10:8: require_limit.max: out of range, expected 1 to 1000000"],
    );
    check(
        &with("require_limit:\n  max: 1000001\n"),
        &["p.yaml:10:8: require_limit.max: out of range, expected 1 to 1000000"],
    );
    check(
        &with("require_limit:\n  max: 99999999999999999999999\n"),
        &["p.yaml:10:8: require_limit.max: out of range, expected 1 to 1000000"],
    );
    check(
        &with("require_limit:\n  max: \"100\"\n"),
        &["p.yaml:10:8: require_limit.max: expected an integer, found a string"],
    );
    check(
        &with("require_limit:\n  max: 1.5\n"),
        &["p.yaml:10:8: require_limit.max: expected an integer, found a float"],
    );
    check(
        &with("require_limit: {}\n"),
        &["p.yaml:9:16: require_limit.max: required key is missing"],
    );
    check(
        &with("require_limit: 100\n"),
        &["p.yaml:9:16: require_limit: expected a mapping, found an integer"],
    );
}

#[test]
fn tables() {
    // A table without a column list allows every column.
    let f = Fixture::new();
    f.write("p.yaml", &with("  app.customers: {}\n"));
    let r = f.report(&["p.yaml"]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let t = TableName {
        schema: "app".into(),
        table: "customers".into(),
    };
    assert_eq!(r.policies[0].tables[&t].columns, None);

    check(
        &BASE.replace(
            "tables:\n  app.orders:\n    columns: [id, status, total_cents]\n",
            "tables: {}\n",
        ),
        &["p.yaml:6:9: tables: must list at least one table"],
    );
    check(
        &with("  a.b.c: {}\n  App.Orders: {}\n"),
        &[
            "p.yaml:9:3: tables.a.b.c: invalid table \"a.b.c\": must be \"schema.table\" or \"table\", each part a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)",
            "p.yaml:10:3: tables.App.Orders: invalid table \"App.Orders\": must be \"schema.table\" or \"table\", each part a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)",
        ],
    );
    check(
        &with("  app.customers:\n"),
        &["p.yaml:9:16: tables.app.customers: expected a mapping, found null"],
    );
    check(
        &with("  orders: {}\n"),
        &["p.yaml:9:3: tables.orders: table app.orders is already listed as \"app.orders\""],
    );
    check(
        &with("  app.lines:\n    columns: [id, Qty, id, 7]\n"),
        &[
            "p.yaml:10:28: tables.app.lines.columns[3]: expected a string, found an integer (quote it to use it as text)",
        ],
    );
    check(
        &with("  app.lines:\n    columns: [id, Qty, id]\n"),
        &[
            "p.yaml:10:19: tables.app.lines.columns[1]: invalid column \"Qty\": must be a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)",
            "p.yaml:10:24: tables.app.lines.columns[2]: duplicate column \"id\"",
        ],
    );
}

#[test]
fn functions() {
    let f = Fixture::new();
    f.write(
        "p.yaml",
        &with("functions:\n  allow: [lower, pg_catalog.upper]\n"),
    );
    let r = f.report(&["p.yaml"]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.policies[0].functions, vec!["lower", "pg_catalog.upper"]);
    check(
        &with("functions:\n  allow: [lower, LOWER, a.b.c, lower]\n"),
        &[
            "p.yaml:10:18: functions.allow[1]: invalid function name \"LOWER\": must be \"name\" or \"schema.name\", each part a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)",
            "p.yaml:10:25: functions.allow[2]: invalid function name \"a.b.c\": must be \"name\" or \"schema.name\", each part a lower-case SQL identifier ([a-z_][a-z0-9_$]*, at most 128 characters)",
            "p.yaml:10:32: functions.allow[3]: duplicate entry \"lower\"",
        ],
    );
}

const CATALOG: &str = "catalog:\n  schemas:\n    app:\n      tables:\n        orders:\n          columns: [id, status, {name: total_cents, type: bigint}]\n";

#[test]
fn inline_catalog() {
    let f = Fixture::new();
    f.write("p.yaml", &with(CATALOG));
    let r = f.report(&["p.yaml"]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let cat = r.policies[0].catalog.as_ref().unwrap();
    let t = cat
        .table(&TableName {
            schema: "app".into(),
            table: "orders".into(),
        })
        .unwrap();
    assert_eq!(t.columns[2].name, "total_cents");
    assert_eq!(t.columns[2].data_type.as_deref(), Some("bigint"));

    check(
        &with(&CATALOG.replace("[id, status, ", "[id, ")),
        &[
            "p.yaml:8:19: tables.app.orders.columns[1]: column status of app.orders is not in the catalog",
        ],
    );
    check(
        &with(&format!("  app.lines: {{}}\n{CATALOG}")),
        &["p.yaml:9:3: tables.app.lines: table app.lines is not in the catalog"],
    );
    check(
        &with(&CATALOG.replace("type: bigint", "typ: bigint")),
        &[
            "p.yaml:14:53: catalog.schemas.app.tables.orders.columns[2].typ: unknown key, expected one of: name, type",
        ],
    );
}

#[test]
fn catalog_file() {
    let f = Fixture::new();
    f.write("p.yaml", &with("catalog: ./schema.json\n"));
    f.write(
        "schema.json",
        r#"{"schemas": {"app": {"tables": {"orders": {"columns": ["id", "status", "total_cents"]}}}}}"#,
    );
    let r = f.report(&["p.yaml"]);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(r.policies[0].catalog.is_some());
    assert_eq!(r.documents.len(), 2);
    assert_eq!(r.documents[1].kind.as_deref(), Some("Catalog"));

    // Missing file: located at the reference.
    let f = Fixture::new();
    f.write("p.yaml", &with("catalog: ./schema.json\n"));
    assert_eq!(
        f.errors(&["p.yaml"]),
        ["p.yaml:9:10: catalog: cannot read catalog file \"./schema.json\": file not found"]
    );

    // Broken file: located in the file, plus a note at the reference.
    let f = Fixture::new();
    f.write("p.yaml", &with("catalog: schema.json\n"));
    f.write(
        "schema.json",
        "{\"schemas\": {\"app\": {\"tabels\": {}}}}\n",
    );
    assert_eq!(
        f.errors(&["p.yaml"]),
        [
            "p.yaml:9:10: catalog: catalog file \"schema.json\" is invalid",
            "schema.json:1:21: schemas.app.tables: required key is missing",
            "schema.json:1:22: schemas.app.tabels: unknown key, expected one of: tables",
        ]
    );
}

#[test]
fn placeholders_are_not_resolved_in_policies() {
    check(
        &BASE.replace("name: orders-agent", "name: ${env:HOME}"),
        &["p.yaml:4:9: metadata.name: placeholders are only resolved in Config documents"],
    );
}

#[test]
fn yaml_level_problems() {
    check(
        &with("dialect: mysql\ndialect: sqlite\n"),
        &["p.yaml:10:1: duplicate key"],
    );
    check(
        &with("dialect: !!binary mysql\n"),
        &["p.yaml:9:10: unsupported tag !!binary (only !!str is understood)"],
    );
    check(
        "apiVersion: haltsql.dev/v1\nkind: Policy\nmetadata: [\n",
        &[
            "p.yaml:4:1: YAML syntax error: while parsing a node, did not find expected node content",
        ],
    );
    check("", &["p.yaml:1:1: the file holds no YAML document"]);
    check(
        "- a\n- b\n",
        &["p.yaml:1:1: expected a mapping, found a sequence"],
    );
    check(
        &format!("{BASE}---\n{BASE}"),
        &["p.yaml:9:1: more than one YAML document in this file (one document per file)"],
    );
}

#[test]
fn many_errors_are_all_reported() {
    let doc = "\
apiVersion: haltsql.dev/v1
kind: Policy
metadata:
  name: Bad_Name
dialect: oracle
statements:
  allow: [drop]
require_limit:
  max: 0
tables:
  app.orders:
    colums: [id]
";
    let f = Fixture::new();
    f.write("p.yaml", doc);
    let errs = f.errors(&["p.yaml"]);
    let lines: Vec<&str> = errs
        .iter()
        .map(|e| e.split(": ").nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        lines,
        [
            "metadata.name",
            "dialect",
            "statements.allow[0]",
            "require_limit.max",
            "tables.app.orders.colums"
        ]
    );
    // The name is still reported in the document list, even when invalid.
    let r = f.report(&["p.yaml"]);
    assert_eq!(r.documents[0].name.as_deref(), Some("Bad_Name"));
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn json_is_yaml() {
    check(
        r#"{"apiVersion": "haltsql.dev/v1", "kind": "Policy", "metadata": {"name": "j"},
"tables": {"orders": {"columns": ["id"]}}}"#,
        &[],
    );
    check(
        r#"{"apiVersion": "haltsql.dev/v1", "kind": "Policy", "metadata": {"name": "j"},
"tables": {"orders": {"columns": ["id"], "extra": 1}}}"#,
        &["p.yaml:2:42: tables.orders.extra: unknown key, expected one of: columns"],
    );
}
