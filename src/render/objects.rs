//! What every owned object carries: the names, labels and annotations the
//! operator recognises its objects by, the controller owner reference, and
//! the spec-hash stamp.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde::Serialize;

use super::checksum::{SPEC_HASH_ANNOTATION, spec_hash_of};
use crate::api::{API_VERSION, HaltSQLServer, HaltSQLServerSpec};

/// Label every owned object carries; the operator only touches objects
/// with it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "haltsql-operator";
/// `app.kubernetes.io/name` (always `haltsql`).
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// Value of [`NAME_LABEL`].
pub const APP_NAME: &str = "haltsql";
/// `app.kubernetes.io/instance` (the server's name).
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The config checksum on the pod template; a change rolls the pods.
pub const CONFIG_CHECKSUM_ANNOTATION: &str = "haltsql.dev/config-checksum";
/// The short config hash on a per-configuration ConfigMap and on the pod
/// template (so also on its ReplicaSets and pods).
pub const CONFIG_HASH_LABEL: &str = "haltsql.dev/config-hash";
/// Hex digits of the checksum in [`CONFIG_HASH_LABEL`] and the ConfigMap name.
pub const CONFIG_HASH_LEN: usize = 16;
/// The rendered config's key in the ConfigMap.
pub const CONFIG_KEY: &str = "config.yaml";
/// Largest ConfigMap data (keys and values) the operator renders: 900 KiB,
/// well below the API server's 1 MiB object limit.
pub const MAX_CONFIG_MAP_BYTES: usize = 900 * 1024;

/// The short form of a config checksum: its first [`CONFIG_HASH_LEN`] hex
/// digits (the [`CONFIG_HASH_LABEL`] value).
pub fn config_hash(checksum: &str) -> &str {
    checksum.get(..CONFIG_HASH_LEN).unwrap_or(checksum)
}

/// The common prefix of a server's ConfigMap names, `<server>-haltsql-config`.
/// Operator versions before per-configuration ConfigMaps used exactly this
/// name for their one mutable ConfigMap.
pub fn config_map_prefix(server_name: &str) -> String {
    format!("{server_name}-haltsql-config")
}

/// Name of the immutable ConfigMap of one rendered configuration:
/// `<server>-haltsql-config-<short hash>` (at most 63 + 16 + 17 characters,
/// well within the 253 of a ConfigMap name).
pub fn config_map_name(server_name: &str, checksum: &str) -> String {
    format!(
        "{}-{}",
        config_map_prefix(server_name),
        config_hash(checksum)
    )
}

/// The pod selector labels (name and instance): stable for the life of the
/// server, since a Deployment's selector cannot change.
pub fn selector_labels(server_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_owned(), APP_NAME.to_owned()),
        (INSTANCE_LABEL.to_owned(), server_name.to_owned()),
    ])
}

/// [`selector_labels`] in label-selector string form, for `status.selector`.
pub fn selector_string(server_name: &str) -> String {
    selector_labels(server_name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The labels of every owned object: the selector labels plus managed-by.
pub fn common_labels(server_name: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(server_name);
    labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
    labels
}

/// The controller owner reference to the server, if it has a uid.
pub fn owner_reference(server: &HaltSQLServer) -> Option<OwnerReference> {
    let uid = server.metadata.uid.clone()?;
    Some(OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: "HaltSQLServer".to_owned(),
        name: server.metadata.name.clone()?,
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Identity of the server being rendered.
pub(crate) struct ServerRef<'a> {
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub owner: Option<OwnerReference>,
    pub spec: &'a HaltSQLServerSpec,
}

impl ServerRef<'_> {
    /// Metadata of an owned object named `name`.
    pub(crate) fn meta(&self, name: String, annotations: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: self.namespace.map(str::to_owned),
            labels: Some(common_labels(self.name)),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: self.owner.clone().map(|o| vec![o]),
            ..Default::default()
        }
    }
}

/// Sets the `haltsql.dev/spec-hash` annotation of a rendered object.
pub(crate) fn stamp<K: Resource + Serialize>(mut obj: K) -> K {
    let hash = spec_hash_of(&obj);
    obj.meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(SPEC_HASH_ANNOTATION.to_owned(), hash);
    obj
}
