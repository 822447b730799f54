//! How the engine drives sqlparser: the policy's dialect, unchanged except
//! that an expression prefix which cannot be a typed literal (`DATE '...'`)
//! skips sqlparser's attempt to read one.
//!
//! sqlparser 0.64 starts every expression prefix by trying to parse a data
//! type and, when that fails, formats a located error message that it then
//! throws away: for a plain column name, a number or a string, about 9 % of
//! a whole verify decision. The attempt is skipped only where it must fail
//! with an ordinary error (never the recursion-limit error) and leave the
//! parser where it was, so the AST and every error are the same as with the
//! plain dialect; `tests/engine_parse_equivalence.rs` compares the two.

use std::any::TypeId;
use std::cell::Cell;
use std::iter::Peekable;
use std::str::Chars;

use sqlparser::ast::{
    ColumnOption, DataType, Expr, GranteesType, Ident, ObjectNamePart, Statement,
};
use sqlparser::dialect::{BindPlaceholderStyle, Dialect, Precedence};
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::Token;

/// `D` with the typed-literal attempt skipped where it cannot succeed.
/// Every other method forwards to `D` (generated from the `Dialect` trait
/// of sqlparser 0.64.0; a method left out would silently take the trait's
/// default, which is why the version is pinned).
#[derive(Debug)]
pub struct PrefixDialect<D> {
    inner: D,
    /// Set by `parse_prefix` for the nested default prefix parse it starts.
    reentered: Cell<bool>,
    /// The token index at which the next `parse_data_type` call is the
    /// typed-literal attempt of that prefix parse.
    skip_type_at: Cell<Option<usize>>,
}

impl<D: Dialect> PrefixDialect<D> {
    pub fn new(inner: D) -> Self {
        PrefixDialect {
            inner,
            reentered: Cell::new(false),
            skip_type_at: Cell::new(None),
        }
    }
}

/// Keywords that `Parser::parse_data_type` (0.64.0) treats specially
/// anywhere in its body: every keyword it names. Any other word is read as
/// a custom type name, `DataType::Custom`.
fn names_a_type(kw: Keyword) -> bool {
    matches!(
        kw,
        Keyword::XML
            | Keyword::ANY
            | Keyword::ARRAY
            | Keyword::BIGDECIMAL
            | Keyword::BIGINT
            | Keyword::BIGNUMERIC
            | Keyword::BINARY
            | Keyword::BIT
            | Keyword::BLOB
            | Keyword::BOOL
            | Keyword::BOOLEAN
            | Keyword::BYTEA
            | Keyword::BYTES
            | Keyword::CHAR
            | Keyword::CHARACTER
            | Keyword::CLOB
            | Keyword::DATE
            | Keyword::DATE32
            | Keyword::DATETIME
            | Keyword::DATETIME64
            | Keyword::DEC
            | Keyword::DECIMAL
            | Keyword::DOUBLE
            | Keyword::ENUM
            | Keyword::ENUM16
            | Keyword::ENUM8
            | Keyword::FIXEDSTRING
            | Keyword::FLOAT
            | Keyword::FLOAT32
            | Keyword::FLOAT4
            | Keyword::FLOAT64
            | Keyword::FLOAT8
            | Keyword::HUGEINT
            | Keyword::INT
            | Keyword::INT128
            | Keyword::INT16
            | Keyword::INT2
            | Keyword::INT256
            | Keyword::INT32
            | Keyword::INT4
            | Keyword::INT64
            | Keyword::INT8
            | Keyword::INTEGER
            | Keyword::INTERVAL
            | Keyword::JSON
            | Keyword::JSONB
            | Keyword::LARGE
            | Keyword::LONG
            | Keyword::LONGBLOB
            | Keyword::LONGTEXT
            | Keyword::LOWCARDINALITY
            | Keyword::MAP
            | Keyword::MEDIUMBLOB
            | Keyword::MEDIUMINT
            | Keyword::MEDIUMTEXT
            | Keyword::NESTED
            | Keyword::NOT
            | Keyword::NULL
            | Keyword::NULLABLE
            | Keyword::NUMERIC
            | Keyword::NVARCHAR
            | Keyword::OBJECT
            | Keyword::PRECISION
            | Keyword::REAL
            | Keyword::REGCLASS
            | Keyword::SET
            | Keyword::SIGNED
            | Keyword::SMALLINT
            | Keyword::STRING
            | Keyword::STRUCT
            | Keyword::TABLE
            | Keyword::TEXT
            | Keyword::TIME
            | Keyword::TIMESTAMP
            | Keyword::TIMESTAMPTZ
            | Keyword::TIMESTAMP_NTZ
            | Keyword::TIMETZ
            | Keyword::TINYBLOB
            | Keyword::TINYINT
            | Keyword::TINYTEXT
            | Keyword::TRIGGER
            | Keyword::TSQUERY
            | Keyword::TSVECTOR
            | Keyword::TUPLE
            | Keyword::TYPE
            | Keyword::UBIGINT
            | Keyword::UHUGEINT
            | Keyword::UINT128
            | Keyword::UINT16
            | Keyword::UINT256
            | Keyword::UINT32
            | Keyword::UINT64
            | Keyword::UINT8
            | Keyword::UNION
            | Keyword::UNSIGNED
            | Keyword::USMALLINT
            | Keyword::UTINYINT
            | Keyword::UUID
            | Keyword::VARBINARY
            | Keyword::VARBIT
            | Keyword::VARCHAR
            | Keyword::VARYING
            | Keyword::WITH
            | Keyword::WITHOUT
            | Keyword::ZEROFILL
            | Keyword::ZONE
    )
}

