//! A located YAML tree.
//!
//! The document is parsed with `saphyr-parser`'s event API into our own small
//! tree in which every node knows its line and column. Building the tree
//! enforces the hostile-input limits of [`Limits`]: nesting depth, node count
//! and scalar bytes, where aliases count with the full size of what they
//! expand to (so an alias bomb fails after a bounded amount of work and
//! memory, before anything is expanded past the budget).
//!
//! Plain scalars are resolved with the YAML 1.2 core schema (`null`, `~`,
//! `true`, `false`, integers, floats); quoted and block scalars are strings.
//! Only the `!!str` tag (and the non-specific `!`) is understood on scalars,
//! and `!!map` / `!!seq` on collections; any other tag is an error. Merge keys
//! (`<<`) are not supported (they end up as an unknown key).

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

use super::tree::{Limits, Node, Scalar, Value, YamlError};

enum Frame {
    Seq {
        line: usize,
        column: usize,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        line: usize,
        column: usize,
        anchor: usize,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
        seen: HashSet<String>,
        skip_value: bool,
    },
}

struct Builder {
    limits: Limits,
    nodes: usize,
    bytes: usize,
    stack: Vec<Frame>,
    anchors: HashMap<usize, (Node, usize, usize, usize)>,
    root: Option<Node>,
    errors: Vec<YamlError>,
}

fn err(line: usize, column: usize, message: impl Into<String>) -> YamlError {
    YamlError {
        line,
        column,
        message: message.into(),
    }
}

fn pos(span: &Span) -> (usize, usize) {
    (span.start.line().max(1), span.start.col() + 1)
}

fn tag_is(tag: &Option<Cow<'_, Tag>>, suffix: &str) -> bool {
    match tag {
        None => false,
        Some(t) => t.is_yaml_core_schema() && t.suffix == suffix,
    }
}

fn tag_text(tag: &Tag) -> String {
    if tag.is_yaml_core_schema() {
        format!("!!{}", tag.suffix)
    } else {
        tag.to_string()
    }
}

