//! `kind: Policy` documents and catalog snapshots.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Session;
use super::names::{IDENTIFIER_RULE, is_identifier};
use super::tree::Node;
use super::walk::{Doc, Map, Placeholders, index, join, quote};
use haltsql_names::is_dns1123_hostname;

/// Top-level keys of a Policy document.
pub(crate) const POLICY_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "dialect",
    "search_path",
    "catalog",
    "statements",
    "require_limit",
    "tables",
    "functions",
];

/// Largest `require_limit.max`.
pub const MAX_REQUIRE_LIMIT: i64 = 1_000_000;

/// Longest `metadata.description`.
pub const MAX_DESCRIPTION: usize = 4096;

/// The SQL dialect a policy's statements are parsed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// PostgreSQL (the default).
    Postgres,
    /// MySQL.
    Mysql,
    /// SQLite.
    Sqlite,
    /// A generic ANSI dialect.
    Generic,
}

impl Dialect {
    /// The name as written in policies.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Mysql => "mysql",
            Dialect::Sqlite => "sqlite",
            Dialect::Generic => "generic",
        }
    }
}

/// A statement kind a policy may allow (what the verify engine checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatementKind {
    /// `SELECT` (and `VALUES`, `TABLE`-free queries).
    Select,
    /// `INSERT`.
    Insert,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
}

impl StatementKind {
    /// The name as written in policies and in verify responses.
    pub fn as_str(self) -> &'static str {
        match self {
            StatementKind::Select => "select",
            StatementKind::Insert => "insert",
            StatementKind::Update => "update",
            StatementKind::Delete => "delete",
        }
    }
}

/// A schema-qualified table name (both parts lower case).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct TableName {
    /// The schema (for an unqualified key: the first `search_path` entry).
    pub schema: String,
    /// The table.
    pub table: String,
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

/// What a policy allows on one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableRule {
    /// The columns that may be read or written, in the order written.
    /// `None`: the policy lists no columns, so every column is allowed.
    pub columns: Option<Vec<String>>,
}

/// A catalog snapshot: which tables and columns exist.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Catalog {
    /// Schemas by name.
    pub schemas: BTreeMap<String, CatalogSchema>,
}

/// One schema of a [`Catalog`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct CatalogSchema {
    /// Tables by name.
    pub tables: BTreeMap<String, CatalogTable>,
}

/// One table of a [`Catalog`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct CatalogTable {
    /// Columns in catalog order.
    pub columns: Vec<CatalogColumn>,
}

/// One column of a [`CatalogTable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatalogColumn {
    /// Column name.
    pub name: String,
    /// The declared type, if the snapshot has one (free text).
    pub data_type: Option<String>,
}

impl Catalog {
    /// The table, if the catalog has it.
    pub fn table(&self, name: &TableName) -> Option<&CatalogTable> {
        self.schemas.get(&name.schema)?.tables.get(&name.table)
    }
}

/// A fully checked policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadedPolicy {
    /// `metadata.name` (for a bundle policy: with the source's `name_prefix`).
    pub name: String,
    /// `metadata.description`.
    pub description: Option<String>,
    /// `dialect`, default postgres.
    pub dialect: Dialect,
    /// `search_path`, default `[public]`; never empty.
    pub search_path: Vec<String>,
    /// `statements.allow`, default `[select]`; sorted, no duplicates, never empty.
    pub statements: Vec<StatementKind>,
    /// `require_limit.max`, if the policy requires a LIMIT.
    pub require_limit: Option<u64>,
    /// `tables`, keyed by schema-qualified name; never empty.
    pub tables: BTreeMap<TableName, TableRule>,
    /// `functions.allow`: lower-case names (possibly `schema.name`), in
    /// addition to the engine's safe default set.
    pub functions: Vec<String>,
    /// The catalog, inline or loaded from the file `catalog` names.
    pub catalog: Option<Catalog>,
    /// The file the policy was loaded from.
    pub file: PathBuf,
    /// Lower-case hex SHA-256 of the policy file's bytes.
    pub sha256: String,
}

