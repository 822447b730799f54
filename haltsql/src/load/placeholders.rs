//! `${file:/abs/path}` and `${env:NAME}` placeholders.
//!
//! A placeholder is a whole string value: `${file:/var/run/x}` is replaced
//! by the file's content with one trailing newline (`\n` or `\r\n`) removed,
//! `${env:NAME}` by the variable's value. A string that only looks like a
//! placeholder (it starts with `${` and ends with `}`) but is not one of these
//! two forms is an error rather than a literal, so a typo cannot silently turn
//! a secret reference into a password. Resolved values never appear in error
//! messages.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::fs::{read_capped, rooted};

/// Largest file a `${file:...}` placeholder may read (1 MiB).
pub const MAX_PLACEHOLDER_FILE_BYTES: u64 = 1024 * 1024;

/// Where `${env:NAME}` looks variables up.
#[derive(Debug, Clone, Default)]
pub enum EnvSource {
    /// The process environment (what the server does).
    #[default]
    Process,
    /// A fixed map (for tests and embedding).
    Map(BTreeMap<String, String>),
}

impl EnvSource {
    fn get(&self, name: &str) -> Result<String, String> {
        match self {
            EnvSource::Process => match std::env::var(name) {
                Ok(v) => Ok(v),
                Err(std::env::VarError::NotPresent) => {
                    Err(format!("environment variable {name} is not set"))
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    Err(format!("environment variable {name} is not valid UTF-8"))
                }
            },
            EnvSource::Map(m) => m
                .get(name)
                .cloned()
                .ok_or_else(|| format!("environment variable {name} is not set")),
        }
    }
}

/// A parsed placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placeholder<'s> {
    /// `${file:/abs/path}`.
    File(&'s str),
    /// `${env:NAME}`.
    Env(&'s str),
}

/// Whether the string is meant as a placeholder (`${...}` as a whole).
pub fn looks_like_placeholder(s: &str) -> bool {
    s.starts_with("${") && s.ends_with('}') && s.len() >= 3
}

/// Parses a whole-value placeholder. `None`: not a placeholder at all;
/// `Some(Err)`: looks like one but is malformed.
pub fn parse(s: &str) -> Option<Result<Placeholder<'_>, String>> {
    if !looks_like_placeholder(s) {
        return None;
    }
    let inner = &s[2..s.len() - 1];
    Some(if let Some(path) = inner.strip_prefix("file:") {
        if !path.starts_with('/') {
            Err("a ${file:...} placeholder needs an absolute path".to_string())
        } else if path.contains(['\0', '\n', '\r']) {
            Err("a ${file:...} placeholder path must not contain NUL or line breaks".to_string())
        } else {
            Ok(Placeholder::File(path))
        }
    } else if let Some(name) = inner.strip_prefix("env:") {
        let mut chars = name.chars();
        let ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if ok {
            Ok(Placeholder::Env(name))
        } else {
            Err(
                "a ${env:...} placeholder needs a variable name of letters, digits and _"
                    .to_string(),
            )
        }
    } else {
        Err("unknown placeholder, expected ${file:/absolute/path} or ${env:NAME}".to_string())
    })
}

/// Resolves placeholders the way the server does.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    /// Read `${file:/x}` as `ROOT/x` (for checking a pod's layout offline).
    pub root: Option<PathBuf>,
    /// Where variables come from.
    pub env: EnvSource,
    /// Every file a `${file:...}` placeholder read (or tried to), shared
    /// by the clones of one load.
    pub read: std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>,
}

impl Resolver {
    /// The value of a placeholder, or a message that does not reveal it.
    pub fn resolve(&self, p: &Placeholder<'_>) -> Result<String, String> {
        match p {
            Placeholder::Env(name) => self.env.get(name),
            Placeholder::File(path) => {
                let real = rooted(self.root.as_deref(), Path::new(path));
                self.read
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(real.clone());
                let bytes = read_capped(&real, MAX_PLACEHOLDER_FILE_BYTES)
                    .map_err(|e| format!("placeholder file {path}: {e}"))?;
                let mut text = String::from_utf8(bytes)
                    .map_err(|_| format!("placeholder file {path} is not valid UTF-8"))?;
                if text.ends_with("\r\n") {
                    text.truncate(text.len() - 2);
                } else if text.ends_with('\n') {
                    text.truncate(text.len() - 1);
                }
                Ok(text)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_forms() {
        assert_eq!(parse("plain"), None);
        assert_eq!(parse("${file:/a/b}"), Some(Ok(Placeholder::File("/a/b"))));
        assert_eq!(parse("${env:A_1}"), Some(Ok(Placeholder::Env("A_1"))));
        assert!(matches!(parse("${file:a/b}"), Some(Err(_))));
        assert!(matches!(parse("${env:1A}"), Some(Err(_))));
        assert!(matches!(parse("${fle:/a}"), Some(Err(_))));
        assert_eq!(parse("x${env:A}"), None);
    }

    #[test]
    fn strips_one_newline() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "v\n\n").unwrap();
        std::fs::write(dir.path().join("b"), "w\r\n").unwrap();
        let r = Resolver {
            root: Some(dir.path().to_path_buf()),
            env: EnvSource::Map(BTreeMap::new()),
            read: Default::default(),
        };
        assert_eq!(r.resolve(&Placeholder::File("/a")).unwrap(), "v\n");
        assert_eq!(r.resolve(&Placeholder::File("/b")).unwrap(), "w");
        assert_eq!(
            r.resolve(&Placeholder::File("/c")).unwrap_err(),
            "placeholder file /c: file not found"
        );
        assert_eq!(
            r.resolve(&Placeholder::Env("X")).unwrap_err(),
            "environment variable X is not set"
        );
    }
}