/// Whether sqlparser's typed-literal attempt at the parser's next token must
/// fail with an ordinary error and without consuming anything for good:
/// - any token but a word: `parse_data_type` wants a word and reports
///   "expected a data type name" (the dialects used here have no
///   `parse_data_type` hook for other tokens);
/// - a word that is no type keyword, not followed by `.`, `(`, `[` or a
///   string (what could extend a type name or make it a typed string):
///   it is read as `DataType::Custom` with no modifiers, which the attempt
///   rejects unless a string follows (or the name is `xml`).
fn typed_literal_impossible(parser: &Parser) -> bool {
    let Token::Word(w) = &parser.peek_token_ref().token else {
        return true;
    };
    if names_a_type(w.keyword) || w.value.eq_ignore_ascii_case("xml") {
        return false;
    }
    match &parser.peek_nth_token_ref(1).token {
        Token::Word(next) => !matches!(next.keyword, Keyword::ARRAY | Keyword::ZEROFILL),
        Token::EOF
        | Token::Comma
        | Token::SemiColon
        | Token::RParen
        | Token::RBracket
        | Token::Eq
        | Token::DoubleEq
        | Token::Neq
        | Token::Lt
        | Token::Gt
        | Token::LtEq
        | Token::GtEq
        | Token::Plus
        | Token::Minus
        | Token::Mul
        | Token::Div
        | Token::Mod
        | Token::StringConcat
        | Token::DoubleColon => true,
        _ => false,
    }
}

impl<D: Dialect> Dialect for PrefixDialect<D> {
    fn parse_prefix(&self, parser: &mut Parser) -> Option<Result<Expr, ParserError>> {
        if let Some(r) = self.inner.parse_prefix(parser) {
            return Some(r);
        }
        // The nested call below: let sqlparser's own prefix parse run (its
        // sub-expressions get this hook again).
        if self.reentered.replace(false) {
            return None;
        }
        if !typed_literal_impossible(parser) {
            return None;
        }
        self.reentered.set(true);
        self.skip_type_at.set(Some(parser.index()));
        let r = parser.parse_prefix();
        // Cleared whether or not the attempt ran: sqlparser answers a prefix
        // that already failed at this position from its cache, without it.
        self.reentered.set(false);
        self.skip_type_at.set(None);
        Some(r)
    }

    fn parse_data_type(&self, parser: &mut Parser) -> Option<Result<DataType, ParserError>> {
        // Called after sqlparser's recursion guard, before it reads a token:
        // the error is thrown away by the attempt, so it carries no text.
        if self.skip_type_at.take() == Some(parser.index()) {
            return Some(Err(ParserError::ParserError(String::new())));
        }
        self.inner.parse_data_type(parser)
    }

    fn dialect(&self) -> TypeId {
        self.inner.dialect()
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        self.inner.is_delimited_identifier_start(ch)
    }