impl Builder {
    fn charge(
        &mut self,
        nodes: usize,
        bytes: usize,
        line: usize,
        column: usize,
    ) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(nodes);
        self.bytes = self.bytes.saturating_add(bytes);
        if self.nodes > self.limits.max_nodes {
            return Err(err(
                line,
                column,
                format!(
                    "document too large: more than {} nodes (aliases count with their expansion)",
                    self.limits.max_nodes
                ),
            ));
        }
        if self.bytes > self.limits.max_scalar_bytes {
            return Err(err(
                line,
                column,
                format!(
                    "document too large: more than {} bytes of text (aliases count with their expansion)",
                    self.limits.max_scalar_bytes
                ),
            ));
        }
        Ok(())
    }

    fn open(&mut self, line: usize, column: usize) -> Result<(), YamlError> {
        if self.stack.len() >= self.limits.max_depth {
            return Err(err(
                line,
                column,
                format!("nesting deeper than {} levels", self.limits.max_depth),
            ));
        }
        self.charge(1, 0, line, column)
    }

    fn register(&mut self, anchor: usize, node: &Node) -> Result<(), YamlError> {
        if anchor == 0 {
            return Ok(());
        }
        let (n, b, h) = node.measure();
        // The stored copy costs as much as the node itself.
        self.charge(n, b, node.line, node.column)?;
        self.anchors.insert(anchor, (node.clone(), n, b, h));
        Ok(())
    }

    /// Hands a finished node to its parent (or makes it the root).
    fn complete(&mut self, node: Node) -> Result<(), YamlError> {
        match self.stack.last_mut() {
            None => {
                if self.root.is_some() {
                    return Err(err(node.line, node.column, "more than one root node"));
                }
                self.root = Some(node);
            }
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map {
                entries,
                key,
                seen,
                skip_value,
                ..
            }) => match key.take() {
                None => {
                    let text = match &node.value {
                        Value::Scalar(s) => s.text.clone(),
                        _ => {
                            self.errors.push(err(
                                node.line,
                                node.column,
                                format!("mapping keys must be scalars, found {}", node.type_name()),
                            ));
                            *skip_value = true;
                            *key = Some(node);
                            return Ok(());
                        }
                    };
                    if !seen.insert(text) {
                        self.errors
                            .push(err(node.line, node.column, "duplicate key"));
                        *skip_value = true;
                    } else {
                        *skip_value = false;
                    }
                    *key = Some(node);
                }
                Some(k) => {
                    if !*skip_value {
                        entries.push((k, node));
                    }
                    *skip_value = false;
                }
            },
        }
        Ok(())
    }

    fn event(&mut self, ev: Event<'_>, span: Span) -> Result<(), YamlError> {
        let (line, column) = pos(&span);
        match ev {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                if self.root.is_some() {
                    return Err(err(
                        line,
                        column,
                        "more than one YAML document in this file (one document per file)",
                    ));
                }
            }
            Event::Alias(id) => self.alias(id, line, column)?,
            Event::Scalar(text, style, anchor, tag) => {
                self.scalar(text, style, anchor, tag, line, column)?;
            }
            Event::SequenceStart(anchor, tag) => {
                if let Some(t) = &tag
                    && !tag_is(&tag, "seq")
                {
                    self.errors.push(err(
                        line,
                        column,
                        format!("unsupported tag {} on a sequence", tag_text(t)),
                    ));
                }
                self.open(line, column)?;
                self.stack.push(Frame::Seq {
                    line,
                    column,
                    anchor,
                    items: Vec::new(),
                });
            }
            Event::MappingStart(anchor, tag) => {
                if let Some(t) = &tag
                    && !tag_is(&tag, "map")
                {
                    self.errors.push(err(
                        line,
                        column,
                        format!("unsupported tag {} on a mapping", tag_text(t)),
                    ));
                }
                self.open(line, column)?;
                self.stack.push(Frame::Map {
                    line,
                    column,
                    anchor,
                    entries: Vec::new(),
                    key: None,
                    seen: HashSet::new(),
                    skip_value: false,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(line, column)?,
        }
        Ok(())
    }

    /// `*id`: a copy of the anchored node, charged with its full size.
    fn alias(&mut self, id: usize, line: usize, column: usize) -> Result<(), YamlError> {
        let Some((_, n, b, h)) = self.anchors.get(&id) else {
            return Err(err(
                line,
                column,
                "alias refers to an anchor whose node is not complete (recursive alias)",
            ));
        };
        let (n, b, h) = (*n, *b, *h);
        if self.stack.len() + h > self.limits.max_depth {
            return Err(err(
                line,
                column,
                format!(
                    "nesting deeper than {} levels (through an alias)",
                    self.limits.max_depth
                ),
            ));
        }
        self.charge(n, b, line, column)?;
        let Some(mut copy) = self.anchors.get(&id).map(|a| a.0.clone()) else {
            return Err(err(line, column, "alias refers to an unknown anchor"));
        };
        copy.line = line;
        copy.column = column;
        self.complete(copy)?;
        Ok(())
    }

    /// A scalar; only `!!str` (or `!`) is understood as a tag.
    fn scalar(
        &mut self,
        text: Cow<'_, str>,
        style: ScalarStyle,
        anchor: usize,
        tag: Option<Cow<'_, Tag>>,
        line: usize,
        column: usize,
    ) -> Result<(), YamlError> {
        let mut plain = matches!(style, ScalarStyle::Plain);
        if let Some(t) = &tag {
            let non_specific = t.handle == "!" && t.suffix.is_empty();
            if tag_is(&tag, "str") || non_specific {
                plain = false;
            } else {
                self.errors.push(err(
                    line,
                    column,
                    format!("unsupported tag {} (only !!str is understood)", tag_text(t)),
                ));
            }
        }
        self.charge(1, text.len(), line, column)?;
        let node = Node {
            line,
            column,
            value: Value::Scalar(Scalar {
                text: text.into_owned(),
                plain,
            }),
        };
        self.register(anchor, &node)?;
        self.complete(node)?;
        Ok(())
    }

    /// The end of the innermost sequence or mapping.
    fn close(&mut self, line: usize, column: usize) -> Result<(), YamlError> {
        let (node, anchor) = match self.stack.pop() {
            Some(Frame::Seq {
                line,
                column,
                anchor,
                items,
            }) => (
                Node {
                    line,
                    column,
                    value: Value::Seq(items),
                },
                anchor,
            ),
            Some(Frame::Map {
                line,
                column,
                anchor,
                entries,
                ..
            }) => (
                Node {
                    line,
                    column,
                    value: Value::Map(entries),
                },
                anchor,
            ),
            None => return Err(err(line, column, "unbalanced collection end")),
        };
        self.register(anchor, &node)?;
        self.complete(node)?;
        Ok(())
    }
}

/// Longest stretch the YAML scanner may read ahead of the last event, in
/// characters. The scanner buffers a whole flow collection (`[...]`,
/// `{...}`) before it emits its first event; this caps that buffer.
pub const MAX_LOOKAHEAD: usize = 256 * 1024;

/// Feeds the scanner characters, never more than [`MAX_LOOKAHEAD`] past the
/// last event; notes when it had to stop early.
struct Windowed<'a> {
    chars: std::str::Chars<'a>,
    state: Rc<WindowState>,
}

