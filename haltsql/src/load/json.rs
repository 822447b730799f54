//! A located JSON reader producing the same tree as the YAML reader.
//!
//! JSON is YAML, but a YAML scanner buffers a whole flow collection (and a
//! JSON document is one) before it emits the first event. Reading JSON with
//! this small reader keeps memory proportional to the tree, under the same
//! [`Limits`].

use std::collections::HashSet;

use super::tree::{Limits, Node, Scalar, Value, YamlError};

struct Reader<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
    column: usize,
    limits: Limits,
    nodes: usize,
    bytes: usize,
    errors: Vec<YamlError>,
}

type R<T> = Result<T, YamlError>;

impl<'a> Reader<'a> {
    fn err(&self, message: impl Into<String>) -> YamlError {
        YamlError {
            line: self.line,
            column: self.column,
            message: format!("JSON syntax error: {}", message.into()),
        }
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if matches!(c, ' ' | '\t' | '\n' | '\r') {
                self.bump();
            } else {
                break;
            }
        }
    }

    fn expect(&mut self, want: char) -> R<()> {
        match self.peek() {
            Some(c) if c == want => {
                self.bump();
                Ok(())
            }
            Some(c) => Err(self.err(format!("expected '{want}', found '{}'", c.escape_default()))),
            None => Err(self.err(format!("expected '{want}', found the end of the file"))),
        }
    }

    fn charge(&mut self, bytes: usize) -> R<()> {
        self.nodes += 1;
        self.bytes += bytes;
        if self.nodes > self.limits.max_nodes {
            return Err(YamlError {
                line: self.line,
                column: self.column,
                message: format!(
                    "document too large: more than {} nodes (aliases count with their expansion)",
                    self.limits.max_nodes
                ),
            });
        }
        if self.bytes > self.limits.max_scalar_bytes {
            return Err(YamlError {
                line: self.line,
                column: self.column,
                message: format!(
                    "document too large: more than {} bytes of text (aliases count with their expansion)",
                    self.limits.max_scalar_bytes
                ),
            });
        }
        Ok(())
    }

    fn value(&mut self, depth: usize) -> R<Node> {
        self.skip_ws();
        let (line, column) = (self.line, self.column);
        let value = match self.peek() {
            Some('{') | Some('[') if depth >= self.limits.max_depth => {
                return Err(YamlError {
                    line,
                    column,
                    message: format!("nesting deeper than {} levels", self.limits.max_depth),
                });
            }
            Some('{') => {
                self.charge(0)?;
                self.bump();
                let mut entries = Vec::new();
                let mut seen = HashSet::new();
                self.skip_ws();
                if self.peek() == Some('}') {
                    self.bump();
                } else {
                    loop {
                        self.skip_ws();
                        if self.peek() != Some('"') {
                            return Err(self.err("expected a string key"));
                        }
                        let key = self.value(depth + 1)?;
                        self.skip_ws();
                        self.expect(':')?;
                        let v = self.value(depth + 1)?;
                        let text = key.as_scalar().map(|s| s.text.clone()).unwrap_or_default();
                        if seen.insert(text) {
                            entries.push((key, v));
                        } else {
                            self.errors.push(YamlError {
                                line: key.line,
                                column: key.column,
                                message: "duplicate key".to_string(),
                            });
                        }
                        self.skip_ws();
                        match self.bump() {
                            Some(',') => continue,
                            Some('}') => break,
                            _ => return Err(self.err("expected ',' or '}'")),
                        }
                    }
                }
                Value::Map(entries)
            }
            Some('[') => {
                self.charge(0)?;
                self.bump();
                let mut items = Vec::new();
                self.skip_ws();
                if self.peek() == Some(']') {
                    self.bump();
                } else {
                    loop {
                        items.push(self.value(depth + 1)?);
                        self.skip_ws();
                        match self.bump() {
                            Some(',') => continue,
                            Some(']') => break,
                            _ => return Err(self.err("expected ',' or ']'")),
                        }
                    }
                }
                Value::Seq(items)
            }
            Some('"') => {
                let s = self.string()?;
                self.charge(s.len())?;
                Value::Scalar(Scalar {
                    text: s,
                    plain: false,
                })
            }
            Some(c) if c == '-' || c.is_ascii_digit() => {
                let start = self.pos;
                while let Some(c) = self.peek() {
                    if c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E') {
                        self.bump();
                    } else {
                        break;
                    }
                }
                let text = &self.text[start..self.pos];
                if serde_json::from_str::<serde_json::Number>(text).is_err() {
                    return Err(YamlError {
                        line,
                        column,
                        message: format!("JSON syntax error: invalid number {text:?}"),
                    });
                }
                self.charge(text.len())?;
                Value::Scalar(Scalar {
                    text: text.to_string(),
                    plain: true,
                })
            }
            Some(_) => {
                let rest = &self.text[self.pos..];
                let word = ["true", "false", "null"]
                    .into_iter()
                    .find(|w| rest.starts_with(w))
                    .ok_or_else(|| self.err("expected a value"))?;
                for _ in 0..word.len() {
                    self.bump();
                }
                self.charge(word.len())?;
                Value::Scalar(Scalar {
                    text: word.to_string(),
                    plain: true,
                })
            }
            None => return Err(self.err("expected a value, found the end of the file")),
        };
        Ok(Node {
            line,
            column,
            value,
        })
    }

    fn hex4(&mut self) -> R<u32> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = self
                .bump()
                .and_then(|c| c.to_digit(16))
                .ok_or_else(|| self.err("invalid \\u escape"))?;
            v = v * 16 + d;
        }
        Ok(v)
    }

    fn string(&mut self) -> R<String> {
        self.expect('"')?;
        let mut out = String::new();
        loop {
            let c = self.bump().ok_or_else(|| self.err("unterminated string"))?;
            match c {
                '"' => return Ok(out),
                '\\' => {
                    let e = self.bump().ok_or_else(|| self.err("unterminated string"))?;
                    match e {
                        '"' => out.push('"'),
                        '\\' => out.push('\\'),
                        '/' => out.push('/'),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'n' => out.push('\n'),
                        'r' => out.push('\r'),
                        't' => out.push('\t'),
                        'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if self.bump() != Some('\\') || self.bump() != Some('u') {
                                    return Err(self.err("unpaired surrogate in \\u escape"));
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.err("unpaired surrogate in \\u escape"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            let ch = char::from_u32(code)
                                .ok_or_else(|| self.err("invalid \\u escape"))?;
                            out.push(ch);
                        }
                        _ => return Err(self.err("invalid escape")),
                    }
                }
                c if (c as u32) < 0x20 => {
                    return Err(self.err("control character in a string"));
                }
                c => out.push(c),
            }
        }
    }
}

