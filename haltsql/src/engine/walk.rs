//! The AST walk. Every node kind is matched explicitly; kinds the engine
//! does not understand are violations (`syntax_not_allowed`), never skipped.
//!
//! Names resolve as PostgreSQL resolves them, and what a name binds to is
//! checked:
//! - tables: a one-part name is a visible CTE, else it resolves through the
//!   policy's search_path, and only to the *first* schema (an earlier schema
//!   could hold a table of the same name); names starting with `pg_` must be
//!   qualified (pg_catalog is searched before the search_path); three-part
//!   names are denied;
//! - every FROM item has a column set that is known ([`Cols::Known`],
//!   [`Cols::Catalog`]) or partly unknown (a policy table without a
//!   catalog, a function whose output may be a composite);
//! - an unqualified column binds to the innermost query level where a FROM
//!   item has it, else outward; where a FROM item *may* have it, every
//!   possible binding is checked (see [`Walker::column_ref`]);
//! - `x.f` and `(expr).f` are calls of `f` unless known to be a column or
//!   field; keywords PostgreSQL evaluates as functions are functions;
//! - identifiers fold to lower case unless quoted.

use std::collections::HashSet;
use std::sync::Arc;

use sqlparser::ast::{
    Assignment, AssignmentTarget, BinaryOperator, CastKind, ConflictTarget, Cte, DataType, Delete,
    Distinct, Expr, FromTable, Function, FunctionArg, FunctionArgExpr, FunctionArgumentClause,
    FunctionArguments, GroupByExpr, Ident, InTarget, Insert, Join, JoinConstraint, JoinOperator,
    LimitClause, NamedWindowExpr, ObjectName, ObjectNamePart, OnConflictAction, OnInsert, OrderBy,
    OrderByExpr, OrderByKind, Query, Select, SelectItem, SelectItemQualifiedWildcardKind, SetExpr,
    Statement, TableAlias, TableFactor, TableObject, TableWithJoins, Update, UpdateTableFromKind,
    Value, WildcardAdditionalOptions, WindowFrameBound, WindowSpec, WindowType,
};

use super::functions::is_safe_type;
use super::{Code, MAX_RELATIONS, MAX_WALK_DEPTH, Policy, StatementKind, Violation};

/// PostgreSQL system columns: never readable unless a column list names them.
const SYSTEM_COLUMNS: &[&str] = &["ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"];

/// SQL keywords PostgreSQL evaluates as functions when written without
/// quotes (sqlparser parses some of them as plain identifiers).
const KEYWORD_FUNCTIONS: &[&str] = &[
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "localtime",
    "localtimestamp",
    "session_user",
    "system_user",
    "user",
];

/// PostgreSQL's built-in functions that accept one argument of any row type
/// (`any`, `anyelement`, `record`, ...), so that `t.f` calls `f(t)` when `t`
/// has no column `f`, and type names whose input function reads the catalog
/// or parses documents (`t.regclass` casts `t`). Taken from PostgreSQL 15's
/// pg_proc and pg_type.
const ROW_FUNCTIONS: &[&str] = include!("row_functions.in");

/// Aggregates and window functions of the default list: not valid in FROM.
const AGGREGATES_AND_WINDOWS: &[&str] = &[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "bool_and",
    "bool_or",
    "every",
    "array_agg",
    "string_agg",
    "json_agg",
    "jsonb_agg",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "percentile_cont",
    "percentile_disc",
    "mode",
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    "grouping",
];

/// Check one parsed statement. Returns the statement kind and the violations.
pub(crate) fn check_statement(
    policy: &Policy,
    stmt: &Statement,
    first_word: Option<&str>,
) -> (String, Vec<Violation>) {
    let mut w = Walker::new(policy);
    let kind = w.statement(stmt, first_word);
    (kind, w.finish())
}

fn fold(id: &Ident) -> String {
    if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_ascii_lowercase()
    }
}

/// The columns a relation exposes.
#[derive(Debug, Clone)]
enum Cols {
    /// A policy table with a column list.
    Listed(Arc<HashSet<String>>),
    /// A policy table without a column list: every column but system columns.
    All,
    /// A policy table the policy's catalog describes: every column in
    /// table order (after alias renames), and whether it may be read.
    Catalog(Arc<Vec<(String, bool)>>),
    /// A subquery, CTE or VALUES list whose output names are known.
    Known(Vec<String>),
    /// A subquery or function whose output names are not known; its
    /// contents were checked, so every column of it may be read.
    Open,
}

impl Cols {
    /// Whether some column of the source may not be read.
    fn has_denied(&self) -> bool {
        match self {
            Cols::Listed(_) => true,
            Cols::Catalog(v) => v.iter().any(|(_, ok)| !ok),
            Cols::All | Cols::Known(_) | Cols::Open => false,
        }
    }
}

/// The output of a query.
#[derive(Debug, Clone)]
enum Shape {
    Known(Vec<String>),
    Open,
}

impl Shape {
    fn into_cols(self) -> Cols {
        match self {
            Shape::Known(v) => Cols::Known(v),
            Shape::Open => Cols::Open,
        }
    }
}

/// Whether a source has a column of some name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Has {
    Yes,
    /// Unknown: a table whose full column set the engine does not know, or
    /// a function or subquery whose output names are not known.
    Maybe,
    No,
}

#[derive(Debug, Clone)]
enum Qual {
    /// An alias: referenced by this single name only.
    Alias(String),
    /// An unaliased table: referenced as `name` or `schema.name`.
    Table {
        schema: Option<String>,
        name: String,
    },
    /// Not referencable by name (e.g. the output of a set operation).
    None,
}

#[derive(Debug, Clone)]
struct Source {
    qual: Qual,
    cols: Cols,
    /// The policy table (`schema.table`) for base tables, else the alias.
    label: String,
    /// Whether this is a base table (system columns apply).
    base: bool,
}

impl Source {
    fn matches(&self, q: &[String]) -> bool {
        match (&self.qual, q) {
            (Qual::Alias(a), [n]) => a == n,
            (Qual::Table { name, .. }, [n]) => name == n,
            (
                Qual::Table {
                    schema: Some(s),
                    name,
                },
                [qs, n],
            ) => s == qs && name == n,
            _ => false,
        }
    }

    fn single_name(&self) -> Option<&str> {
        match &self.qual {
            Qual::Alias(a) => Some(a),
            Qual::Table { name, .. } => Some(name),
            Qual::None => None,
        }
    }

    /// Whether this source has a column `col`, as far as the engine knows.
    fn has(&self, col: &str) -> Has {
        match &self.cols {
            // Every base table has the system columns.
            _ if self.base && SYSTEM_COLUMNS.contains(&col) => Has::Yes,
            Cols::Listed(set) if set.contains(col) => Has::Yes,
            Cols::Listed(_) | Cols::All | Cols::Open => Has::Maybe,
            Cols::Catalog(v) if v.iter().any(|(c, _)| c == col) => Has::Yes,
            Cols::Catalog(_) => Has::No,
            Cols::Known(v) if v.iter().any(|c| c == col) => Has::Yes,
            Cols::Known(_) => Has::No,
        }
    }

    fn might_contain(&self, col: &str) -> bool {
        self.has(col) != Has::No
    }

    fn allows(&self, col: &str) -> bool {
        match &self.cols {
            // System columns only when a column list names them.
            Cols::Listed(set) => set.contains(col),
            Cols::All => !(self.base && SYSTEM_COLUMNS.contains(&col)),
            Cols::Catalog(v) => v.iter().any(|(c, ok)| c == col && *ok),
            Cols::Known(v) => v.iter().any(|c| c == col),
            Cols::Open => true,
        }
    }

    fn table_name(&self) -> Option<String> {
        if self.base {
            Some(self.label.clone())
        } else {
            None
        }
    }
}

#[derive(Debug, Default)]
struct Level {
    sources: Vec<Source>,
}

#[derive(Debug, Clone)]
struct CteDef {
    name: String,
    shape: Shape,
}

struct Walker<'p> {
    policy: &'p Policy,
    violations: Vec<Violation>,
    levels: Vec<Level>,
    ctes: Vec<Vec<CteDef>>,
    depth: usize,
    relations: usize,
    too_complex: bool,
}

impl<'p> Walker<'p> {
    fn new(policy: &'p Policy) -> Self {
        Walker {
            policy,
            violations: Vec::new(),
            levels: Vec::new(),
            ctes: Vec::new(),
            depth: 0,
            relations: 0,
            too_complex: false,
        }
    }

