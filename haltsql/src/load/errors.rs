//! Located errors: every problem the loader finds carries the file, the
//! position and the key path of the offending node.

use std::fmt;

use serde::Serialize;

/// One problem found while loading a document.
///
/// `line` and `column` are 1-based (column counted in characters). `path` is
/// the key path of the offending node, keys joined with `.` and sequence
/// indices written as `[N]` (for example `server.auth.tokens[0].sha256`); it
/// is empty for problems with the file as a whole.
///
/// [`Display`](fmt::Display) renders the text form of the contract:
/// `FILE:LINE:COLUMN: KEY.PATH: message` (the `KEY.PATH: ` part is left out
/// when the path is empty). Control characters in any part are escaped so one
/// error is always exactly one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LocatedError {
    /// The file as it was named (on the command line, or joined to the folder
    /// of the document that referenced it).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Key path, for example `tables.app.orders.colums`.
    pub path: String,
    /// What is wrong. Never contains a value read from a placeholder.
    pub message: String,
}

impl LocatedError {
    /// A new error.
    pub fn new(
        file: impl Into<String>,
        line: usize,
        column: usize,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        LocatedError {
            file: file.into(),
            line,
            column,
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Escapes control characters so that a value stays on one line.
pub fn one_line_pub(s: &str) -> String {
    one_line(s)
}

/// Escapes control characters so that a value stays on one line.
pub(crate) fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: ",
            one_line(&self.file),
            self.line,
            self.column
        )?;
        if !self.path.is_empty() {
            write!(f, "{}: ", one_line(&self.path))?;
        }
        write!(f, "{}", one_line(&self.message))
    }
}

impl std::error::Error for LocatedError {}

/// Why a file could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file does not exist.
    #[error("file not found")]
    NotFound,
    /// Permission denied and other I/O errors.
    #[error("cannot read file: {0}")]
    Io(#[source] std::io::Error),
    /// A directory, FIFO, device or socket.
    #[error("not a regular file")]
    NotRegular,
    /// A symbolic link where none may be followed (sealed mode).
    #[error("is a symbolic link, which sealed mode does not follow")]
    SymbolicLink,
    /// Over the size cap.
    #[error("file is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The cap in bytes.
        limit: u64,
    },
}

impl ReadError {
    /// Whether the file could not be reached at all (missing, permissions,
    /// not a file) as opposed to read and found unacceptable (too large).
    pub fn is_unreadable(&self) -> bool {
        !matches!(self, ReadError::TooLarge { .. })
    }
}