/// Parses a JSON document. Same contract as the YAML reader's `parse`.
pub fn parse(text: &str, limits: Limits) -> (Option<Node>, Vec<YamlError>) {
    let mut r = Reader {
        text,
        pos: 0,
        line: 1,
        column: 1,
        limits,
        nodes: 0,
        bytes: 0,
        errors: Vec::new(),
    };
    match r.value(0) {
        Err(e) => {
            r.errors.push(e);
            (None, r.errors)
        }
        Ok(node) => {
            r.skip_ws();
            if r.peek().is_some() {
                let e = r.err("text after the end of the document");
                r.errors.push(e);
                return (None, r.errors);
            }
            (Some(node), r.errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_json_with_positions() {
        let (root, errs) = parse(
            "{\"a\": [1, \"x\\u00e9\", true, null],\n \"b\": {}}",
            Limits::default(),
        );
        assert!(errs.is_empty(), "{errs:?}");
        let root = root.unwrap();
        let Value::Map(entries) = &root.value else {
            panic!()
        };
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[1].0.line, entries[1].0.column), (2, 2));
        let Value::Seq(items) = &entries[0].1.value else {
            panic!()
        };
        assert_eq!(items[1].as_scalar().unwrap().text, "xé");
        assert_eq!(items[0].type_name(), "an integer");
        assert_eq!(items[2].type_name(), "a boolean");
        assert_eq!(items[3].type_name(), "null");
    }

    #[test]
    fn json_errors() {
        let (root, errs) = parse("{\"a\": [1,]}", Limits::default());
        assert!(root.is_none());
        assert_eq!(
            errs[0].to_string(),
            "1:10: JSON syntax error: expected a value"
        );
        let (_, errs) = parse("{\"a\": 1, \"a\": 2}", Limits::default());
        assert_eq!(errs[0].to_string(), "1:10: duplicate key");
        let (_, errs) = parse("{\"a\": 01}", Limits::default());
        assert_eq!(
            errs[0].to_string(),
            "1:7: JSON syntax error: invalid number \"01\""
        );
    }
}
