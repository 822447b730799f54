//! Free-form parts of the specs: raw haltsql configuration sections, kept
//! as given.

use schemars::{Schema, SchemaGenerator, json_schema};

/// Schema for a free-form object whose content is kept as given.
pub(crate) fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema for a list of free-form objects whose content is kept as given.
pub(crate) fn free_form_object_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true
        }
    })
}

/// A free-form object (raw haltsql configuration section).
pub type RawObject = serde_json::Map<String, serde_json::Value>;