impl LoadedPolicy {
    /// The rule for a table, if listed.
    pub fn table(&self, name: &TableName) -> Option<&TableRule> {
        self.tables.get(name)
    }
}

/// Reads the `metadata.name` of a Policy document without checking the rest
/// (for the document list, even when the policy is invalid).
pub(crate) fn peek_name(root: &Node) -> Option<String> {
    let super::tree::Value::Map(entries) = &root.value else {
        return None;
    };
    let meta = entries
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == "metadata"))?;
    let super::tree::Value::Map(meta) = &meta.1.value else {
        return None;
    };
    let name = meta
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == "name"))?;
    let s = name.1.as_scalar()?;
    (s.kind() == super::tree::ScalarKind::Str).then(|| s.text.clone())
}

/// Checks a Policy document (its root mapping) and builds the policy.
pub(crate) fn parse_policy(
    session: &mut Session<'_>,
    doc: &mut Doc<'_>,
    root: &Node,
    file: &Path,
    sha256: &str,
) -> Option<LoadedPolicy> {
    let m = doc.map(root, "", POLICY_KEYS)?;
    let before = doc.errors.len();

    // metadata
    let mut name = None;
    let mut description = None;
    if let Some(meta) = m.req(doc, "metadata")
        && let Some(meta) = doc.map(meta, "metadata", &["name", "description"])
    {
        if let Some(n) = meta.req(doc, "name")
            && let Some(s) = doc.string(n, "metadata.name")
        {
            if is_dns1123_hostname(&s.value) {
                name = Some(s.value);
            } else {
                doc.error_str(
                    &s,
                    format!(
                        "invalid name {}: must be a lower-case DNS-1123 subdomain (a-z, 0-9, '-' and '.', starting and ending with a letter or digit, at most 253 characters)",
                        s.shown()
                    ),
                );
            }
        }
        if let Some(d) = meta.get("description")
            && let Some(s) = doc.string(d, "metadata.description")
        {
            if s.value.chars().count() > MAX_DESCRIPTION {
                doc.error_str(&s, format!("longer than {MAX_DESCRIPTION} characters"));
            } else {
                description = Some(s.value);
            }
        }
    }

    let dialect = match m.get("dialect") {
        None => Some(Dialect::Postgres),
        Some(n) => doc
            .choice(n, "dialect", &["postgres", "mysql", "sqlite", "generic"])
            .map(|d| match d.as_str() {
                "mysql" => Dialect::Mysql,
                "sqlite" => Dialect::Sqlite,
                "generic" => Dialect::Generic,
                _ => Dialect::Postgres,
            }),
    };

    let search_path = match m.get("search_path") {
        None => Some(vec!["public".to_string()]),
        Some(n) => identifier_list(doc, n, "search_path", false),
    };

    let statements = match m.get("statements") {
        None => Some(vec![StatementKind::Select]),
        Some(n) => parse_statements(doc, n),
    };

    let mut require_limit = None;
    if let Some(n) = m.get("require_limit")
        && let Some(rl) = doc.map(n, "require_limit", &["max"])
        && let Some(max) = rl.req(doc, "max")
    {
        require_limit = doc
            .int(max, "require_limit.max", 1, MAX_REQUIRE_LIMIT)
            .and_then(|v| u64::try_from(v).ok());
    }

    let functions = match m.get("functions") {
        None => Some(Vec::new()),
        Some(n) => parse_functions(doc, n),
    };

    let default_schema = search_path
        .as_ref()
        .and_then(|s| s.first().cloned())
        .unwrap_or_else(|| "public".to_string());
    let tables = m
        .req(doc, "tables")
        .and_then(|n| parse_tables(doc, n, &default_schema));

    let catalog = match m.get("catalog") {
        None => Some(None),
        Some(n) => parse_catalog_ref(session, doc, n, file).map(Some),
    };

    if let (Some(Some(catalog)), Some(tables)) = (&catalog, &tables) {
        check_against_catalog(doc, m, catalog, tables);
    }

    if doc.errors.len() != before {
        return None;
    }
    Some(LoadedPolicy {
        name: name?,
        description,
        dialect: dialect?,
        search_path: search_path?,
        statements: statements?,
        require_limit,
        tables: tables?.into_iter().map(|(k, v)| (k, v.rule)).collect(),
        functions: functions?,
        catalog: catalog?,
        file: file.to_path_buf(),
        sha256: sha256.to_string(),
    })
}

