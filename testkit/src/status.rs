//! Reading objects' status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The condition `type_` among an object's status conditions, as
/// `(status, reason)`.
pub fn condition(conditions: &[Condition], type_: &str) -> Option<(String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}
