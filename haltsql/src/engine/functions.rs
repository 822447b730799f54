//! The safe defaults: functions and cast target types every policy allows.
//!
//! Criteria for the function list: reads only its arguments, no side
//! effects, no access to files, settings, other sessions or the catalog, no
//! SQL execution, no sleeping, and no way to build huge values from a small
//! input (hence no `repeat`, `lpad`, `rpad`, `generate_series`, and no
//! `replace`, whose output grows with each nested call:
//! `replace(replace(s, 'a', 'aaaa'), 'a', 'aaaa')`).

/// Functions every policy allows (unqualified or `pg_catalog.`-qualified).
pub const DEFAULT_FUNCTIONS: &[&str] = &[
    // aggregates
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
    // GROUPING(...) with ROLLUP / CUBE / GROUPING SETS
    "grouping",
    // window functions
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
    // conditionals
    "coalesce",
    "nullif",
    "greatest",
    "least",
    // strings
    "lower",
    "upper",
    "length",
    "char_length",
    "character_length",
    "octet_length",
    "btrim",
    "ltrim",
    "rtrim",
    "substr",
    "left",
    "right",
    "strpos",
    "split_part",
    "starts_with",
    "concat",
    "concat_ws",
    "initcap",
    "reverse",
    "translate",
    "md5",
    // numbers
    "abs",
    "ceil",
    "ceiling",
    "floor",
    "round",
    "trunc",
    "sign",
    "mod",
    "power",
    "sqrt",
    "cbrt",
    "exp",
    "ln",
    "log",
    "log10",
    "div",
    // dates and times
    "now",
    "current_date",
    "current_time",
    "current_timestamp",
    "localtime",
    "localtimestamp",
    "date_trunc",
    "date_part",
    "date_bin",
    "age",
    "make_date",
    "make_time",
    "make_timestamp",
    "make_timestamptz",
    "make_interval",
    "to_char",
    "to_date",
    "to_timestamp",
    "to_number",
    "justify_days",
    "justify_hours",
    "justify_interval",
    "isfinite",
    // json and arrays built from the arguments
    "json_build_object",
    "jsonb_build_object",
    "json_build_array",
    "jsonb_build_array",
    "jsonb_array_length",
    "json_array_length",
    "array_length",
    "cardinality",
    "array_position",
    "array_to_string",
];

/// Cast target types (lower case, without length/precision and array
/// brackets). Casts to anything else (`regclass`, `regproc`, custom types
/// with their input functions, ...) are denied.
pub const SAFE_TYPES: &[&str] = &[
    "smallint",
    "integer",
    "int",
    "bigint",
    "int2",
    "int4",
    "int8",
    "numeric",
    "decimal",
    "real",
    "double precision",
    "float",
    "float4",
    "float8",
    "text",
    "varchar",
    "character varying",
    "char",
    "character",
    "bpchar",
    "boolean",
    "bool",
    "date",
    "time",
    "timetz",
    "time with time zone",
    "time without time zone",
    "timestamp",
    "timestamptz",
    "timestamp with time zone",
    "timestamp without time zone",
    "interval",
    "uuid",
    "json",
    "jsonb",
];

/// Whether `display` (a data type as sqlparser prints it) is a safe cast target.
pub fn is_safe_type(display: &str) -> bool {
    let mut s = display.trim().to_ascii_lowercase();
    while let Some(stripped) = s.strip_suffix("[]") {
        s = stripped.trim_end().to_string();
    }
    // Remove every parenthesised part: `varchar(10)`, `timestamp(3) with time zone`.
    let mut out = String::with_capacity(s.len());
    let mut depth = 0usize;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    let normalized = out.split_whitespace().collect::<Vec<_>>().join(" ");
    SAFE_TYPES.contains(&normalized.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types() {
        assert!(is_safe_type("INT"));
        assert!(is_safe_type("VARCHAR(10)"));
        assert!(is_safe_type("TIMESTAMP(3) WITH TIME ZONE"));
        assert!(is_safe_type("INT[]"));
        assert!(!is_safe_type("REGCLASS"));
        assert!(!is_safe_type("app.secret_type"));
        assert!(!is_safe_type("\"int\""));
    }
}
