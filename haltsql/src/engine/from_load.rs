//! Conversion from the loader's resolved policy to the engine's input.

use crate::load::{self, LoadedPolicy};

use super::{Dialect, Rules};

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

impl From<&LoadedPolicy> for Rules {
    fn from(p: &LoadedPolicy) -> Self {
        Rules {
            name: p.name.clone(),
            dialect: p.dialect.into(),
            search_path: p.search_path.clone(),
            allowed_statements: p.statements.clone(),
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