    fn is_nested_delimited_identifier_start(&self, ch: char) -> bool {
        self.inner.is_nested_delimited_identifier_start(ch)
    }

    fn peek_nested_delimited_identifier_quotes(
        &self,
        chars: Peekable<Chars<'_>>,
    ) -> Option<(char, Option<char>)> {
        self.inner.peek_nested_delimited_identifier_quotes(chars)
    }

    fn identifier_quote_style(&self, identifier: &str) -> Option<char> {
        self.inner.identifier_quote_style(identifier)
    }

    fn ordered_bind_placeholder_style(&self) -> Option<BindPlaceholderStyle> {
        self.inner.ordered_bind_placeholder_style()
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        self.inner.is_identifier_start(ch)
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        self.inner.is_identifier_part(ch)
    }

    fn is_custom_operator_part(&self, ch: char) -> bool {
        self.inner.is_custom_operator_part(ch)
    }

    fn supports_string_literal_backslash_escape(&self) -> bool {
        self.inner.supports_string_literal_backslash_escape()
    }

    fn supports_national_string_literal(&self) -> bool {
        self.inner.supports_national_string_literal()
    }

    fn supports_literal_prefix_in_qualified_name(&self) -> bool {
        self.inner.supports_literal_prefix_in_qualified_name()
    }

    fn ignores_wildcard_escapes(&self) -> bool {
        self.inner.ignores_wildcard_escapes()
    }

    fn supports_unicode_string_literal(&self) -> bool {
        self.inner.supports_unicode_string_literal()
    }

    fn supports_filter_during_aggregation(&self) -> bool {
        self.inner.supports_filter_during_aggregation()
    }

    fn supports_window_clause_named_window_reference(&self) -> bool {
        self.inner.supports_window_clause_named_window_reference()
    }

    fn supports_within_after_array_aggregation(&self) -> bool {
        self.inner.supports_within_after_array_aggregation()
    }

    fn supports_partition_by_after_order_by(&self) -> bool {
        self.inner.supports_partition_by_after_order_by()
    }

    fn supports_array_join_syntax(&self) -> bool {
        self.inner.supports_array_join_syntax()
    }

    fn supports_drop_group(&self) -> bool {
        self.inner.supports_drop_group()
    }

    fn supports_alter_user_as_alter_role(&self) -> bool {
        self.inner.supports_alter_user_as_alter_role()
    }

    fn supports_cte_materialization(&self) -> bool {
        self.inner.supports_cte_materialization()
    }

    fn supports_create_group(&self) -> bool {
        self.inner.supports_create_group()
    }

    fn supports_create_role_if_not_exists(&self) -> bool {
        self.inner.supports_create_role_if_not_exists()
    }

    fn supports_group_by_expr(&self) -> bool {
        self.inner.supports_group_by_expr()
    }

    fn supports_group_by_with_modifier(&self) -> bool {
        self.inner.supports_group_by_with_modifier()
    }

    fn supports_left_associative_joins_without_parens(&self) -> bool {
        self.inner.supports_left_associative_joins_without_parens()
    }

    fn supports_outer_join_operator(&self) -> bool {
        self.inner.supports_outer_join_operator()
    }

    fn supports_cross_join_constraint(&self) -> bool {
        self.inner.supports_cross_join_constraint()
    }

    fn supports_comma_join_constraint(&self) -> bool {
        self.inner.supports_comma_join_constraint()
    }

    fn supports_connect_by(&self) -> bool {
        self.inner.supports_connect_by()
    }

    fn supports_execute_immediate(&self) -> bool {
        self.inner.supports_execute_immediate()
    }

    fn supports_match_recognize(&self) -> bool {
        self.inner.supports_match_recognize()
    }

    fn supports_in_empty_list(&self) -> bool {
        self.inner.supports_in_empty_list()
    }

    fn supports_in_unparenthesized_expr(&self) -> bool {
        self.inner.supports_in_unparenthesized_expr()
    }

    fn supports_global_in(&self) -> bool {
        self.inner.supports_global_in()
    }

    fn supports_in_table_expression(&self) -> bool {
        self.inner.supports_in_table_expression()
    }

    fn supports_start_transaction_modifier(&self) -> bool {
        self.inner.supports_start_transaction_modifier()
    }

    fn supports_end_transaction_modifier(&self) -> bool {
        self.inner.supports_end_transaction_modifier()
    }