    fn finish(self) -> Vec<Violation> {
        self.violations
    }

    fn push(&mut self, v: Violation) {
        if !self.violations.iter().any(|o| {
            o.code == v.code
                && o.table == v.table
                && o.column == v.column
                && (o.table.is_some() || o.column.is_some() || o.message == v.message)
        }) {
            self.violations.push(v);
        }
    }

    fn unsupported(&mut self, what: &str) {
        self.push(Violation::new(
            Code::SyntaxNotAllowed,
            format!("{what} is not supported by the verify engine"),
        ));
    }

    /// `/*+ ... */` comments: plan hints for extensions such as pg_hint_plan,
    /// whose `Set(...)` hints change settings for the statement.
    fn hints(&mut self, present: bool) {
        if present {
            self.push(Violation::new(
                Code::SyntaxNotAllowed,
                "optimizer hint comments (/*+ ... */) are not allowed",
            ));
        }
    }

    /// Enter one level of recursion; false when the walk is too deep.
    fn enter(&mut self) -> bool {
        self.depth += 1;
        if self.depth > MAX_WALK_DEPTH {
            if !self.too_complex {
                self.too_complex = true;
                self.push(Violation::new(
                    Code::TooComplex,
                    format!("expression nesting deeper than {MAX_WALK_DEPTH}"),
                ));
            }
            return false;
        }
        true
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    // ---------------------------------------------------------------- statements

    fn statement(&mut self, stmt: &Statement, first_word: Option<&str>) -> String {
        let kind = match stmt {
            Statement::Query(q) => {
                // `WITH ... INSERT/UPDATE/DELETE` parses as a query whose body is DML.
                let dml = match q.body.as_ref() {
                    SetExpr::Insert(s) => Some((StatementKind::Insert, s)),
                    SetExpr::Update(s) => Some((StatementKind::Update, s)),
                    SetExpr::Delete(s) => Some((StatementKind::Delete, s)),
                    _ => None,
                };
                match dml {
                    Some((kind, inner)) => {
                        self.check_kind(kind);
                        if q.order_by.is_some()
                            || q.limit_clause.is_some()
                            || q.fetch.is_some()
                            || !q.locks.is_empty()
                        {
                            self.unsupported(
                                "ORDER BY / LIMIT / locking around a data-modifying statement",
                            );
                        }
                        self.query_extras(q);
                        self.ctes.push(Vec::new());
                        if let Some(with) = &q.with {
                            self.with(with.recursive, &with.cte_tables);
                        }
                        self.dml(inner);
                        self.ctes.pop();
                        return kind.as_str().to_string();
                    }
                    None => {
                        self.check_kind(StatementKind::Select);
                        self.query(q);
                        self.require_limit(q);
                        StatementKind::Select
                    }
                }
            }
            Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {
                let kind = match stmt {
                    Statement::Insert(_) => StatementKind::Insert,
                    Statement::Update(_) => StatementKind::Update,
                    _ => StatementKind::Delete,
                };
                self.check_kind(kind);
                self.dml(stmt);
                kind
            }
            _ => {
                let word = first_word.unwrap_or("unknown").to_string();
                self.push(Violation::new(
                    Code::StatementNotAllowed,
                    format!("{} statements are not allowed", word.to_ascii_uppercase()),
                ));
                return word;
            }
        };
        kind.as_str().to_string()
    }

    fn check_kind(&mut self, kind: StatementKind) {
        if !self.policy.allowed_statements.contains(&kind) {
            self.push(Violation::new(
                Code::StatementNotAllowed,
                format!(
                    "{} statements are not allowed by this policy",
                    kind.as_str().to_ascii_uppercase()
                ),
            ));
        }
    }

    /// INSERT / UPDATE / DELETE, at the top level or after a WITH.
    fn dml(&mut self, stmt: &Statement) {
        match stmt {
            Statement::Insert(i) => self.insert(i),
            Statement::Update(u) => self.update(u),
            Statement::Delete(d) => self.delete(d),
            _ => self.push(Violation::new(
                Code::StatementNotAllowed,
                "this statement is not allowed here",
            )),
        }
    }

    /// Resolve a DML target table: must be a policy table.
    fn target(&mut self, name: &ObjectName, alias: Option<&Ident>) -> Source {
        let src = self.base_table(name);
        let qual = match alias {
            Some(a) => Qual::Alias(fold(a)),
            None => src.qual.clone(),
        };
        Source { qual, ..src }
    }

    fn write_column(&mut self, target: &Source, id: &Ident) {
        let col = fold(id);
        if !target.allows(&col) || SYSTEM_COLUMNS.contains(&col.as_str()) {
            let v = Violation::new(
                Code::ColumnNotAllowed,
                format!("column {col} of {} may not be written", target.label),
            )
            .column(col);
            let v = match target.table_name() {
                Some(t) => v.table(t),
                None => v,
            };
            self.push(v);
        }
    }

    fn write_target(&mut self, target: &Source, name: &ObjectName) {
        match single_ident(name) {
            Some(id) => self.write_column(target, id),
            None => self.push(Violation::new(
                Code::ColumnNotAllowed,
                format!("assignment target {name} must be a plain column name"),
            )),
        }
    }

    fn assignments(&mut self, target: &Source, assignments: &[Assignment]) {
        for a in assignments {
            match &a.target {
                AssignmentTarget::ColumnName(n) => self.write_target(target, n),
                AssignmentTarget::Tuple(ns) => {
                    for n in ns {
                        self.write_target(target, n);
                    }
                }
            }
            self.expr(&a.value);
        }
    }

    fn returning(&mut self, items: &Option<Vec<SelectItem>>) {
        if let Some(items) = items {
            self.projection(items);
        }
    }

    fn insert(&mut self, i: &Insert) {
        self.hints(!i.optimizer_hints.is_empty());
        if i.or.is_some()
            || i.ignore
            || i.overwrite
            || i.partitioned.is_some()
            || !i.after_columns.is_empty()
            || i.has_table_keyword
            || i.output.is_some()
            || i.replace_into
            || i.priority.is_some()
            || i.insert_alias.is_some()
            || i.settings.is_some()
            || i.format_clause.is_some()
            || i.multi_table_insert_type.is_some()
            || !i.multi_table_into_clauses.is_empty()
            || !i.multi_table_when_clauses.is_empty()
            || i.multi_table_else_clause.is_some()
            || !i.assignments.is_empty()
            || i.by_name
        {
            self.unsupported("this INSERT form");
        }
        let name = match &i.table {
            TableObject::TableName(n) => n,
            _ => {
                self.unsupported("INSERT into a function or query");
                return;
            }
        };
        let alias = i.table_alias.as_ref().map(|a| &a.alias);
        let target = self.target(name, alias);
        if i.columns.is_empty() && target.cols.has_denied() {
            self.push(
                Violation::new(
                    Code::WildcardNotAllowed,
                    format!(
                        "INSERT into {} must name its columns (the table has a column list)",
                        target.label
                    ),
                )
                .table(target.label.clone()),
            );
        }
        for c in &i.columns {
            self.write_target(&target, c);
        }
        if let Some(src) = &i.source {
            self.query(src);
        }
        self.levels.push(Level {
            sources: vec![target.clone()],
        });
        if let Some(on) = &i.on {
            match on {
                OnInsert::OnConflict(oc) => {
                    match &oc.conflict_target {
                        Some(ConflictTarget::Columns { columns, predicate }) => {
                            for c in columns {
                                self.column_ref(None, c);
                            }
                            if let Some(p) = predicate {
                                self.expr(p);
                            }
                        }
                        Some(ConflictTarget::OnConstraint(_)) | None => {}
                    }
                    if let OnConflictAction::DoUpdate(du) = &oc.action {
                        // EXCLUDED has the target's columns.
                        let excluded = Source {
                            qual: Qual::Alias("excluded".into()),
                            ..target.clone()
                        };
                        if let Some(level) = self.levels.last_mut() {
                            level.sources.push(excluded);
                        }
                        self.assignments(&target, &du.assignments);
                        if let Some(sel) = &du.selection {
                            self.expr(sel);
                        }
                        if let Some(level) = self.levels.last_mut() {
                            level.sources.pop();
                        }
                    }
                }
                _ => self.unsupported("ON DUPLICATE KEY UPDATE"),
            }
        }
        self.returning(&i.returning);
        self.levels.pop();
    }

    fn update(&mut self, u: &Update) {
        self.hints(!u.optimizer_hints.is_empty());
        if u.on_cluster.is_some()
            || u.output.is_some()
            || u.or.is_some()
            || !u.order_by.is_empty()
            || u.limit.is_some()
            || u.settings.is_some()
            || !u.table.joins.is_empty()
        {
            self.unsupported("this UPDATE form");
        }
        let target = match &u.table.relation {
            TableFactor::Table {
                name,
                alias,
                args: None,
                with_hints,
                version: None,
                partitions,
                json_path: None,
                sample: None,
                index_directives,
                ..
            } if with_hints.is_empty() && partitions.is_empty() && index_directives.is_empty() => {
                if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
                    self.unsupported("column aliases on an UPDATE target");
                }
                self.target(name, alias.as_ref().map(|a| &a.name))
            }
            _ => {
                self.unsupported("this UPDATE target");
                return;
            }
        };
        self.levels.push(Level {
            sources: vec![target.clone()],
        });
        if let Some(from) = &u.from {
            let tables = match from {
                UpdateTableFromKind::BeforeSet(t) | UpdateTableFromKind::AfterSet(t) => t,
            };
            for t in tables {
                self.table_with_joins(t);
            }
        }
        self.assignments(&target, &u.assignments);
        if let Some(sel) = &u.selection {
            self.expr(sel);
        }
        self.returning(&u.returning);
        self.levels.pop();
    }

