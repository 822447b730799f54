//! Typed reading of a located YAML tree, collecting located errors.
//!
//! Every reader returns `None` after recording an error, so a document is
//! read to its end and every problem is reported.

use super::errors::LocatedError;
use super::placeholders::{self, Resolver};
use super::tree::{Node, ScalarKind, Value};

/// How string values that are placeholders are treated.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Placeholders<'r> {
    /// Resolve them (Config documents).
    Resolve(&'r Resolver),
    /// Report them as errors (Policy and catalog documents).
    Forbid,
    /// Report them as errors without reading anything (Config documents
    /// under `validate --sealed`).
    Sealed,
}

/// Why a placeholder is refused in sealed mode (no file, no variable read).
pub(crate) const SEALED_PLACEHOLDER: &str = "placeholders are not resolved in sealed mode (validate --sealed reads no file and no environment variable)";

/// The document being read: its name for errors and the errors so far.
pub(crate) struct Doc<'r> {
    pub file: String,
    pub errors: Vec<LocatedError>,
    pub placeholders: Placeholders<'r>,
}

/// A string value with where it came from.
#[derive(Debug, Clone)]
pub(crate) struct Str {
    pub value: String,
    pub line: usize,
    pub column: usize,
    pub path: String,
    /// The value came from a placeholder: never show it.
    pub secret: bool,
}

impl Str {
    /// The value quoted for a message, or a stand-in when it is secret.
    pub fn shown(&self) -> String {
        if self.secret {
            "(the placeholder's value)".to_string()
        } else {
            quote(&self.value)
        }
    }
}

/// Quotes a document value for a message, shortened to 80 characters.
pub(crate) fn quote(s: &str) -> String {
    let mut short: String = s.chars().take(80).collect();
    if short.len() < s.len() {
        short.push_str("...");
    }
    format!("{short:?}")
}

/// `path.key` (or `key` at the root).
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `path[i]`.
pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn is_null(node: &Node) -> bool {
    matches!(&node.value, Value::Scalar(s) if s.kind() == ScalarKind::Null)
}

/// A mapping whose keys were checked against the allowed set.
#[derive(Clone, Copy)]
pub(crate) struct Map<'n> {
    pub node: &'n Node,
    pub entries: &'n [(Node, Node)],
    pub path: &'n str,
}

impl<'n> Map<'n> {
    /// The value of `key`; `None` when absent or null (null means "not set").
    pub fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == key))
            .map(|(_, v)| v)
            .filter(|v| !is_null(v))
    }

    /// Whether `key` is present with a non-null value.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The value of a required key; records an error when absent or null.
    pub fn req(&self, doc: &mut Doc<'_>, key: &str) -> Option<&'n Node> {
        let found = self
            .entries
            .iter()
            .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == key));
        match found {
            None => {
                doc.error(self.node, &join(self.path, key), "required key is missing");
                None
            }
            Some((_, v)) if is_null(v) => {
                doc.error(v, &join(self.path, key), "required, found null");
                None
            }
            Some((_, v)) => Some(v),
        }
    }

    /// Key text and value of every entry.
    pub fn iter(&self) -> impl Iterator<Item = (&'n str, &'n Node, &'n Node)> + 'n {
        self.entries
            .iter()
            .filter_map(|(k, v)| k.as_scalar().map(|s| (s.text.as_str(), k, v)))
    }
}

impl<'r> Doc<'r> {
    pub fn new(file: impl Into<String>, placeholders: Placeholders<'r>) -> Self {
        Doc {
            file: file.into(),
            errors: Vec::new(),
            placeholders,
        }
    }

    /// Records an error at a node.
    pub fn error(&mut self, node: &Node, path: &str, message: impl Into<String>) {
        self.error_at(node.line, node.column, path, message);
    }

    /// Records an error at a position.
    pub fn error_at(&mut self, line: usize, column: usize, path: &str, message: impl Into<String>) {
        self.errors.push(LocatedError::new(
            self.file.clone(),
            line,
            column,
            path,
            message,
        ));
    }

    /// Records an error at a string value.
    pub fn error_str(&mut self, s: &Str, message: impl Into<String>) {
        self.error_at(s.line, s.column, &s.path.clone(), message);
    }

    /// A mapping; every key must be in `allowed` (others are reported as
    /// unknown, at the key).
    pub fn map<'n>(&mut self, node: &'n Node, path: &'n str, allowed: &[&str]) -> Option<Map<'n>> {
        let Value::Map(entries) = &node.value else {
            self.error(
                node,
                path,
                format!("expected a mapping, found {}", node.type_name()),
            );
            return None;
        };
        for (k, _) in entries {
            match k.as_scalar() {
                Some(s) if allowed.contains(&s.text.as_str()) => {}
                Some(s) => {
                    let msg = if allowed.is_empty() {
                        "unknown key, this mapping takes no keys".to_string()
                    } else {
                        format!("unknown key, expected one of: {}", allowed.join(", "))
                    };
                    self.error(k, &join(path, &s.text), msg);
                }
                None => {} // reported by the YAML layer
            }
        }
        Some(Map {
            node,
            entries,
            path,
        })
    }

