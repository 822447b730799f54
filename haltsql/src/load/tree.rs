//! The located document tree both readers build (YAML and JSON), and the
//! hostile-input limits that bound it.

/// Hostile-input limits applied while building the tree.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Deepest allowed nesting of sequences and mappings.
    pub max_depth: usize,
    /// Most nodes in one document, aliases counted with their expansion and
    /// anchored nodes counted twice.
    pub max_nodes: usize,
    /// Most bytes of scalar text in one document, counted like `max_nodes`.
    pub max_scalar_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 64,
            max_nodes: 250_000,
            max_scalar_bytes: 16 * 1024 * 1024,
        }
    }
}

/// One YAML parse problem, 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct YamlError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// A node with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// 1-based line of the node's first character (its anchor or tag, if any).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The content.
    pub value: Value,
}

/// The content of a [`Node`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A scalar.
    Scalar(Scalar),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in document order, duplicate keys already removed.
    Map(Vec<(Node, Node)>),
}

/// A scalar as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// The text after YAML unescaping and folding.
    pub text: String,
    /// Plain (unquoted, untagged): resolved with the core schema.
    pub plain: bool,
}

/// The core-schema type of a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScalarKind {
    /// `null`, `~` or empty.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer that fits in i64.
    Int(i64),
    /// An integer too large for i64.
    BigInt,
    /// A float.
    Float,
    /// Anything else, and every quoted or `!!str` scalar.
    Str,
}

impl Scalar {
    /// Resolves the scalar with the YAML 1.2 core schema.
    pub fn kind(&self) -> ScalarKind {
        if !self.plain {
            return ScalarKind::Str;
        }
        let t = self.text.as_str();
        match t {
            "" | "~" | "null" | "Null" | "NULL" => return ScalarKind::Null,
            "true" | "True" | "TRUE" => return ScalarKind::Bool(true),
            "false" | "False" | "FALSE" => return ScalarKind::Bool(false),
            ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" | "-.inf" | "-.Inf"
            | "-.INF" | ".nan" | ".NaN" | ".NAN" => return ScalarKind::Float,
            _ => {}
        }
        if let Some(hex) = t.strip_prefix("0x") {
            return int_kind(hex, 16);
        }
        if let Some(oct) = t.strip_prefix("0o") {
            return int_kind(oct, 8);
        }
        let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return match t.parse::<i64>() {
                Ok(v) => ScalarKind::Int(v),
                Err(_) => ScalarKind::BigInt,
            };
        }
        if is_float(digits) {
            return ScalarKind::Float;
        }
        ScalarKind::Str
    }
}

fn int_kind(digits: &str, radix: u32) -> ScalarKind {
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return ScalarKind::Str;
    }
    match i64::from_str_radix(digits, radix) {
        Ok(v) => ScalarKind::Int(v),
        Err(_) => ScalarKind::BigInt,
    }
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?` without the sign.
fn is_float(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => {
            (!int.is_empty() || !frac.is_empty())
                && int.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|b| b.is_ascii_digit()),
    };
    let exponent_ok = match exponent {
        None => true,
        Some(e) => {
            let e = e.strip_prefix(['-', '+']).unwrap_or(e);
            !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
        }
    };
    mantissa_ok && exponent_ok
}

impl Node {
    /// The scalar, if this is one.
    pub fn as_scalar(&self) -> Option<&Scalar> {
        match &self.value {
            Value::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// A short description of the node's type for error messages.
    pub fn type_name(&self) -> &'static str {
        match &self.value {
            Value::Seq(_) => "a sequence",
            Value::Map(_) => "a mapping",
            Value::Scalar(s) => match s.kind() {
                ScalarKind::Null => "null",
                ScalarKind::Bool(_) => "a boolean",
                ScalarKind::Int(_) | ScalarKind::BigInt => "an integer",
                ScalarKind::Float => "a float",
                ScalarKind::Str => "a string",
            },
        }
    }

    /// Node count, scalar bytes and height of the subtree.
    pub(super) fn measure(&self) -> (usize, usize, usize) {
        match &self.value {
            Value::Scalar(s) => (1, s.text.len(), 0),
            Value::Seq(items) => items.iter().fold((1, 0, 1), |(n, b, h), item| {
                let (n2, b2, h2) = item.measure();
                (n + n2, b + b2, h.max(h2 + 1))
            }),
            Value::Map(entries) => entries.iter().fold((1, 0, 1), |(n, b, h), (k, v)| {
                let (n2, b2, h2) = k.measure();
                let (n3, b3, h3) = v.measure();
                (n + n2 + n3, b + b2 + b3, h.max(h2 + 1).max(h3 + 1))
            }),
        }
    }
}
