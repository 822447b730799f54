//! What the integration tests share beyond the test kit: the operator's own
//! types (an in-process runtime, typed objects, rendering) and the binary
//! built with them.

pub mod in_process;
pub mod manager;
pub mod objects;
pub mod render;

pub use haltsql_testkit::cluster::{delete_ignoring_missing, run_ok};
pub use haltsql_testkit::fixtures::quick_start_policy_document;
pub use haltsql_testkit::identity::LimitedIdentity;
pub use haltsql_testkit::launcher::OperatorProcess;
pub use haltsql_testkit::paths::{haltsql_bin, repo_root};
pub use haltsql_testkit::prometheus::Metrics;
pub use haltsql_testkit::status::condition;
pub use haltsql_testkit::{Cluster, TestNamespace, eventually};
pub use in_process::Operator;
pub use manager::{apply_quickstart, client_with_crds, merge_patch, operator_bin, options};
pub use objects::{config_map_names, current_config_map, policy_object, quick_start_server};