    fn delete(&mut self, d: &Delete) {
        self.hints(!d.optimizer_hints.is_empty());
        if !d.tables.is_empty()
            || d.on_cluster.is_some()
            || d.output.is_some()
            || !d.order_by.is_empty()
            || d.limit.is_some()
            || d.settings.is_some()
        {
            self.unsupported("this DELETE form");
        }
        let from = match &d.from {
            FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => t,
        };
        let target = match from.as_slice() {
            [
                TableWithJoins {
                    relation:
                        TableFactor::Table {
                            name,
                            alias,
                            args: None,
                            with_hints,
                            version: None,
                            partitions,
                            json_path: None,
                            sample: None,
                            index_directives,
                            ..
                        },
                    joins,
                },
            ] if joins.is_empty()
                && with_hints.is_empty()
                && partitions.is_empty()
                && index_directives.is_empty() =>
            {
                if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
                    self.unsupported("column aliases on a DELETE target");
                }
                self.target(name, alias.as_ref().map(|a| &a.name))
            }
            _ => {
                self.unsupported("this DELETE target");
                return;
            }
        };
        self.levels.push(Level {
            sources: vec![target],
        });
        if let Some(using) = &d.using {
            for t in using {
                self.table_with_joins(t);
            }
        }
        if let Some(sel) = &d.selection {
            self.expr(sel);
        }
        self.returning(&d.returning);
        self.levels.pop();
    }

    // ---------------------------------------------------------------- LIMIT

    fn require_limit(&mut self, q: &Query) {
        let Some(max) = self.policy.require_limit_max else {
            return;
        };
        let mut q = q;
        loop {
            let mut found = false;
            if let Some(f) = &q.fetch {
                found = true;
                if f.with_ties || f.percent {
                    self.push(Violation::new(
                        Code::LimitRequired,
                        "FETCH FIRST ... WITH TIES / PERCENT does not bound the rows",
                    ));
                } else {
                    match &f.quantity {
                        None => {}
                        Some(e) => self.limit_literal(e, max),
                    }
                }
            }
            match &q.limit_clause {
                Some(LimitClause::LimitOffset { limit: Some(e), .. })
                | Some(LimitClause::OffsetCommaLimit { limit: e, .. }) => {
                    found = true;
                    self.limit_literal(e, max);
                }
                _ => {}
            }
            if found {
                return;
            }
            // `(SELECT ... LIMIT n)`: the parenthesised query's limit bounds the result.
            match q.body.as_ref() {
                SetExpr::Query(inner) => q = inner,
                _ => break,
            }
        }
        self.push(Violation::new(
            Code::LimitRequired,
            format!("the query must end in LIMIT n with 1 <= n <= {max}"),
        ));
    }

    fn limit_literal(&mut self, e: &Expr, max: u64) {
        let n = match e {
            Expr::Value(v) => match &v.value {
                Value::Number(s, false)
                    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    Some(s.parse::<u64>().unwrap_or(u64::MAX))
                }
                _ => None,
            },
            _ => None,
        };
        match n {
            None => self.push(Violation::new(
                Code::LimitRequired,
                "LIMIT must be a positive integer literal",
            )),
            Some(0) => self.push(Violation::new(
                Code::LimitRequired,
                "LIMIT must be a positive integer literal",
            )),
            Some(n) if n > max => self.push(Violation::new(
                Code::LimitTooLarge,
                format!("LIMIT {n} is larger than the policy's maximum {max}"),
            )),
            Some(_) => {}
        }
    }

    // ---------------------------------------------------------------- queries

    fn query_extras(&mut self, q: &Query) {
        if q.for_clause.is_some()
            || q.settings.is_some()
            || q.format_clause.is_some()
            || !q.pipe_operators.is_empty()
        {
            self.unsupported("FOR / SETTINGS / FORMAT / pipe clauses");
        }
        if !q.locks.is_empty() {
            self.push(Violation::new(
                Code::LockingNotAllowed,
                "locking clauses (FOR UPDATE / FOR SHARE) are not allowed",
            ));
        }
    }

    fn with(&mut self, recursive: bool, ctes: &[Cte]) {
        if recursive {
            self.push(Violation::new(
                Code::TooComplex,
                "WITH RECURSIVE is not allowed (unbounded work)",
            ));
        }
        for cte in ctes {
            let shape = self.cte(cte);
            let name = fold(&cte.alias.name);
            if let Some(scope) = self.ctes.last_mut() {
                scope.push(CteDef { name, shape });
            }
        }
    }

    fn cte(&mut self, cte: &Cte) -> Shape {
        if cte.from.is_some() {
            self.unsupported("CTE FROM");
        }
        let shape = self.query(&cte.query);
        self.rename(shape, &cte.alias)
    }

    /// Apply `alias(col, ...)` renames to a shape.
    fn rename(&mut self, shape: Shape, alias: &TableAlias) -> Shape {
        if alias.columns.is_empty() {
            return shape;
        }
        let renamed: Vec<String> = alias.columns.iter().map(|c| fold(&c.name)).collect();
        match shape {
            Shape::Known(mut cols) => {
                for (i, n) in renamed.into_iter().enumerate() {
                    if i < cols.len() {
                        cols[i] = n;
                    } else {
                        cols.push(n);
                    }
                }
                Shape::Known(cols)
            }
            Shape::Open => Shape::Open,
        }
    }

    fn query(&mut self, q: &Query) -> Shape {
        if !self.enter() {
            self.leave();
            return Shape::Open;
        }
        self.query_extras(q);
        self.ctes.push(Vec::new());
        if let Some(with) = &q.with {
            self.with(with.recursive, &with.cte_tables);
        }
        let shape = self.set_expr(&q.body, q.order_by.as_ref());
        match &q.limit_clause {
            Some(LimitClause::LimitOffset {
                limit,
                offset,
                limit_by,
            }) => {
                if let Some(l) = limit {
                    self.expr(l);
                }
                if let Some(o) = offset {
                    self.expr(&o.value);
                }
                if !limit_by.is_empty() {
                    self.unsupported("LIMIT BY");
                }
            }
            Some(LimitClause::OffsetCommaLimit { offset, limit }) => {
                self.expr(offset);
                self.expr(limit);
            }
            None => {}
        }
        if let Some(f) = &q.fetch
            && let Some(e) = &f.quantity
        {
            self.expr(e);
        }
        self.ctes.pop();
        self.leave();
        shape
    }

    fn set_expr(&mut self, body: &SetExpr, order_by: Option<&OrderBy>) -> Shape {
        if !self.enter() {
            self.leave();
            return Shape::Open;
        }
        let shape = match body {
            SetExpr::Select(s) => {
                let shape = self.select(s, order_by);
                self.leave();
                return shape;
            }
            SetExpr::Query(q) => self.query(q),
            SetExpr::SetOperation { left, right, .. } => {
                let l = self.set_expr(left, None);
                self.set_expr(right, None);
                l
            }
            SetExpr::Values(values) => {
                let mut width = 0;
                for row in &values.rows {
                    width = width.max(row.content.len());
                    for e in &row.content {
                        self.expr(e);
                    }
                }
                Shape::Known((1..=width).map(|i| format!("column{i}")).collect())
            }
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_) => {
                self.push(Violation::new(
                    Code::StatementNotAllowed,
                    "data-modifying statements inside a query (writable CTEs) are not allowed",
                ));
                Shape::Open
            }
            SetExpr::Table(t) => {
                let mut parts = Vec::new();
                if let Some(s) = &t.schema_name {
                    parts.push(s.clone());
                }
                match &t.table_name {
                    Some(n) => parts.push(n.clone()),
                    None => {
                        self.unsupported("TABLE without a name");
                        self.leave();
                        return Shape::Open;
                    }
                }
                let name = ObjectName::from(parts);
                let src = self.relation(&name);
                self.whole_row(&src);
                match src.cols {
                    Cols::Known(v) => Shape::Known(v),
                    _ => Shape::Open,
                }
            }
        };
        // ORDER BY of a set operation / VALUES / TABLE: only output columns.
        if let Some(ob) = order_by {
            let names = match &shape {
                Shape::Known(v) => Cols::Known(v.clone()),
                Shape::Open => Cols::Open,
            };
            self.levels.push(Level {
                sources: vec![Source {
                    qual: Qual::None,
                    cols: names,
                    label: "query output".into(),
                    base: false,
                }],
            });
            self.order_by(ob, &[]);
            self.levels.pop();
        }
        self.leave();
        shape
    }

    fn order_by(&mut self, ob: &OrderBy, outputs: &[String]) {
        if ob.interpolate.is_some() {
            self.unsupported("INTERPOLATE");
        }
        match &ob.kind {
            OrderByKind::All(_) => self.unsupported("ORDER BY ALL"),
            OrderByKind::Expressions(exprs) => {
                for e in exprs {
                    self.order_by_expr(e, outputs);
                }
            }
        }
    }

    fn order_by_expr(&mut self, e: &OrderByExpr, outputs: &[String]) {
        if e.with_fill.is_some() {
            self.unsupported("WITH FILL");
        }
        // A bare name matching an output column refers to that output column.
        if let Expr::Identifier(id) = &e.expr
            && outputs.contains(&fold(id))
        {
            return;
        }
        self.expr(&e.expr);
    }

    fn select(&mut self, s: &Select, order_by: Option<&OrderBy>) -> Shape {
        self.hints(!s.optimizer_hints.is_empty());
        if s.select_modifiers.is_some()
            || s.top.is_some()
            || s.exclude.is_some()
            || !s.lateral_views.is_empty()
            || s.prewhere.is_some()
            || !s.connect_by.is_empty()
            || !s.cluster_by.is_empty()
            || !s.distribute_by.is_empty()
            || !s.sort_by.is_empty()
            || s.qualify.is_some()
            || s.value_table_mode.is_some()
            || !matches!(s.flavor, sqlparser::ast::SelectFlavor::Standard)
        {
            self.unsupported("this SELECT form");
        }
        if s.into.is_some() {
            self.push(Violation::new(
                Code::StatementNotAllowed,
                "SELECT INTO creates a table and is not allowed",
            ));
        }
        self.levels.push(Level::default());
        for t in &s.from {
            self.table_with_joins(t);
        }
        let shape = self.projection(&s.projection);
        if let Some(Distinct::On(exprs)) = &s.distinct {
            for e in exprs {
                self.expr(e);
            }
        }
        if let Some(sel) = &s.selection {
            self.expr(sel);
        }
        match &s.group_by {
            GroupByExpr::All(_) => self.unsupported("GROUP BY ALL"),
            GroupByExpr::Expressions(exprs, modifiers) => {
                if !modifiers.is_empty() {
                    self.unsupported("GROUP BY modifiers");
                }
                let outputs = match &shape {
                    Shape::Known(v) => v.clone(),
                    Shape::Open => Vec::new(),
                };
                for e in exprs {
                    self.group_by_expr(e, &outputs);
                }
            }
        }
        if let Some(h) = &s.having {
            self.expr(h);
        }
        for w in &s.named_window {
            match &w.1 {
                NamedWindowExpr::NamedWindow(_) => {}
                NamedWindowExpr::WindowSpec(spec) => self.window_spec(spec),
            }
        }
        if let Some(ob) = order_by {
            let outputs = match &shape {
                Shape::Known(v) => v.clone(),
                Shape::Open => Vec::new(),
            };
            self.order_by(ob, &outputs);
        }
        self.levels.pop();
        shape
    }

    /// A GROUP BY item. A bare name is an input column of this query level
    /// if some FROM item here has it, else an output column (PostgreSQL's
    /// rule, the reverse of ORDER BY's).
    fn group_by_expr(&mut self, e: &Expr, outputs: &[String]) {
        let Expr::Identifier(id) = e else {
            return self.expr(e);
        };
        let name = fold(id);
        let keyword = id.quote_style.is_none() && KEYWORD_FUNCTIONS.contains(&name.as_str());
        if keyword || !outputs.contains(&name) {
            return self.expr(e);
        }
        let sources: Vec<Source> = self
            .levels
            .last()
            .map(|l| l.sources.clone())
            .unwrap_or_default();
        if sources.iter().any(|s| s.has(&name) == Has::Yes) {
            return self.expr(e);
        }
        // An output alias, unless a FROM item here has an unknown column of
        // that name; such a binding must be allowed too.
        let why = || {
            format!(
                "GROUP BY {name} names an input column when a FROM item has one (before the output column {name}), and the engine does not know all their columns"
            )
        };
        for s in sources.iter().filter(|s| s.has(&name) == Has::Maybe) {
            self.check_binding(s, &name, Some(why));
        }
    }

    /// The select list (also RETURNING). Returns the output shape.
    fn projection(&mut self, items: &[SelectItem]) -> Shape {
        let mut names = Vec::new();
        let mut open = false;
        for item in items {
            match item {
                SelectItem::UnnamedExpr(e) => {
                    self.expr(e);
                    names.push(output_name(e));
                }
                SelectItem::ExprWithAlias { expr, alias } => {
                    self.expr(expr);
                    names.push(fold(alias));
                }
                SelectItem::ExprWithAliases { expr, aliases } => {
                    self.expr(expr);
                    names.extend(aliases.iter().map(fold));
                }
                SelectItem::Wildcard(opts) => {
                    self.wildcard_options(opts);
                    let sources: Vec<Source> = self
                        .levels
                        .last()
                        .map(|l| l.sources.clone())
                        .unwrap_or_default();
                    if sources.is_empty() {
                        self.push(Violation::new(
                            Code::WildcardNotAllowed,
                            "* without a FROM clause",
                        ));
                    }
                    for src in &sources {
                        match self.whole_row(src) {
                            Some(cols) => names.extend(cols),
                            None => open = true,
                        }
                    }
                }
                SelectItem::QualifiedWildcard(kind, opts) => {
                    self.wildcard_options(opts);
                    match kind {
                        SelectItemQualifiedWildcardKind::ObjectName(name) => {
                            match self.qualified_source(name) {
                                Some(src) => match self.whole_row(&src) {
                                    Some(cols) => names.extend(cols),
                                    None => open = true,
                                },
                                None => open = true,
                            }
                        }
                        SelectItemQualifiedWildcardKind::Expr(_) => {
                            self.unsupported("(expression).*");
                            open = true;
                        }
                    }
                }
            }
        }
        if open {
            Shape::Open
        } else {
            Shape::Known(names)
        }
    }

    fn wildcard_options(&mut self, o: &WildcardAdditionalOptions) {
        if o.opt_ilike.is_some()
            || o.opt_exclude.is_some()
            || o.opt_except.is_some()
            || o.opt_replace.is_some()
            || o.opt_rename.is_some()
            || o.opt_alias.is_some()
        {
            self.unsupported("wildcard options");
        }
    }

    /// A read of every column of `src` (`*`, `t.*`, a whole-row reference,
    /// `TABLE t`). Returns the column names when known.
    fn whole_row(&mut self, src: &Source) -> Option<Vec<String>> {
        match &src.cols {
            c if c.has_denied() => {
                self.push(
                    Violation::new(
                        Code::WildcardNotAllowed,
                        format!(
                            "* and whole-row references are not allowed for {} (it has a column list)",
                            src.label
                        ),
                    )
                    .table(src.label.clone()),
                );
                None
            }
            Cols::Known(v) => Some(v.clone()),
            Cols::Catalog(v) => Some(v.iter().map(|(c, _)| c.clone()).collect()),
            Cols::Listed(_) | Cols::All | Cols::Open => None,
        }
    }

    // ---------------------------------------------------------------- FROM

    fn add_source(&mut self, src: Source) {
        self.relations += 1;
        if self.relations == MAX_RELATIONS + 1 {
            self.push(Violation::new(
                Code::TooComplex,
                format!("more than {MAX_RELATIONS} relations in one statement"),
            ));
        }
        if let Some(level) = self.levels.last_mut() {
            level.sources.push(src);
        }
    }

    fn table_with_joins(&mut self, t: &TableWithJoins) {
        if !self.enter() {
            self.leave();
            return;
        }
        self.table_factor(&t.relation);
        for j in &t.joins {
            self.join(j);
        }
        self.leave();
    }

    fn join(&mut self, j: &Join) {
        if j.global {
            self.unsupported("GLOBAL JOIN");
        }
        let before = self.levels.last().map(|l| l.sources.len()).unwrap_or(0);
        self.table_factor(&j.relation);
        let constraint = match &j.join_operator {
            JoinOperator::Join(c)
            | JoinOperator::Inner(c)
            | JoinOperator::Left(c)
            | JoinOperator::LeftOuter(c)
            | JoinOperator::Right(c)
            | JoinOperator::RightOuter(c)
            | JoinOperator::FullOuter(c)
            | JoinOperator::CrossJoin(c) => c,
            _ => {
                self.unsupported("this join type");
                return;
            }
        };
        match constraint {
            JoinConstraint::On(e) => self.expr(e),
            JoinConstraint::Using(cols) => {
                // USING reads the column from both sides.
                let sources: Vec<Source> = self
                    .levels
                    .last()
                    .map(|l| l.sources.clone())
                    .unwrap_or_default();
                for c in cols {
                    let Some(id) = single_ident(c) else {
                        self.unsupported("qualified USING column");
                        continue;
                    };
                    let col = fold(id);
                    let candidates: Vec<&Source> =
                        sources.iter().filter(|s| s.might_contain(&col)).collect();
                    let left_has = sources[..before.min(sources.len())]
                        .iter()
                        .any(|s| s.might_contain(&col));
                    let right_has = sources[before.min(sources.len())..]
                        .iter()
                        .any(|s| s.might_contain(&col));
                    if !left_has || !right_has {
                        self.push(
                            Violation::new(
                                Code::ColumnNotAllowed,
                                format!("USING column {col} is not visible on both sides"),
                            )
                            .column(col.clone()),
                        );
                    }
                    for s in candidates {
                        self.check_column_in(s, &col);
                    }
                }
            }
            JoinConstraint::Natural => {
                let sources: Vec<Source> = self
                    .levels
                    .last()
                    .map(|l| l.sources.clone())
                    .unwrap_or_default();
                for s in sources.iter().filter(|s| s.cols.has_denied()) {
                    self.push(
                        Violation::new(
                            Code::WildcardNotAllowed,
                            format!(
                                "NATURAL JOIN reads unnamed columns of {}; use ON or USING",
                                s.label
                            ),
                        )
                        .table(s.label.clone()),
                    );
                }
            }
            JoinConstraint::None => {}
            JoinConstraint::UsingAlias(..) => self.unsupported("USING ... AS"),
        }
    }

    /// `table AS a (c1, ...)`: the alias qualifies the table's columns; the
    /// column list renames them by position.
    fn alias_table(&mut self, src: &mut Source, a: &TableAlias) {
        src.qual = Qual::Alias(fold(&a.name));
        if !a.columns.is_empty() {
            match &src.cols {
                Cols::Listed(_) | Cols::All => {
                    // Positional renames hide which column is read.
                    self.push(
                        Violation::new(
                            Code::ColumnNotAllowed,
                            format!(
                                "column aliases on table {} cannot be bound with certainty: they rename columns by position, and the engine does not know the table's column order",
                                src.label
                            ),
                        )
                        .table(src.label.clone()),
                    );
                    src.cols = Cols::Open;
                }
                Cols::Known(v) => {
                    src.cols = self.rename(Shape::Known(v.clone()), a).into_cols();
                }
                Cols::Catalog(v) => {
                    // Renames apply to the columns in table order.
                    let mut v = v.as_ref().clone();
                    for (i, c) in a.columns.iter().enumerate() {
                        if let Some(slot) = v.get_mut(i) {
                            slot.0 = fold(&c.name);
                        }
                    }
                    src.cols = Cols::Catalog(Arc::new(v));
                }
                Cols::Open => {}
            }
        }
    }

    fn table_factor(&mut self, tf: &TableFactor) {
        if !self.enter() {
            self.leave();
            return;
        }
        match tf {
            TableFactor::Table {
                name,
                alias,
                args,
                with_hints,
                version,
                with_ordinality,
                partitions,
                json_path,
                sample,
                index_directives,
                inheritance: _,
            } => {
                if !with_hints.is_empty()
                    || version.is_some()
                    || !partitions.is_empty()
                    || json_path.is_some()
                    || !index_directives.is_empty()
                {
                    self.unsupported("table hints, versions or partitions");
                }
                if sample.is_some() {
                    self.unsupported("TABLESAMPLE");
                }
                if let Some(args) = args {
                    // A function in FROM.
                    if args.settings.is_some() {
                        self.unsupported("function SETTINGS");
                    }
                    for a in &args.args {
                        self.function_arg(a, false);
                    }
                    self.function_source(name, alias.as_ref(), *with_ordinality);
                } else {
                    let mut src = self.relation(name);
                    if let Some(a) = alias {
                        self.alias_table(&mut src, a);
                    }
                    self.add_source(src);
                }
            }
            TableFactor::Derived {
                lateral,
                subquery,
                alias,
                sample,
            } => {
                if sample.is_some() {
                    self.unsupported("TABLESAMPLE");
                }
                // A non-LATERAL subquery cannot see the FROM items of its own level.
                let hidden = if *lateral { None } else { self.levels.pop() };
                let shape = self.query(subquery);
                if let Some(level) = hidden {
                    self.levels.push(level);
                }
                let (qual, shape) = match alias {
                    Some(a) => (Qual::Alias(fold(&a.name)), self.rename(shape, a)),
                    None => (Qual::None, shape),
                };
                self.add_source(Source {
                    qual,
                    cols: shape.into_cols(),
                    label: "subquery".into(),
                    base: false,
                });
            }
            TableFactor::Function {
                lateral: _,
                name,
                args,
                with_ordinality,
                alias,
            } => {
                for a in args {
                    self.function_arg(a, false);
                }
                self.function_source(name, alias.as_ref(), *with_ordinality);
            }
            TableFactor::UNNEST {
                alias,
                array_exprs,
                with_offset,
                with_offset_alias,
                with_ordinality: _,
            } => {
                if *with_offset || with_offset_alias.is_some() {
                    self.unsupported("UNNEST WITH OFFSET");
                }
                for e in array_exprs {
                    self.expr(e);
                }
                let name = ObjectName::from(vec![Ident::new("unnest")]);
                self.function_source(&name, alias.as_ref(), false);
            }
            TableFactor::NestedJoin {
                table_with_joins,
                alias,
            } => {
                if alias.is_some() {
                    self.unsupported("an alias on a parenthesised join");
                }
                self.table_with_joins(table_with_joins);
            }
            _ => self.unsupported("this FROM item"),
        }
        self.leave();
    }

    /// A function in FROM: checked against the allow-list, and added as a
    /// source with the columns PostgreSQL gives it. A function on the
    /// default list returns one value, so its one column is named after the
    /// alias's first column, else the alias, else the function (and WITH
    /// ORDINALITY adds `ordinality`). Other functions (`unnest`, whose
    /// output can be a composite, and `functions.allow` entries) have
    /// unknown columns.
    fn function_source(&mut self, name: &ObjectName, alias: Option<&TableAlias>, ordinality: bool) {
        let allowed = self.function_name(name);
        let fname = last_ident(name).map(fold).unwrap_or_default();
        let scalar = allowed.as_deref().is_some_and(|n| {
            super::functions::DEFAULT_FUNCTIONS.contains(&n) && !AGGREGATES_AND_WINDOWS.contains(&n)
        });
        let cols = if scalar {
            let listed: Vec<String> = alias
                .map(|a| a.columns.iter().map(|c| fold(&c.name)).collect())
                .unwrap_or_default();
            let first = listed
                .first()
                .cloned()
                .or_else(|| alias.map(|a| fold(&a.name)))
                .unwrap_or_else(|| fname.clone());
            let mut cols = vec![first];
            if ordinality {
                cols.push(
                    listed
                        .get(1)
                        .cloned()
                        .unwrap_or_else(|| "ordinality".into()),
                );
            }
            Cols::Known(cols)
        } else {
            Cols::Open
        };
        let qual = match alias {
            Some(a) => Qual::Alias(fold(&a.name)),
            None => Qual::Alias(fname),
        };
        self.add_source(Source {
            qual,
            cols,
            label: name.to_string(),
            base: false,
        });
    }

    /// Resolve a relation name in FROM / TABLE / IN TABLE: a CTE or a policy table.
    fn relation(&mut self, name: &ObjectName) -> Source {
        if let Some(id) = single_ident(name) {
            let n = fold(id);
            for scope in self.ctes.iter().rev() {
                if let Some(cte) = scope.iter().rev().find(|c| c.name == n) {
                    let cols = cte.shape.clone().into_cols();
                    return Source {
                        qual: Qual::Alias(n.clone()),
                        cols,
                        label: n,
                        base: false,
                    };
                }
            }
        }
        self.base_table(name)
    }

    /// Resolve a base table name against the policy. Denied tables yield an
    /// open source so that one denied table does not cascade into noise.
    fn base_table(&mut self, name: &ObjectName) -> Source {
        let parts: Option<Vec<String>> = name
            .0
            .iter()
            .map(|p| match p {
                ObjectNamePart::Identifier(id) => Some(fold(id)),
                ObjectNamePart::Function(_) => None,
            })
            .collect();
        let denied = |w: &mut Self, label: String, why: String| {
            w.push(Violation::new(Code::TableNotAllowed, why).table(label.clone()));
            Source {
                qual: Qual::Alias(label.clone()),
                cols: Cols::Open,
                label,
                base: false,
            }
        };
        let Some(parts) = parts else {
            return denied(
                self,
                name.to_string(),
                format!("table {name} is not allowed"),
            );
        };
        let (schema, table) = match parts.as_slice() {
            [t] => {
                let first = self.policy.search_path[0].clone();
                if t.starts_with("pg_") {
                    return denied(
                        self,
                        t.clone(),
                        format!("table {t} is not allowed (pg_ names resolve to pg_catalog first)"),
                    );
                }
                if !self.policy.tables.contains_key(&(first.clone(), t.clone())) {
                    let elsewhere = self
                        .policy
                        .search_path
                        .iter()
                        .skip(1)
                        .find(|s| self.policy.tables.contains_key(&((*s).clone(), t.clone())));
                    let why = match elsewhere {
                        Some(s) => format!(
                            "table {t} resolves to {first}.{t}, which is not allowed; write {s}.{t}"
                        ),
                        None => format!("table {first}.{t} is not allowed"),
                    };
                    return denied(self, format!("{first}.{t}"), why);
                }
                (first, t.clone())
            }
            [s, t] => (s.clone(), t.clone()),
            _ => {
                let label = parts.join(".");
                return denied(
                    self,
                    label.clone(),
                    format!("table {label} is not allowed (use schema.table)"),
                );
            }
        };
        // Not format!: this runs for every table of every request.
        let mut label = String::with_capacity(schema.len() + 1 + table.len());
        label.push_str(&schema);
        label.push('.');
        label.push_str(&table);
        let Some(cols) = self.policy.tables.get(&(schema.clone(), table.clone())) else {
            return denied(self, label.clone(), format!("table {label} is not allowed"));
        };
        let cols = match (
            self.policy.catalog.get(&(schema.clone(), table.clone())),
            cols,
        ) {
            (Some(all), Some(set)) => Cols::Catalog(Arc::new(
                all.iter().map(|c| (c.clone(), set.contains(c))).collect(),
            )),
            (Some(all), None) => {
                Cols::Catalog(Arc::new(all.iter().map(|c| (c.clone(), true)).collect()))
            }
            (None, Some(set)) => Cols::Listed(Arc::clone(set)),
            (None, None) => Cols::All,
        };
        Source {
            qual: Qual::Table {
                schema: Some(schema),
                name: table,
            },
            cols,
            label,
            base: true,
        }
    }

    // ---------------------------------------------------------------- columns

    /// The source named by a qualifier (`t` or `s.t`), innermost level first.
    fn find_source(&self, qual: &[String]) -> Option<Source> {
        for level in self.levels.iter().rev() {
            if let Some(s) = level.sources.iter().find(|s| s.matches(qual)) {
                return Some(s.clone());
            }
        }
        None
    }

    fn qualified_source(&mut self, name: &ObjectName) -> Option<Source> {
        let Some(qual) = idents(name) else {
            self.unsupported("this qualified name");
            return None;
        };
        match self.find_source(&qual) {
            Some(s) => Some(s),
            None => {
                let q = qual.join(".");
                self.push(Violation::new(
                    Code::TableNotAllowed,
                    format!("{q} does not name a table in the FROM clause"),
                ));
                None
            }
        }
    }

    fn check_column_in(&mut self, src: &Source, col: &str) {
        self.check_binding(src, col, None::<fn() -> String>);
    }

    /// Deny reading `col` of `src` unless the source allows it. `uncertain`
    /// names the other possible binding when PostgreSQL's choice depends on
    /// columns the engine does not know.
    fn check_binding(&mut self, src: &Source, col: &str, uncertain: Option<impl Fn() -> String>) {
        if src.allows(col) {
            return;
        }
        let uncertain = uncertain.map(|why| why());
        let system = src.base && SYSTEM_COLUMNS.contains(&col);
        let what = match src.table_name() {
            Some(t) if system => format!("system column {col} of {t} is not allowed"),
            Some(t) => format!("column {col} of {t} is not allowed"),
            None => format!("column {col} is not an output column of {}", src.label),
        };
        let msg = match &uncertain {
            Some(why) => format!(
                "{col} cannot be bound with certainty: it may bind to {}, whose {what_short}; {why}",
                src.table_name().unwrap_or_else(|| src.label.clone()),
                what_short = if system {
                    "system columns are not allowed".to_string()
                } else {
                    format!("column {col} is not allowed")
                },
            ),
            None => what,
        };
        let v = Violation::new(Code::ColumnNotAllowed, msg).column(col.to_string());
        let v = match src.table_name() {
            Some(t) => v.table(t),
            None => v,
        };
        self.push(v);
    }

    fn column_ref(&mut self, qualifier: Option<&[Ident]>, id: &Ident) {
        let col = fold(id);
        if let Some(q) = qualifier {
            let qual: Vec<String> = q.iter().map(fold).collect();
            match self.find_source(&qual) {
                Some(src) => self.qualified_column(&src, &qual.join("."), &col),
                None => {
                    let q = qual.join(".");
                    self.push(
                        Violation::new(
                            Code::ColumnNotAllowed,
                            format!("{q}.{col}: {q} does not name a table in the FROM clause"),
                        )
                        .column(col),
                    );
                }
            }
            return;
        }
        // DEFAULT in VALUES or SET (sqlparser reads it as a name); elsewhere
        // PostgreSQL rejects it.
        if id.quote_style.is_none() && col == "default" {
            return;
        }
        // SQL keywords that PostgreSQL evaluates as functions, whatever the
        // FROM clause holds (a quoted name is an identifier).
        if id.quote_style.is_none() && KEYWORD_FUNCTIONS.contains(&col.as_str()) {
            self.function_name(&ObjectName::from(vec![id.clone()]));
            return;
        }
        // PostgreSQL binds an unqualified name to the innermost query level
        // where some FROM item has a column of that name, else it is a
        // whole-row reference. Every binding that is possible given what the
        // engine knows must be allowed.
        let mut possible: Vec<Source> = Vec::new();
        let mut bound = false;
        for level in self.levels.iter().rev() {
            let mut yes: Vec<Source> = Vec::new();
            let mut maybe: Vec<Source> = Vec::new();
            for s in &level.sources {
                match s.has(&col) {
                    Has::Yes => yes.push(s.clone()),
                    Has::Maybe => maybe.push(s.clone()),
                    Has::No => {}
                }
            }
            if !yes.is_empty() {
                // A second owner at this level would be an ambiguity error,
                // so the name binds to one of `yes` or fails.
                possible.extend(yes);
                bound = true;
                break;
            }
            possible.extend(maybe);
        }
        let certain = bound && possible.len() == 1 && possible[0].has(&col) == Has::Yes;
        let why = || {
            let names: Vec<String> = possible
                .iter()
                .map(|s| s.table_name().unwrap_or_else(|| s.label.clone()))
                .collect();
            format!(
                "PostgreSQL binds it to the innermost of {} that has such a column, and the engine does not know all their columns (qualify the name, or give the policy a catalog)",
                names.join(", ")
            )
        };
        for s in &possible {
            if certain {
                self.check_binding(s, &col, None::<fn() -> String>);
            } else {
                self.check_binding(s, &col, Some(why));
            }
        }
        if bound {
            return;
        }
        // No certain column: it may also be a whole-row reference.
        let whole_row = self.levels.iter().rev().find_map(|l| {
            l.sources
                .iter()
                .find(|s| s.single_name() == Some(col.as_str()))
                .cloned()
        });
        match whole_row {
            Some(src) => {
                self.whole_row(&src);
            }
            None if possible.is_empty() => self.push(
                Violation::new(
                    Code::ColumnNotAllowed,
                    format!("{col} does not name a column of any table in the FROM clause"),
                )
                .column(col),
            ),
            None => {}
        }
    }

    /// `q.col`: a column of the source `q`, or, when `q` has no such column,
    /// a call of the function `col` on `q`'s whole row (PostgreSQL's
    /// attribute notation).
    fn qualified_column(&mut self, src: &Source, q: &str, col: &str) {
        match src.has(col) {
            Has::Yes => self.check_column_in(src, col),
            Has::No => {
                // Not a column: `q.col` calls col(q).
                self.attribute_call(q, col, Some(src));
            }
            Has::Maybe => match &src.cols {
                Cols::Listed(_) | Cols::Catalog(_) => self.check_column_in(src, col),
                _ => {
                    if !self.policy.functions.contains(col) && ROW_FUNCTIONS.contains(&col) {
                        self.push(
                            Violation::new(
                                Code::FunctionNotAllowed,
                                format!(
                                    "{q}.{col} cannot be bound with certainty: unless {q} has a column {col}, PostgreSQL calls the function {col}({q}), which is not allowed (the engine does not know {q}'s columns)"
                                ),
                            )
                            .column(col.to_string()),
                        );
                    } else {
                        self.check_column_in(src, col);
                    }
                }
            },
        }
    }

    /// `x.f` or `(expr).f` that is not a known column or field: PostgreSQL
    /// calls `f(x)`.
    fn attribute_call(&mut self, shown: &str, f: &str, src: Option<&Source>) {
        if self.policy.functions.contains(f) {
            if let Some(src) = src {
                self.whole_row(src);
            }
            return;
        }
        self.push(Violation::new(
            Code::FunctionNotAllowed,
            format!(
                "{shown}.{f} is a call of the function {f}({shown}) unless {shown} is known to have a column or field {f}; function {f} is not allowed"
            ),
        ));
    }

    // ---------------------------------------------------------------- expressions

    fn exprs(&mut self, es: &[Expr]) {
        for e in es {
            self.expr(e);
        }
    }

    fn expr(&mut self, e: &Expr) {
        if !self.enter() {
            self.leave();
            return;
        }
        self.expr_inner(e);
        self.leave();
    }

    /// One arm per expression kind, in four groups: column references and
    /// IS tests, operators, values and calls, the kinds refused.
    fn expr_inner(&mut self, e: &Expr) {
        match e {
            Expr::Identifier(id) => self.column_ref(None, id),
            Expr::CompoundIdentifier(parts) => match parts.as_slice() {
                [q @ .., c] if (1..=2).contains(&q.len()) => self.column_ref(Some(q), c),
                _ => self.push(Violation::new(
                    Code::ColumnNotAllowed,
                    format!(
                        "{} is not allowed (use table.column or schema.table.column)",
                        parts
                            .iter()
                            .map(|p| p.value.as_str())
                            .collect::<Vec<_>>()
                            .join(".")
                    ),
                )),
            },
            Expr::CompoundFieldAccess { root, access_chain } => {
                self.expr(root);
                for a in access_chain {
                    match a {
                        sqlparser::ast::AccessExpr::Dot(field) => match field {
                            // `(expr).f` is a field only when expr is a
                            // composite with a field f; otherwise PostgreSQL
                            // calls f(expr). The engine does not know value
                            // types, so f must be an allowed function.
                            Expr::Identifier(f) => {
                                self.attribute_call("(expression)", &fold(f), None)
                            }
                            _ => self.unsupported("this field access"),
                        },
                        sqlparser::ast::AccessExpr::Subscript(s) => match s {
                            sqlparser::ast::Subscript::Index { index } => self.expr(index),
                            sqlparser::ast::Subscript::Slice {
                                lower_bound,
                                upper_bound,
                                stride,
                            } => {
                                for b in [lower_bound, upper_bound, stride].into_iter().flatten() {
                                    self.expr(b);
                                }
                            }
                        },
                    }
                }
            }
            Expr::IsFalse(x)
            | Expr::IsNotFalse(x)
            | Expr::IsTrue(x)
            | Expr::IsNotTrue(x)
            | Expr::IsNull(x)
            | Expr::IsNotNull(x)
            | Expr::IsUnknown(x)
            | Expr::IsNotUnknown(x)
            | Expr::Nested(x) => self.expr(x),
            Expr::IsDistinctFrom(a, b) | Expr::IsNotDistinctFrom(a, b) => {
                self.expr(a);
                self.expr(b);
            }
            Expr::IsJson { expr, .. } | Expr::IsNormalized { expr, .. } => self.expr(expr),
            _ => self.operator_expr(e),
        }
    }

    /// IN, BETWEEN, binary and unary operators, pattern matching and
    /// quantified comparisons.
    fn operator_expr(&mut self, e: &Expr) {
        match e {
            Expr::In {
                expr,
                target,
                negated: _,
                global,
            } => {
                if *global {
                    self.unsupported("GLOBAL IN");
                }
                self.expr(expr);
                match target {
                    InTarget::List(list) => self.exprs(list),
                    InTarget::Subquery(q) => {
                        self.query(q);
                    }
                    InTarget::Unnest(x) => self.expr(x),
                    InTarget::Table { name, args } => {
                        if args.is_some() {
                            self.unsupported("IN TABLE with arguments");
                        }
                        let src = self.relation(name);
                        self.whole_row(&src);
                    }
                }
            }
            Expr::Between {
                expr, low, high, ..
            } => {
                self.expr(expr);
                self.expr(low);
                self.expr(high);
            }
            Expr::BinaryOp { left, op, right } => {
                if matches!(op, BinaryOperator::PGCustomBinaryOperator(_)) {
                    self.push(Violation::new(
                        Code::FunctionNotAllowed,
                        format!("operator {op} is not allowed"),
                    ));
                }
                self.expr(left);
                self.expr(right);
            }
            Expr::Like {
                expr,
                pattern,
                escape_char,
                ..
            }
            | Expr::ILike {
                expr,
                pattern,
                escape_char,
                ..
            }
            | Expr::SimilarTo {
                expr,
                pattern,
                escape_char,
                ..
            } => {
                self.expr(expr);
                self.expr(pattern);
                if let Some(esc) = escape_char {
                    self.expr(esc);
                }
            }
            Expr::AnyOp {
                left,
                compare_op,
                right,
                ..
            }
            | Expr::AllOp {
                left,
                compare_op,
                right,
            } => {
                if matches!(compare_op, BinaryOperator::PGCustomBinaryOperator(_)) {
                    self.push(Violation::new(
                        Code::FunctionNotAllowed,
                        format!("operator {compare_op} is not allowed"),
                    ));
                }
                self.expr(left);
                self.expr(right);
            }
            Expr::UnaryOp { expr, .. } => self.expr(expr),
            _ => self.value_expr(e),
        }
    }

    /// Casts, built-in calls, literals, CASE, subqueries, row constructors
    /// and wildcards.
    fn value_expr(&mut self, e: &Expr) {
        match e {
            Expr::Cast {
                kind,
                expr,
                data_type,
                format,
            } => {
                if !matches!(kind, CastKind::Cast | CastKind::DoubleColon) || format.is_some() {
                    self.unsupported("this cast form");
                }
                self.data_type(data_type);
                self.expr(expr);
            }
            Expr::AtTimeZone {
                timestamp,
                time_zone,
            } => {
                self.expr(timestamp);
                self.expr(time_zone);
            }
            Expr::Extract { expr, .. } => self.expr(expr),
            Expr::Ceil { expr, .. } | Expr::Floor { expr, .. } => self.expr(expr),
            Expr::Position { expr, r#in } => {
                self.expr(expr);
                self.expr(r#in);
            }
            Expr::Substring {
                expr,
                substring_from,
                substring_for,
                ..
            } => {
                self.expr(expr);
                for x in [substring_from, substring_for].into_iter().flatten() {
                    self.expr(x);
                }
            }
            Expr::Trim {
                expr,
                trim_what,
                trim_characters,
                ..
            } => {
                self.expr(expr);
                if let Some(w) = trim_what {
                    self.expr(w);
                }
                if let Some(cs) = trim_characters {
                    self.exprs(cs);
                }
            }
            Expr::Overlay {
                expr,
                overlay_what,
                overlay_from,
                overlay_for,
            } => {
                self.expr(expr);
                self.expr(overlay_what);
                self.expr(overlay_from);
                if let Some(f) = overlay_for {
                    self.expr(f);
                }
            }
            Expr::Collate { expr, .. } => self.expr(expr),
            Expr::Value(_) => {}
            Expr::TypedString(ts) => self.data_type(&ts.data_type),
            Expr::Function(f) => self.function(f),
            Expr::Case {
                operand,
                conditions,
                else_result,
                ..
            } => {
                if let Some(o) = operand {
                    self.expr(o);
                }
                for c in conditions {
                    self.expr(&c.condition);
                    self.expr(&c.result);
                }
                if let Some(x) = else_result {
                    self.expr(x);
                }
            }
            Expr::Exists { subquery, .. } | Expr::Subquery(subquery) => {
                self.query(subquery);
            }
            Expr::GroupingSets(sets) | Expr::Cube(sets) | Expr::Rollup(sets) => {
                for s in sets {
                    self.exprs(s);
                }
            }
            Expr::Tuple(items) => self.exprs(items),
            Expr::Array(a) => self.exprs(&a.elem),
            Expr::Interval(i) => self.expr(&i.value),
            Expr::Wildcard(_) => {
                let sources: Vec<Source> = self
                    .levels
                    .last()
                    .map(|l| l.sources.clone())
                    .unwrap_or_default();
                for s in &sources {
                    self.whole_row(s);
                }
            }
            Expr::QualifiedWildcard(name, _) => {
                if let Some(src) = self.qualified_source(name) {
                    self.whole_row(&src);
                }
            }
            _ => self.refused_expr(e),
        }
    }

    /// The expression kinds the engine refuses.
    fn refused_expr(&mut self, e: &Expr) {
        match e {
            Expr::JsonAccess { .. } => self.unsupported("JSON path access"),
            Expr::RLike { .. } => self.unsupported("RLIKE / REGEXP"),
            Expr::Convert { .. } => self.unsupported("CONVERT"),
            Expr::Prefixed { .. } => self.unsupported("prefixed literals"),
            Expr::Struct { .. } => self.unsupported("STRUCT"),
            Expr::Named { .. } => self.unsupported("named expressions"),
            Expr::Dictionary(_) => self.unsupported("dictionaries"),
            Expr::Map(_) => self.unsupported("MAP"),
            Expr::MatchAgainst { .. } => self.unsupported("MATCH AGAINST"),
            Expr::OuterJoin(_) => self.unsupported("(+) outer joins"),
            Expr::Prior(_) => self.unsupported("PRIOR"),
            Expr::Lambda(_) => self.unsupported("lambdas"),
            Expr::MemberOf(_) => self.unsupported("MEMBER OF"),
            _ => self.unsupported("this expression"),
        }
    }

    fn data_type(&mut self, dt: &DataType) {
        let shown = dt.to_string();
        if !is_safe_type(&shown) {
            self.push(Violation::new(
                Code::FunctionNotAllowed,
                format!("casts to type {shown} are not allowed"),
            ));
        }
    }

    // ---------------------------------------------------------------- functions

    /// Check a function name against the allow-list. Returns the folded
    /// unqualified name when allowed.
    fn function_name(&mut self, name: &ObjectName) -> Option<String> {
        let parts = idents(name);
        let allowed = match parts.as_deref() {
            Some([n]) => self.policy.functions.contains(n).then(|| n.clone()),
            Some([s, n]) if s == "pg_catalog" && self.policy.functions.contains(n) => {
                Some(n.clone())
            }
            Some(p) if self.policy.qualified_functions.contains(&p.join(".")) => p.last().cloned(),
            _ => None,
        };
        if allowed.is_none() {
            let shown = match &parts {
                Some(p) => p.join("."),
                None => name.to_string(),
            };
            self.push(Violation::new(
                Code::FunctionNotAllowed,
                format!("function {shown} is not allowed"),
            ));
        }
        allowed
    }

    fn function(&mut self, f: &Function) {
        // ARRAY(subquery) parses as a function named ARRAY.
        let is_array_subquery = matches!(f.args, FunctionArguments::Subquery(_))
            && idents(&f.name).is_some_and(|p| p.len() == 1 && p[0] == "array")
            && f.name
                .0
                .iter()
                .all(|p| matches!(p, ObjectNamePart::Identifier(i) if i.quote_style.is_none()));
        let name = if is_array_subquery {
            Some("array".to_string())
        } else {
            self.function_name(&f.name)
        };
        if f.uses_odbc_syntax || !matches!(f.parameters, FunctionArguments::None) {
            self.unsupported("this function call form");
        }
        match &f.args {
            FunctionArguments::None => {}
            FunctionArguments::Subquery(q) => {
                if !is_array_subquery {
                    self.unsupported("a subquery as function arguments");
                }
                self.query(q);
            }
            FunctionArguments::List(list) => {
                let is_count = name.as_deref() == Some("count");
                for a in &list.args {
                    self.function_arg(a, is_count);
                }
                for c in &list.clauses {
                    match c {
                        FunctionArgumentClause::OrderBy(obs) => {
                            for ob in obs {
                                self.order_by_expr(ob, &[]);
                            }
                        }
                        FunctionArgumentClause::IgnoreOrRespectNulls(_) => {}
                        _ => self.unsupported("this function argument clause"),
                    }
                }
            }
        }
        for ob in &f.within_group {
            self.order_by_expr(ob, &[]);
        }
        if let Some(filter) = &f.filter {
            self.expr(filter);
        }
        match &f.over {
            None | Some(WindowType::NamedWindow(_)) => {}
            Some(WindowType::WindowSpec(spec)) => self.window_spec(spec),
        }
    }

    fn function_arg(&mut self, a: &FunctionArg, star_ok: bool) {
        let arg = match a {
            FunctionArg::Unnamed(arg) | FunctionArg::Named { arg, .. } => arg,
            FunctionArg::ExprNamed { .. } => {
                self.unsupported("expression-named arguments");
                return;
            }
        };
        match arg {
            FunctionArgExpr::Expr(e) => self.expr(e),
            FunctionArgExpr::Wildcard => {
                if !star_ok {
                    self.push(Violation::new(
                        Code::WildcardNotAllowed,
                        "* is only allowed in count(*)",
                    ));
                }
            }
            FunctionArgExpr::QualifiedWildcard(name) => {
                if let Some(src) = self.qualified_source(name) {
                    self.whole_row(&src);
                }
            }
            FunctionArgExpr::WildcardWithOptions(_) => self.unsupported("wildcard options"),
        }
    }

    fn window_spec(&mut self, spec: &WindowSpec) {
        self.exprs(&spec.partition_by);
        for ob in &spec.order_by {
            self.order_by_expr(ob, &[]);
        }
        if let Some(frame) = &spec.window_frame {
            for b in std::iter::once(&frame.start_bound).chain(frame.end_bound.iter()) {
                match b {
                    WindowFrameBound::CurrentRow => {}
                    WindowFrameBound::Preceding(x) | WindowFrameBound::Following(x) => {
                        if let Some(x) = x {
                            self.expr(x);
                        }
                    }
                }
            }
        }
    }
}

fn single_ident(name: &ObjectName) -> Option<&Ident> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(id)] => Some(id),
        _ => None,
    }
}

fn last_ident(name: &ObjectName) -> Option<&Ident> {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(id)) => Some(id),
        _ => None,
    }
}

/// The folded parts of a name, or None when a part is not an identifier.
fn idents(name: &ObjectName) -> Option<Vec<String>> {
    name.0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(id) => Some(fold(id)),
            ObjectNamePart::Function(_) => None,
        })
        .collect()
}

/// PostgreSQL's output column name for an unaliased select item.
fn output_name(e: &Expr) -> String {
    match e {
        Expr::Identifier(id) => fold(id),
        Expr::CompoundIdentifier(parts) => parts.last().map(fold).unwrap_or_default(),
        Expr::Function(f) => last_ident(&f.name).map(fold).unwrap_or_default(),
        Expr::Cast { expr, .. } => output_name(expr),
        Expr::Nested(x) => output_name(x),
        _ => "?column?".to_string(),
    }
}