    fn supports_named_fn_args_with_eq_operator(&self) -> bool {
        self.inner.supports_named_fn_args_with_eq_operator()
    }

    fn supports_named_fn_args_with_colon_operator(&self) -> bool {
        self.inner.supports_named_fn_args_with_colon_operator()
    }

    fn supports_named_fn_args_with_assignment_operator(&self) -> bool {
        self.inner.supports_named_fn_args_with_assignment_operator()
    }

    fn supports_named_fn_args_with_rarrow_operator(&self) -> bool {
        self.inner.supports_named_fn_args_with_rarrow_operator()
    }

    fn supports_named_fn_args_with_expr_name(&self) -> bool {
        self.inner.supports_named_fn_args_with_expr_name()
    }

    fn supports_numeric_prefix(&self) -> bool {
        self.inner.supports_numeric_prefix()
    }

    fn supports_tuple_element_access(&self) -> bool {
        self.inner.supports_tuple_element_access()
    }

    fn supports_numeric_literal_underscores(&self) -> bool {
        self.inner.supports_numeric_literal_underscores()
    }

    fn supports_non_decimal_integer_literals(&self) -> bool {
        self.inner.supports_non_decimal_integer_literals()
    }

    fn supports_window_function_null_treatment_arg(&self) -> bool {
        self.inner.supports_window_function_null_treatment_arg()
    }

    fn supports_dictionary_syntax(&self) -> bool {
        self.inner.supports_dictionary_syntax()
    }

    fn support_map_literal_syntax(&self) -> bool {
        self.inner.support_map_literal_syntax()
    }

    fn supports_lambda_functions(&self) -> bool {
        self.inner.supports_lambda_functions()
    }

    fn supports_lambda_keyword_syntax(&self) -> bool {
        self.inner.supports_lambda_keyword_syntax()
    }

    fn supports_parenthesized_set_variables(&self) -> bool {
        self.inner.supports_parenthesized_set_variables()
    }

    fn supports_comma_separated_set_assignments(&self) -> bool {
        self.inner.supports_comma_separated_set_assignments()
    }

    fn supports_update_order_by(&self) -> bool {
        self.inner.supports_update_order_by()
    }

    fn supports_select_wildcard_except(&self) -> bool {
        self.inner.supports_select_wildcard_except()
    }

    fn convert_type_before_value(&self) -> bool {
        self.inner.convert_type_before_value()
    }

    fn supports_triple_quoted_string(&self) -> bool {
        self.inner.supports_triple_quoted_string()
    }

    fn supports_approximate_percentile_disc(&self) -> bool {
        self.inner.supports_approximate_percentile_disc()
    }

    fn supports_trailing_commas(&self) -> bool {
        self.inner.supports_trailing_commas()
    }

    fn supports_limit_comma(&self) -> bool {
        self.inner.supports_limit_comma()
    }

    fn supports_string_literal_concatenation(&self) -> bool {
        self.inner.supports_string_literal_concatenation()
    }

    fn supports_string_literal_concatenation_with_newline(&self) -> bool {
        self.inner
            .supports_string_literal_concatenation_with_newline()
    }

    fn supports_projection_trailing_commas(&self) -> bool {
        self.inner.supports_projection_trailing_commas()
    }

    fn supports_from_trailing_commas(&self) -> bool {
        self.inner.supports_from_trailing_commas()
    }

    fn supports_column_definition_trailing_commas(&self) -> bool {
        self.inner.supports_column_definition_trailing_commas()
    }

    fn supports_object_name_double_dot_notation(&self) -> bool {
        self.inner.supports_object_name_double_dot_notation()
    }

    fn supports_struct_literal(&self) -> bool {
        self.inner.supports_struct_literal()
    }

    fn supports_empty_projections(&self) -> bool {
        self.inner.supports_empty_projections()
    }

    fn supports_select_expr_star(&self) -> bool {
        self.inner.supports_select_expr_star()
    }

    fn supports_from_first_select(&self) -> bool {
        self.inner.supports_from_first_select()
    }

    fn supports_from_first_insert(&self) -> bool {
        self.inner.supports_from_first_insert()
    }

    fn supports_pipe_operator(&self) -> bool {
        self.inner.supports_pipe_operator()
    }