fn identifier_list(
    doc: &mut Doc<'_>,
    node: &Node,
    path: &str,
    allow_empty: bool,
) -> Option<Vec<String>> {
    let items = doc.strings(node, path)?;
    if items.is_empty() && !allow_empty {
        doc.error(node, path, "must not be empty");
        return None;
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for s in items {
        if !is_identifier(&s.value) {
            doc.error_str(
                &s,
                format!("invalid name {}: must be {IDENTIFIER_RULE}", s.shown()),
            );
            ok = false;
        } else if !seen.insert(s.value.clone()) {
            doc.error_str(&s, format!("duplicate entry {}", s.shown()));
            ok = false;
        } else {
            out.push(s.value);
        }
    }
    ok.then_some(out)
}

fn parse_statements(doc: &mut Doc<'_>, node: &Node) -> Option<Vec<StatementKind>> {
    let m = doc.map(node, "statements", &["allow"])?;
    let Some(allow) = m.get("allow") else {
        return Some(vec![StatementKind::Select]);
    };
    let items = doc.strings(allow, "statements.allow")?;
    if items.is_empty() {
        doc.error(allow, "statements.allow", "must not be empty");
        return None;
    }
    let mut out = BTreeSet::new();
    let mut ok = true;
    for s in items {
        let kind = match s.value.as_str() {
            "select" => StatementKind::Select,
            "insert" => StatementKind::Insert,
            "update" => StatementKind::Update,
            "delete" => StatementKind::Delete,
            _ => {
                doc.error_str(
                    &s,
                    format!(
                        "unknown statement {}, expected one of: select, insert, update, delete",
                        s.shown()
                    ),
                );
                ok = false;
                continue;
            }
        };
        if !out.insert(kind) {
            doc.error_str(&s, format!("duplicate entry {}", s.shown()));
            ok = false;
        }
    }
    ok.then(|| out.into_iter().collect())
}

fn parse_functions(doc: &mut Doc<'_>, node: &Node) -> Option<Vec<String>> {
    let m = doc.map(node, "functions", &["allow"])?;
    let Some(allow) = m.get("allow") else {
        return Some(Vec::new());
    };
    let items = doc.strings(allow, "functions.allow")?;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut ok = true;
    for s in items {
        let parts: Vec<&str> = s.value.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| is_identifier(p)) {
            doc.error_str(
                &s,
                format!(
                    "invalid function name {}: must be \"name\" or \"schema.name\", each part {IDENTIFIER_RULE}",
                    s.shown()
                ),
            );
            ok = false;
        } else if !seen.insert(s.value.clone()) {
            doc.error_str(&s, format!("duplicate entry {}", s.shown()));
            ok = false;
        } else {
            out.push(s.value);
        }
    }
    ok.then_some(out)
}

pub(crate) struct TableEntry {
    pub rule: TableRule,
    pub key: Node,
    pub path: String,
    pub column_nodes: Vec<(String, Node)>,
}

