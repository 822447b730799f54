//! The Service, the PodDisruptionBudget and the NetworkPolicy.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::errors::RenderError;
use super::objects::{ServerRef, selector_labels};
use super::workload::HTTP_PORT;
use crate::api::PdbBudget;

fn pod_selector(srv: &ServerRef<'_>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector_labels(srv.name)),
        ..Default::default()
    }
}

/// The Service `<server>`: `service.port` to the container's `http` port.
pub(crate) fn service(srv: &ServerRef<'_>) -> Service {
    let spec = srv.spec;
    let annotations: BTreeMap<String, String> = spec
        .service
        .as_ref()
        .and_then(|s| s.annotations.clone())
        .unwrap_or_default();
    Service {
        metadata: srv.meta(srv.name.to_owned(), annotations),
        spec: Some(ServiceSpec {
            type_: Some(spec.service_type().as_str().to_owned()),
            selector: Some(selector_labels(srv.name)),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                port: spec.service_port(),
                target_port: Some(IntOrString::String("http".to_owned())),
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The PodDisruptionBudget `<server>`, when enabled.
pub(crate) fn pod_disruption_budget(
    srv: &ServerRef<'_>,
) -> Result<Option<PodDisruptionBudget>, RenderError> {
    let Some(budget) = srv.spec.pdb_budget()? else {
        return Ok(None);
    };
    let (min_available, max_unavailable) = match budget {
        PdbBudget::MinAvailable(v) => (Some(v), None),
        PdbBudget::MaxUnavailable(v) => (None, Some(v)),
    };
    Ok(Some(PodDisruptionBudget {
        metadata: srv.meta(srv.name.to_owned(), BTreeMap::new()),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(pod_selector(srv)),
            min_available,
            max_unavailable,
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// The NetworkPolicy `<server>`, when enabled: ingress to the API port only,
/// from the listed peers or, with none, from any pod in the namespace.
/// Other ingress (the TLS health port included) is denied; kubelet probes
/// are not subject to NetworkPolicy on common network plugins.
pub(crate) fn network_policy(srv: &ServerRef<'_>) -> Option<NetworkPolicy> {
    if !srv.spec.network_policy_enabled() {
        return None;
    }
    let peers = srv.spec.network_policy_peers();
    let from = if peers.is_empty() {
        vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector::default()),
            ..Default::default()
        }]
    } else {
        peers.to_vec()
    };
    Some(NetworkPolicy {
        metadata: srv.meta(srv.name.to_owned(), BTreeMap::new()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(pod_selector(srv)),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(from),
                ports: Some(vec![NetworkPolicyPort {
                    protocol: Some("TCP".to_owned()),
                    port: Some(IntOrString::Int(HTTP_PORT)),
                    ..Default::default()
                }]),
            }]),
            ..Default::default()
        }),
    })
}