    /// A mapping with arbitrary keys (names chosen by the user).
    pub fn open_map<'n>(&mut self, node: &'n Node, path: &'n str) -> Option<Map<'n>> {
        let Value::Map(entries) = &node.value else {
            self.error(
                node,
                path,
                format!("expected a mapping, found {}", node.type_name()),
            );
            return None;
        };
        Some(Map {
            node,
            entries,
            path,
        })
    }

    /// A sequence.
    pub fn seq<'n>(&mut self, node: &'n Node, path: &str) -> Option<&'n [Node]> {
        match &node.value {
            Value::Seq(items) => Some(items),
            _ => {
                self.error(
                    node,
                    path,
                    format!("expected a sequence, found {}", node.type_name()),
                );
                None
            }
        }
    }

    /// A string. In Config documents a placeholder is resolved here; in other
    /// documents it is an error.
    pub fn string(&mut self, node: &Node, path: &str) -> Option<Str> {
        let Value::Scalar(s) = &node.value else {
            self.error(
                node,
                path,
                format!("expected a string, found {}", node.type_name()),
            );
            return None;
        };
        let kind = s.kind();
        if kind != ScalarKind::Str {
            let hint = match kind {
                ScalarKind::Null => "",
                _ => " (quote it to use it as text)",
            };
            self.error(
                node,
                path,
                format!("expected a string, found {}{hint}", node.type_name()),
            );
            return None;
        }
        let mut out = Str {
            value: s.text.clone(),
            line: node.line,
            column: node.column,
            path: path.to_string(),
            secret: false,
        };
        match placeholders::parse(&s.text) {
            None => {}
            Some(Err(msg)) => {
                self.error(node, path, msg);
                return None;
            }
            Some(Ok(p)) => match self.placeholders {
                Placeholders::Forbid => {
                    self.error(
                        node,
                        path,
                        "placeholders are only resolved in Config documents",
                    );
                    return None;
                }
                Placeholders::Sealed => {
                    self.error(node, path, SEALED_PLACEHOLDER);
                    return None;
                }
                Placeholders::Resolve(r) => match r.resolve(&p) {
                    Ok(v) => {
                        out.value = v;
                        out.secret = true;
                    }
                    Err(msg) => {
                        self.error(node, path, msg);
                        return None;
                    }
                },
            },
        }
        Some(out)
    }

    /// A non-empty string.
    pub fn nonempty(&mut self, node: &Node, path: &str) -> Option<Str> {
        let s = self.string(node, path)?;
        if s.value.is_empty() {
            self.error_str(&s, "must not be empty");
            return None;
        }
        Some(s)
    }

    /// A string from a fixed set of values.
    pub fn choice(&mut self, node: &Node, path: &str, allowed: &[&str]) -> Option<String> {
        let s = self.string(node, path)?;
        if allowed.contains(&s.value.as_str()) {
            Some(s.value)
        } else {
            self.error_str(
                &s,
                format!(
                    "unknown value {}, expected one of: {}",
                    s.shown(),
                    allowed.join(", ")
                ),
            );
            None
        }
    }

    /// A boolean (`true` / `false`).
    pub fn bool(&mut self, node: &Node, path: &str) -> Option<bool> {
        if let Value::Scalar(s) = &node.value
            && let ScalarKind::Bool(b) = s.kind()
        {
            return Some(b);
        }
        self.error(
            node,
            path,
            format!("expected true or false, found {}", node.type_name()),
        );
        None
    }

    /// An integer in `min..=max`.
    pub fn int(&mut self, node: &Node, path: &str, min: i64, max: i64) -> Option<i64> {
        let kind = node.as_scalar().map(|s| s.kind());
        match kind {
            Some(ScalarKind::Int(v)) if (min..=max).contains(&v) => Some(v),
            Some(ScalarKind::Int(_)) | Some(ScalarKind::BigInt) => {
                self.error(node, path, format!("out of range, expected {min} to {max}"));
                None
            }
            _ => {
                self.error(
                    node,
                    path,
                    format!("expected an integer, found {}", node.type_name()),
                );
                None
            }
        }
    }

    /// A sequence of strings.
    pub fn strings(&mut self, node: &Node, path: &str) -> Option<Vec<Str>> {
        let items = self.seq(node, path)?;
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match self.string(item, &index(path, i)) {
                Some(s) => out.push(s),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}
