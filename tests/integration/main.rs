//! The operator's integration tests, one module per topic, in one test
//! binary so that a change links once.
//!
//! Tests of different modules now run concurrently on threads (they used to
//! be binaries run one after another), so none may disturb another:
//! - each works in a namespace of its own ([`support::TestNamespace`]), with
//!   its own ports (`free_port`) and its own child processes;
//! - cluster-scoped objects a test creates carry a name of its own (the
//!   ClusterRole of [`support::LimitedIdentity`] is named after the test's
//!   namespace; the Helm release of `manifests_install` too);
//! - the CRDs are applied by many tests (`ensure_crds`, server-side with
//!   force) and by the install tests (`make install-manifests`, the Helm
//!   chart, which keeps them on uninstall): all from the same generated
//!   definitions (`tests/integration/manifests_generated.rs`), so only their
//!   metadata changes and no watch of a running operator is interrupted;
//! - no test sets an environment variable or the current directory of this
//!   process (child processes get theirs).

mod support;

mod api_crd;
mod manager_flags;
mod manager_leader;
mod manager_metrics;
mod manager_namespaces;
mod manager_render;
mod manifests_docker;
mod manifests_generated;
mod manifests_install;
mod manifests_render;
mod node_smoke;
mod policy_reconcile;
mod policy_validator;
mod render_checksum;
mod render_errors;
mod render_golden;
mod render_validate;
mod server_cluster;
mod server_reconcile;
mod smoke_cluster;
