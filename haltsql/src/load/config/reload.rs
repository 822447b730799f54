//! `reload`: whether the server watches its input files.

use crate::load::tree::Node;
use crate::load::walk::Doc;

/// `reload`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadConfig {
    /// Reload when the config or policy files change.
    pub watch: bool,
}

/// `reload`.
pub(super) fn parse_reload(doc: &mut Doc<'_>, node: &Node) -> Option<ReloadConfig> {
    let rm = doc.map(node, "reload", &["watch"])?;
    Some(ReloadConfig {
        watch: match rm.get("watch") {
            None => false,
            Some(w) => doc.bool(w, "reload.watch")?,
        },
    })
}