    fn supports_user_host_grantee(&self) -> bool {
        self.inner.supports_user_host_grantee()
    }

    fn supports_match_against(&self) -> bool {
        self.inner.supports_match_against()
    }

    fn supports_select_wildcard_exclude(&self) -> bool {
        self.inner.supports_select_wildcard_exclude()
    }

    fn supports_select_exclude(&self) -> bool {
        self.inner.supports_select_exclude()
    }

    fn supports_create_table_multi_schema_info_sources(&self) -> bool {
        self.inner.supports_create_table_multi_schema_info_sources()
    }

    fn supports_select_modifiers(&self) -> bool {
        self.inner.supports_select_modifiers()
    }

    fn parse_infix(
        &self,
        parser: &mut Parser,
        expr: &Expr,
        precedence: u8,
    ) -> Option<Result<Expr, ParserError>> {
        self.inner.parse_infix(parser, expr, precedence)
    }

    fn get_next_precedence(&self, parser: &Parser) -> Option<Result<u8, ParserError>> {
        self.inner.get_next_precedence(parser)
    }

    fn get_next_precedence_default(&self, parser: &Parser) -> Result<u8, ParserError> {
        self.inner.get_next_precedence_default(parser)
    }

    fn parse_statement(&self, parser: &mut Parser) -> Option<Result<Statement, ParserError>> {
        self.inner.parse_statement(parser)
    }

    fn parse_column_option(
        &self,
        parser: &mut Parser,
    ) -> Result<Option<Result<Option<ColumnOption>, ParserError>>, ParserError> {
        self.inner.parse_column_option(parser)
    }

    fn prec_value(&self, prec: Precedence) -> u8 {
        self.inner.prec_value(prec)
    }

    fn prec_unknown(&self) -> u8 {
        self.inner.prec_unknown()
    }

    fn between_low_bound_precedence(&self) -> u8 {
        self.inner.between_low_bound_precedence()
    }

    fn supports_comparison_in_between_low_bound(&self) -> bool {
        self.inner.supports_comparison_in_between_low_bound()
    }

    fn describe_requires_table_keyword(&self) -> bool {
        self.inner.describe_requires_table_keyword()
    }

    fn allow_extract_custom(&self) -> bool {
        self.inner.allow_extract_custom()
    }

    fn allow_extract_single_quotes(&self) -> bool {
        self.inner.allow_extract_single_quotes()
    }

    fn supports_extract_comma_syntax(&self) -> bool {
        self.inner.supports_extract_comma_syntax()
    }

    fn supports_subquery_as_function_arg(&self) -> bool {
        self.inner.supports_subquery_as_function_arg()
    }

    fn supports_create_view_comment_syntax(&self) -> bool {
        self.inner.supports_create_view_comment_syntax()
    }

    fn supports_data_type_collation(&self) -> bool {
        self.inner.supports_data_type_collation()
    }

    fn supports_array_typedef_without_element_type(&self) -> bool {
        self.inner.supports_array_typedef_without_element_type()
    }

    fn supports_array_typedef_with_parentheses(&self) -> bool {
        self.inner.supports_array_typedef_with_parentheses()
    }

    fn supports_array_element_not_null(&self) -> bool {
        self.inner.supports_array_element_not_null()
    }

    fn supports_map_typedef_with_parentheses(&self) -> bool {
        self.inner.supports_map_typedef_with_parentheses()
    }

    fn supports_map_value_not_null(&self) -> bool {
        self.inner.supports_map_value_not_null()
    }

    fn supports_parens_around_table_factor(&self) -> bool {
        self.inner.supports_parens_around_table_factor()
    }

    fn supports_values_as_table_factor(&self) -> bool {
        self.inner.supports_values_as_table_factor()
    }

    fn supports_dollar_placeholder(&self) -> bool {
        self.inner.supports_dollar_placeholder()
    }

    fn supports_dollar_as_money_prefix(&self) -> bool {
        self.inner.supports_dollar_as_money_prefix()
    }

    fn supports_create_index_with_clause(&self) -> bool {
        self.inner.supports_create_index_with_clause()
    }

    fn supports_sql_option_without_value(&self) -> bool {
        self.inner.supports_sql_option_without_value()
    }

    fn require_interval_qualifier(&self) -> bool {
        self.inner.require_interval_qualifier()
    }