fn parse_tables(
    doc: &mut Doc<'_>,
    node: &Node,
    default_schema: &str,
) -> Option<BTreeMap<TableName, TableEntry>> {
    let m = doc.open_map(node, "tables")?;
    if m.entries.is_empty() {
        doc.error(node, "tables", "must list at least one table");
        return None;
    }
    let mut out: BTreeMap<TableName, TableEntry> = BTreeMap::new();
    let mut ok = true;
    for (key, key_node, value) in m.iter() {
        let path = join("tables", key);
        let parts: Vec<&str> = key.split('.').collect();
        let name = match parts.as_slice() {
            [t] if is_identifier(t) => Some(TableName {
                schema: default_schema.to_string(),
                table: t.to_string(),
            }),
            [s, t] if is_identifier(s) && is_identifier(t) => Some(TableName {
                schema: s.to_string(),
                table: t.to_string(),
            }),
            _ => None,
        };
        let Some(name) = name else {
            doc.error(
                key_node,
                &path,
                format!(
                    "invalid table {}: must be \"schema.table\" or \"table\", each part {IDENTIFIER_RULE}",
                    quote(key)
                ),
            );
            ok = false;
            continue;
        };
        let Some(entry) = doc.map(value, &path, &["columns"]) else {
            ok = false;
            continue;
        };
        let mut columns = None;
        let mut column_nodes = Vec::new();
        if let Some(cols) = entry.get("columns") {
            let cpath = join(&path, "columns");
            match doc.strings(cols, &cpath) {
                None => ok = false,
                Some(items) => {
                    let mut seen = BTreeSet::new();
                    let mut list = Vec::new();
                    let items_nodes = match &cols.value {
                        super::tree::Value::Seq(n) => n.as_slice(),
                        _ => &[],
                    };
                    for (s, n) in items.into_iter().zip(items_nodes) {
                        if !is_identifier(&s.value) {
                            doc.error_str(
                                &s,
                                format!("invalid column {}: must be {IDENTIFIER_RULE}", s.shown()),
                            );
                            ok = false;
                        } else if !seen.insert(s.value.clone()) {
                            doc.error_str(&s, format!("duplicate column {}", s.shown()));
                            ok = false;
                        } else {
                            column_nodes.push((s.value.clone(), n.clone()));
                            list.push(s.value);
                        }
                    }
                    columns = Some(list);
                }
            }
        }
        if let Some(prev) = out.get(&name) {
            doc.error(
                key_node,
                &path,
                format!(
                    "table {name} is already listed as {}",
                    quote(prev.path.strip_prefix("tables.").unwrap_or(&prev.path))
                ),
            );
            ok = false;
            continue;
        }
        out.insert(
            name,
            TableEntry {
                rule: TableRule { columns },
                key: key_node.clone(),
                path,
                column_nodes,
            },
        );
    }
    ok.then_some(out)
}

fn check_against_catalog(
    doc: &mut Doc<'_>,
    _m: Map<'_>,
    catalog: &Catalog,
    tables: &BTreeMap<TableName, TableEntry>,
) {
    for (name, entry) in tables {
        let Some(ct) = catalog.table(name) else {
            doc.error(
                &entry.key,
                &entry.path,
                format!("table {name} is not in the catalog"),
            );
            continue;
        };
        for (col, node) in &entry.column_nodes {
            if !ct.columns.iter().any(|c| &c.name == col) {
                let idx = entry
                    .column_nodes
                    .iter()
                    .position(|(c, _)| c == col)
                    .unwrap_or(0);
                doc.error(
                    node,
                    &index(&join(&entry.path, "columns"), idx),
                    format!("column {col} of {name} is not in the catalog"),
                );
            }
        }
    }
}

