//! `logging`: level and format.

use crate::load::tree::Node;
use crate::load::walk::Doc;

/// `logging.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// error
    Error,
    /// warn
    Warn,
    /// info (the default)
    Info,
    /// debug
    Debug,
    /// trace
    Trace,
}

impl LogLevel {
    /// The name as written in configs (and as tracing filters take it).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// `logging.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// JSON lines (the default).
    Json,
    /// Human-readable text.
    Text,
}

/// `logging`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingConfig {
    /// Level, default info.
    pub level: LogLevel,
    /// Format, default json.
    pub format: LogFormat,
}

/// `logging`.
pub(super) fn parse_logging(doc: &mut Doc<'_>, node: &Node) -> Option<LoggingConfig> {
    let m = doc.map(node, "logging", &["level", "format"])?;
    let level = match m.get("level") {
        None => Some(LogLevel::Info),
        Some(n) => doc
            .choice(
                n,
                "logging.level",
                &["error", "warn", "info", "debug", "trace"],
            )
            .map(|v| match v.as_str() {
                "error" => LogLevel::Error,
                "warn" => LogLevel::Warn,
                "debug" => LogLevel::Debug,
                "trace" => LogLevel::Trace,
                _ => LogLevel::Info,
            }),
    };
    let format = match m.get("format") {
        None => Some(LogFormat::Json),
        Some(n) => doc.choice(n, "logging.format", &["json", "text"]).map(|v| {
            if v == "text" {
                LogFormat::Text
            } else {
                LogFormat::Json
            }
        }),
    };
    Some(LoggingConfig {
        level: level?,
        format: format?,
    })
}
