#!/usr/bin/env bash
# `make test`: lint, build, start the local clusters, run every test tier,
# and stop the clusters it started whatever happened.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

started=()
cleanup() {
  local status=$?
  for mode in "${started[@]}"; do hack/cluster.sh down "$mode" >/dev/null 2>&1 || true; done
  if [ "${started_pg:-0}" = 1 ]; then hack/postgres.sh down >/dev/null 2>&1 || true; fi
  exit $status
}
trap cleanup EXIT

echo ">> lint" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo ">> build" >&2
cargo build --workspace --bins --quiet
export HALTSQL_BIN="${HALTSQL_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/haltsql}"

echo ">> images" >&2
hack/images.sh

# Clusters this run starts are stopped at the end; ones already running are reused.
for mode in full envtest node chaos; do
  # Capture first: under pipefail, grep -q closing the pipe early would make a
  # running cluster look stopped (and this run would stop it at the end).
  cluster_status=$(hack/cluster.sh status "$mode")
  if [[ $cluster_status != *"kube-apiserver: running"* ]]; then started+=("$mode"); fi
  hack/cluster.sh up "$mode"
done
for mode in full envtest chaos; do
  bin/kubectl --kubeconfig "$root/.cluster/$mode/kubeconfig" apply --server-side --force-conflicts -f crds/ >/dev/null
done
export HALTSQL_TEST_KUBECONFIG="$root/.cluster/full/kubeconfig"
export HALTSQL_ENVTEST_KUBECONFIG="$root/.cluster/envtest/kubeconfig"
export HALTSQL_NODE_KUBECONFIG="$root/.cluster/node/kubeconfig"
# The fault suite's own cluster (tests/chaos/ restarts its API server and
# etcd); `make test` runs its short form, `make chaos` the full one.
export HALTSQL_CHAOS_KUBECONFIG="$root/.cluster/chaos/kubeconfig"

# The bundle and audit sink tests' peers (registry, oras, nginx, s3s-fs, fake-gcs-server,
# Kafka, OpenSearch): built or installed once per machine.
echo ">> bundle and audit sink test peers" >&2
hack/install-peers.sh

# PostgreSQL judges the verify engine (haltsql/tests/engine_oracle.rs).
if [[ "$(hack/postgres.sh status)" != *running* ]]; then started_pg=1; fi
HALTSQL_ORACLE_PGHOST="$(hack/postgres.sh up)"; export HALTSQL_ORACLE_PGHOST

echo ">> cargo test" >&2
cargo test --workspace --no-fail-fast