    fn is_interval_qualifier(&self, kw: Keyword) -> bool {
        self.inner.is_interval_qualifier(kw)
    }

    fn supports_explain_with_utility_options(&self) -> bool {
        self.inner.supports_explain_with_utility_options()
    }

    fn supports_asc_desc_in_column_definition(&self) -> bool {
        self.inner.supports_asc_desc_in_column_definition()
    }

    fn supports_string_literal_column_names(&self) -> bool {
        self.inner.supports_string_literal_column_names()
    }

    fn supports_factorial_operator(&self) -> bool {
        self.inner.supports_factorial_operator()
    }

    fn supports_bitwise_shift_operators(&self) -> bool {
        self.inner.supports_bitwise_shift_operators()
    }

    fn supports_nested_comments(&self) -> bool {
        self.inner.supports_nested_comments()
    }

    fn supports_hash_comment(&self) -> bool {
        self.inner.supports_hash_comment()
    }

    fn supports_copy_from_stdin_data(&self) -> bool {
        self.inner.supports_copy_from_stdin_data()
    }

    fn requires_hash_comment_space(&self) -> bool {
        self.inner.requires_hash_comment_space()
    }

    fn supports_multiline_comment_hints(&self) -> bool {
        self.inner.supports_multiline_comment_hints()
    }

    fn supports_unterminated_block_comments(&self) -> bool {
        self.inner.supports_unterminated_block_comments()
    }

    fn supports_eq_alias_assignment(&self) -> bool {
        self.inner.supports_eq_alias_assignment()
    }

    fn supports_try_convert(&self) -> bool {
        self.inner.supports_try_convert()
    }

    fn supports_bang_not_operator(&self) -> bool {
        self.inner.supports_bang_not_operator()
    }

    fn supports_listen_notify(&self) -> bool {
        self.inner.supports_listen_notify()
    }

    fn supports_exclude_constraint(&self) -> bool {
        self.inner.supports_exclude_constraint()
    }

    fn supports_load_data(&self) -> bool {
        self.inner.supports_load_data()
    }

    fn supports_load_extension(&self) -> bool {
        self.inner.supports_load_extension()
    }

    fn supports_top_before_distinct(&self) -> bool {
        self.inner.supports_top_before_distinct()
    }

    fn supports_boolean_literals(&self) -> bool {
        self.inner.supports_boolean_literals()
    }

    fn supports_show_like_before_in(&self) -> bool {
        self.inner.supports_show_like_before_in()
    }

    fn supports_comment_on(&self) -> bool {
        self.inner.supports_comment_on()
    }

    fn supports_create_table_select(&self) -> bool {
        self.inner.supports_create_table_select()
    }

    fn supports_create_proc_syntax(&self) -> bool {
        self.inner.supports_create_proc_syntax()
    }

    fn supports_leading_comma_before_table_options(&self) -> bool {
        self.inner.supports_leading_comma_before_table_options()
    }

    fn supports_partiql(&self) -> bool {
        self.inner.supports_partiql()
    }

    fn supports_unpivot_expr(&self) -> bool {
        self.inner.supports_unpivot_expr()
    }

    fn supports_constraint_keyword_without_name(&self) -> bool {
        self.inner.supports_constraint_keyword_without_name()
    }

    fn supports_key_column_option(&self) -> bool {
        self.inner.supports_key_column_option()
    }

    fn supports_attach_partition_of(&self) -> bool {
        self.inner.supports_attach_partition_of()
    }

    fn supports_detach_partition_of(&self) -> bool {
        self.inner.supports_detach_partition_of()
    }

    fn supports_column_generic_options(&self) -> bool {
        self.inner.supports_column_generic_options()
    }

    fn is_reserved_for_identifier(&self, kw: Keyword) -> bool {
        self.inner.is_reserved_for_identifier(kw)
    }

    fn get_reserved_keywords_for_select_item_operator(&self) -> &[Keyword] {
        self.inner.get_reserved_keywords_for_select_item_operator()
    }

    fn get_reserved_grantees_types(&self) -> &[GranteesType] {
        self.inner.get_reserved_grantees_types()
    }

    fn supports_table_sample_before_alias(&self) -> bool {
        self.inner.supports_table_sample_before_alias()
    }

