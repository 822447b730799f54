//! Conversion from the loader's resolved policy to the engine's input.

use crate::load::{self, LoadedPolicy};

use super::{Dialect, Rules, StatementKind};

impl From<load::Dialect> for Dialect {
    fn from(d: load::Dialect) -> Self {
        match d {
            load::Dialect::Postgres => Dialect::Postgres,
            load::Dialect::Mysql => Dialect::Mysql,
            load::Dialect::Sqlite => Dialect::Sqlite,
            load::Dialect::Generic => Dialect::Generic,
        }
    }
}

impl From<load::StatementKind> for StatementKind {
    fn from(k: load::StatementKind) -> Self {
        match k {
            load::StatementKind::Select => StatementKind::Select,
            load::StatementKind::Insert => StatementKind::Insert,
            load::StatementKind::Update => StatementKind::Update,
            load::StatementKind::Delete => StatementKind::Delete,
        }
    }
}

impl From<&LoadedPolicy> for Rules {
    fn from(p: &LoadedPolicy) -> Self {
        Rules {
            name: p.name.clone(),
            dialect: p.dialect.into(),
            search_path: p.search_path.clone(),
            allowed_statements: p.statements.iter().map(|k| (*k).into()).collect(),
            require_limit_max: p.require_limit,
            tables: p
                .tables
                .iter()
                .map(|(name, rule)| (name.to_string(), rule.columns.clone()))
                .collect(),
            extra_functions: p.functions.clone(),
            catalog: p
                .catalog
                .iter()
                .flat_map(|c| c.schemas.iter())
                .flat_map(|(schema, s)| {
                    s.tables.iter().map(move |(table, t)| {
                        (
                            format!("{schema}.{table}"),
                            t.columns.iter().map(|c| c.name.clone()).collect(),
                        )
                    })
                })
                .collect(),
        }
    }
}