#[derive(Default)]
struct WindowState {
    read: Cell<usize>,
    limit: Cell<usize>,
    cut: Cell<bool>,
}

impl Iterator for Windowed<'_> {
    type Item = char;

    fn next(&mut self) -> Option<char> {
        if self.state.read.get() >= self.state.limit.get() {
            self.state.cut.set(true);
            return None;
        }
        let c = self.chars.next()?;
        self.state.read.set(self.state.read.get() + 1);
        Some(c)
    }
}

/// 1-based line and column of a character index.
fn char_pos(text: &str, index: usize) -> (usize, usize) {
    let mut line = 1;
    let mut column = 1;
    for c in text.chars().take(index) {
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    (line, column)
}

/// Parses one YAML (or JSON) document into a located tree.
///
/// Returns the root (if the document was read to its end) and every problem
/// found. A syntax error or an exceeded limit stops the parse (the root is
/// then `None`); duplicate keys and unsupported tags are reported and parsing
/// goes on. An empty file has no root and one error.
///
/// A document that starts with `{` or `[` is read as JSON first (see
/// [`super::json`]); when that fails it is read as YAML.
pub fn parse(text: &str, limits: Limits) -> (Option<Node>, Vec<YamlError>) {
    let trimmed = text.trim_start_matches([' ', '\t', '\r', '\n']);
    if trimmed.starts_with(['{', '[']) {
        let (root, errors) = super::json::parse(text, limits);
        // Valid JSON, or JSON over a limit (the limits are the same for YAML).
        let over_limit = errors
            .last()
            .is_some_and(|e| !e.message.starts_with("JSON syntax error"));
        if root.is_some() || over_limit {
            return (root, errors);
        }
        let (root, yaml_errors) = parse_yaml(text, limits);
        if root.is_some() || !trimmed.starts_with("{\"") {
            return (root, yaml_errors);
        }
        return (None, errors);
    }
    parse_yaml(text, limits)
}

fn parse_yaml(text: &str, limits: Limits) -> (Option<Node>, Vec<YamlError>) {
    let mut builder = Builder {
        limits,
        nodes: 0,
        bytes: 0,
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        errors: Vec::new(),
    };
    let state = Rc::new(WindowState::default());
    state.limit.set(MAX_LOOKAHEAD);
    let input = Windowed {
        chars: text.chars(),
        state: Rc::clone(&state),
    };
    let mut parser = Parser::new_from_iter(input);
    let cut_error = |state: &WindowState| {
        let (line, column) = char_pos(text, state.read.get());
        err(
            line,
            column,
            format!(
                "a single YAML node spans more than {MAX_LOOKAHEAD} characters (a flow collection [...] or {{...}}, or a scalar); write collections in block style, or the whole document as JSON"
            ),
        )
    };
    loop {
        match parser.next_event() {
            None => break,
            Some(Err(e)) => {
                if state.cut.get() {
                    builder.errors.push(cut_error(&state));
                    return (None, builder.errors);
                }
                let m = e.marker();
                let info = match e.info() {
                    "recursion limit exceeded" => format!("nesting too deep ({})", e.info()),
                    other => other.to_string(),
                };
                builder.errors.push(err(
                    m.line().max(1),
                    m.col() + 1,
                    format!("YAML syntax error: {info}"),
                ));
                return (None, builder.errors);
            }
            Some(Ok((ev, span))) => {
                let end = matches!(ev, Event::StreamEnd);
                state
                    .limit
                    .set(span.end.index().saturating_add(MAX_LOOKAHEAD));
                if let Err(e) = builder.event(ev, span) {
                    builder.errors.push(e);
                    return (None, builder.errors);
                }
                if end {
                    break;
                }
            }
        }
    }
    if state.cut.get() {
        builder.errors.push(cut_error(&state));
        return (None, builder.errors);
    }
    if builder.root.is_none() {
        builder
            .errors
            .push(err(1, 1, "the file holds no YAML document"));
    }
    (builder.root, builder.errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(text: &str) -> Node {
        let (root, errs) = parse(text, Limits::default());
        assert!(errs.is_empty(), "{errs:?}");
        root.unwrap()
    }

    #[test]
    fn positions_of_block_and_flow_nodes() {
        let r = root("a:\n  allow: &f [lower]\nb: {allow: *f}\nc: [1, *f]\n");
        let Value::Map(e) = &r.value else { panic!() };
        assert_eq!((e[1].0.line, e[1].0.column), (3, 1));
        let Value::Map(b) = &e[1].1.value else {
            panic!()
        };
        assert_eq!((b[0].1.line, b[0].1.column), (3, 12));
        let Value::Seq(c) = &e[2].1.value else {
            panic!()
        };
        assert_eq!((c[1].line, c[1].column), (4, 8));
    }
}