    fn supports_insert_set(&self) -> bool {
        self.inner.supports_insert_set()
    }

    fn supports_insert_table_function(&self) -> bool {
        self.inner.supports_insert_table_function()
    }

    fn supports_insert_table_query(&self) -> bool {
        self.inner.supports_insert_table_query()
    }

    fn supports_insert_format(&self) -> bool {
        self.inner.supports_insert_format()
    }

    fn supports_insert_table_alias(&self) -> bool {
        self.inner.supports_insert_table_alias()
    }

    fn supports_singular_value_keyword(&self) -> bool {
        self.inner.supports_singular_value_keyword()
    }

    fn supports_set_stmt_without_operator(&self) -> bool {
        self.inner.supports_set_stmt_without_operator()
    }

    fn is_column_alias(&self, kw: &Keyword, parser: &mut Parser) -> bool {
        self.inner.is_column_alias(kw, parser)
    }

    fn is_select_item_alias(&self, explicit: bool, kw: &Keyword, parser: &mut Parser) -> bool {
        self.inner.is_select_item_alias(explicit, kw, parser)
    }

    fn supports_over_keyword_as_column_alias(&self) -> bool {
        self.inner.supports_over_keyword_as_column_alias()
    }

    fn is_table_factor(&self, kw: &Keyword, parser: &mut Parser) -> bool {
        self.inner.is_table_factor(kw, parser)
    }

    fn is_table_alias(&self, kw: &Keyword, parser: &mut Parser) -> bool {
        self.inner.is_table_alias(kw, parser)
    }

    fn is_table_factor_alias(&self, explicit: bool, kw: &Keyword, parser: &mut Parser) -> bool {
        self.inner.is_table_factor_alias(explicit, kw, parser)
    }

    fn supports_string_literal_column_alias(&self, explicit: bool) -> bool {
        self.inner.supports_string_literal_column_alias(explicit)
    }

    fn supports_string_literal_table_alias(&self, explicit: bool) -> bool {
        self.inner.supports_string_literal_table_alias(explicit)
    }

    fn supports_table_versioning(&self) -> bool {
        self.inner.supports_table_versioning()
    }

    fn supports_string_escape_constant(&self) -> bool {
        self.inner.supports_string_escape_constant()
    }

    fn supports_table_hints(&self) -> bool {
        self.inner.supports_table_hints()
    }

    fn supports_indexed_by(&self) -> bool {
        self.inner.supports_indexed_by()
    }

    fn requires_single_line_comment_whitespace(&self) -> bool {
        self.inner.requires_single_line_comment_whitespace()
    }

    fn supports_array_typedef_with_brackets(&self) -> bool {
        self.inner.supports_array_typedef_with_brackets()
    }

    fn supports_geometric_types(&self) -> bool {
        self.inner.supports_geometric_types()
    }

    fn supports_tilde_like_match_operator(&self) -> bool {
        self.inner.supports_tilde_like_match_operator()
    }

    fn supports_order_by_all(&self) -> bool {
        self.inner.supports_order_by_all()
    }

    fn supports_order_by_using_operator(&self) -> bool {
        self.inner.supports_order_by_using_operator()
    }

    fn supports_set_names(&self) -> bool {
        self.inner.supports_set_names()
    }

    fn supports_space_separated_column_options(&self) -> bool {
        self.inner.supports_space_separated_column_options()
    }

    fn supports_alter_column_type_using(&self) -> bool {
        self.inner.supports_alter_column_type_using()
    }

    fn supports_comma_separated_drop_column_list(&self) -> bool {
        self.inner.supports_comma_separated_drop_column_list()
    }

    fn supports_alter_column_position(&self) -> bool {
        self.inner.supports_alter_column_position()
    }

    fn supports_add_column_if_not_exists(&self) -> bool {
        self.inner.supports_add_column_if_not_exists()
    }

    fn is_identifier_generating_function_name(
        &self,
        ident: &Ident,
        name_parts: &[ObjectNamePart],
    ) -> bool {
        self.inner
            .is_identifier_generating_function_name(ident, name_parts)
    }

    fn supports_notnull_operator(&self) -> bool {
        self.inner.supports_notnull_operator()
    }

    fn supports_is_operator(&self) -> bool {
        self.inner.supports_is_operator()
    }