fn parse_catalog_ref(
    session: &mut Session<'_>,
    doc: &mut Doc<'_>,
    node: &Node,
    policy_file: &Path,
) -> Option<Catalog> {
    if node.as_scalar().is_some() {
        let s = doc.nonempty(node, "catalog")?;
        let rel = Path::new(&s.value);
        let folder = policy_file.parent().unwrap_or(Path::new(""));
        let path = if rel.is_absolute() {
            super::fs::rooted(session.opts.root.as_deref(), rel)
        } else {
            folder.join(rel)
        };
        let display = path.to_string_lossy().into_owned();
        let (root, idx) = session.read_referenced(doc, &s, &path, "catalog file")?;
        session.documents[idx].kind = Some("Catalog".to_string());
        let mut cdoc = Doc::new(display, Placeholders::Forbid);
        let catalog = parse_catalog(&mut cdoc, &root, "");
        let bad = !cdoc.errors.is_empty();
        session.errors.append(&mut cdoc.errors);
        if bad {
            doc.error_str(&s, format!("catalog file {} is invalid", s.shown()));
            return None;
        }
        catalog
    } else {
        parse_catalog(doc, node, "catalog")
    }
}

/// Reads a catalog snapshot: `{schemas: {S: {tables: {T: {columns: [C | {name, type}]}}}}}`.
pub(crate) fn parse_catalog(doc: &mut Doc<'_>, node: &Node, path: &str) -> Option<Catalog> {
    let before = doc.errors.len();
    let m = doc.map(node, path, &["schemas"])?;
    let mut catalog = Catalog::default();
    let spath = join(path, "schemas");
    let schemas = m.req(doc, "schemas")?;
    let schemas = doc.open_map(schemas, &spath)?;
    for (sname, skey, svalue) in schemas.iter() {
        let sp = join(&spath, sname);
        if !is_identifier(sname) {
            doc.error(
                skey,
                &sp,
                format!("invalid schema {}: must be {IDENTIFIER_RULE}", quote(sname)),
            );
            continue;
        }
        let Some(sm) = doc.map(svalue, &sp, &["tables"]) else {
            continue;
        };
        let mut schema = CatalogSchema::default();
        let tp = join(&sp, "tables");
        if let Some(tables) = sm.req(doc, "tables")
            && let Some(tables) = doc.open_map(tables, &tp)
        {
            for (tname, tkey, tvalue) in tables.iter() {
                let p = join(&tp, tname);
                if !is_identifier(tname) {
                    doc.error(
                        tkey,
                        &p,
                        format!("invalid table {}: must be {IDENTIFIER_RULE}", quote(tname)),
                    );
                    continue;
                }
                let Some(tm) = doc.map(tvalue, &p, &["columns"]) else {
                    continue;
                };
                let mut table = CatalogTable::default();
                let cp = join(&p, "columns");
                if let Some(cols) = tm.req(doc, "columns")
                    && let Some(items) = doc.seq(cols, &cp)
                {
                    let mut seen = BTreeSet::new();
                    for (i, item) in items.iter().enumerate() {
                        let ip = index(&cp, i);
                        let col = if item.as_scalar().is_some() {
                            doc.string(item, &ip).map(|s| (s, None))
                        } else {
                            doc.map(item, &ip, &["name", "type"]).and_then(|cm| {
                                let name = cm
                                    .req(doc, "name")
                                    .and_then(|n| doc.string(n, &join(&ip, "name")));
                                let ty = cm
                                    .get("type")
                                    .and_then(|n| doc.nonempty(n, &join(&ip, "type")));
                                name.map(|n| (n, ty.map(|t| t.value)))
                            })
                        };
                        let Some((name, data_type)) = col else {
                            continue;
                        };
                        if !is_identifier(&name.value) {
                            doc.error_str(
                                &name,
                                format!(
                                    "invalid column {}: must be {IDENTIFIER_RULE}",
                                    name.shown()
                                ),
                            );
                        } else if !seen.insert(name.value.clone()) {
                            doc.error_str(&name, format!("duplicate column {}", name.shown()));
                        } else {
                            table.columns.push(CatalogColumn {
                                name: name.value,
                                data_type,
                            });
                        }
                    }
                }
                schema.tables.insert(tname.to_string(), table);
            }
        }
        catalog.schemas.insert(sname.to_string(), schema);
    }
    (doc.errors.len() == before).then_some(catalog)
}
