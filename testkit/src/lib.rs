//! Helpers shared by the operator's integration tests, the end-to-end
//! scenario (`e2e/`), the benchmark (`examples/bench`) and the fault suite
//! (`tests/chaos`): one copy of each, so they cannot drift apart.
//!
//! Knows nothing of the operator's own types (it would link a second copy of
//! the operator library into every test binary): fixtures are YAML/JSON
//! values, and rendered files are plain maps.

pub mod cluster;
pub mod fixtures;
pub mod http;
pub mod identity;
pub mod launcher;
pub mod namespace;
pub mod net;
pub mod paths;
pub mod pod_files;
pub mod prometheus;
pub mod status;
pub mod wait;

pub use cluster::Cluster;
pub use namespace::TestNamespace;
pub use wait::eventually;