    fn supports_data_type_signed_suffix(&self) -> bool {
        self.inner.supports_data_type_signed_suffix()
    }

    fn supports_data_type_zerofill_suffix(&self) -> bool {
        self.inner.supports_data_type_zerofill_suffix()
    }

    fn supports_interval_options(&self) -> bool {
        self.inner.supports_interval_options()
    }

    fn supports_create_table_like_parenthesized(&self) -> bool {
        self.inner.supports_create_table_like_parenthesized()
    }

    fn supports_semantic_view_table_factor(&self) -> bool {
        self.inner.supports_semantic_view_table_factor()
    }

    fn supports_stages(&self) -> bool {
        self.inner.supports_stages()
    }

    fn supports_quote_delimited_string(&self) -> bool {
        self.inner.supports_quote_delimited_string()
    }

    fn supports_comment_optimizer_hint(&self) -> bool {
        self.inner.supports_comment_optimizer_hint()
    }

    fn supports_double_ampersand_operator(&self) -> bool {
        self.inner.supports_double_ampersand_operator()
    }

    fn supports_binary_kw_as_cast(&self) -> bool {
        self.inner.supports_binary_kw_as_cast()
    }

    fn supports_select_wildcard_replace(&self) -> bool {
        self.inner.supports_select_wildcard_replace()
    }

    fn supports_select_wildcard_ilike(&self) -> bool {
        self.inner.supports_select_wildcard_ilike()
    }

    fn supports_select_wildcard_rename(&self) -> bool {
        self.inner.supports_select_wildcard_rename()
    }

    fn supports_select_wildcard_with_alias(&self) -> bool {
        self.inner.supports_select_wildcard_with_alias()
    }

    fn supports_optimize_table(&self) -> bool {
        self.inner.supports_optimize_table()
    }

    fn supports_install(&self) -> bool {
        self.inner.supports_install()
    }

    fn supports_detach(&self) -> bool {
        self.inner.supports_detach()
    }

    fn supports_prewhere(&self) -> bool {
        self.inner.supports_prewhere()
    }

    fn supports_with_fill(&self) -> bool {
        self.inner.supports_with_fill()
    }

    fn supports_limit_by(&self) -> bool {
        self.inner.supports_limit_by()
    }

    fn supports_interpolate(&self) -> bool {
        self.inner.supports_interpolate()
    }

    fn supports_settings(&self) -> bool {
        self.inner.supports_settings()
    }

    fn supports_table_partitions(&self) -> bool {
        self.inner.supports_table_partitions()
    }

    fn supports_table_inheritance_markers(&self) -> bool {
        self.inner.supports_table_inheritance_markers()
    }

    fn supports_select_format(&self) -> bool {
        self.inner.supports_select_format()
    }

    fn supports_comma_separated_trim(&self) -> bool {
        self.inner.supports_comma_separated_trim()
    }

    fn supports_cte_without_as(&self) -> bool {
        self.inner.supports_cte_without_as()
    }

    fn supports_select_item_multi_column_alias(&self) -> bool {
        self.inner.supports_select_item_multi_column_alias()
    }

    fn supports_xml_expressions(&self) -> bool {
        self.inner.supports_xml_expressions()
    }

    fn is_custom_type_typed_string(&self, first_keyword: Keyword, qualified: bool) -> bool {
        self.inner
            .is_custom_type_typed_string(first_keyword, qualified)
    }

    fn supports_aliased_function_args(&self) -> bool {
        self.inner.supports_aliased_function_args()
    }

    fn supports_create_table_using(&self) -> bool {
        self.inner.supports_create_table_using()
    }

    fn supports_long_type_as_bigint(&self) -> bool {
        self.inner.supports_long_type_as_bigint()
    }

    fn supports_map_literal_with_angle_brackets(&self) -> bool {
        self.inner.supports_map_literal_with_angle_brackets()
    }

    fn supports_double_eq_assignment(&self) -> bool {
        self.inner.supports_double_eq_assignment()
    }

    fn supports_cast_empty_data_type_to_unspecified(&self) -> bool {
        self.inner.supports_cast_empty_data_type_to_unspecified()
    }

    fn supports_aggregate_order_by_with_empty_args(&self) -> bool {
        self.inner.supports_aggregate_order_by_with_empty_args()
    }
}
