#!/usr/bin/env bash
# `make chaos`: the full fault suite (tests/chaos/ with HALTSQL_CHAOS=full)
# on its own local cluster (`hack/cluster.sh up chaos`), which it starts if
# needed and stops again if it started it. Prints one table per scenario.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

started=0
cleanup() {
  local status=$?
  if [ "$started" = 1 ]; then hack/cluster.sh down chaos >/dev/null 2>&1 || true; fi
  exit $status
}
trap cleanup EXIT

cargo build --workspace --bins --quiet
export HALTSQL_BIN="${HALTSQL_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/haltsql}"
cluster_status=$(hack/cluster.sh status chaos)
if [[ $cluster_status != *"kube-apiserver: running"* ]]; then started=1; fi
hack/cluster.sh up chaos
bin/kubectl --kubeconfig "$root/.cluster/chaos/kubeconfig" apply --server-side --force-conflicts -f crds/ >/dev/null
export HALTSQL_CHAOS_KUBECONFIG="$root/.cluster/chaos/kubeconfig"
HALTSQL_CHAOS="${HALTSQL_CHAOS:-full}" cargo test -p haltsql-operator --test chaos -- --nocapture --test-threads=1
