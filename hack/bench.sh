#!/usr/bin/env bash
# `make bench`: build the release binaries, start the full local cluster if
# it is not running (and stop it again at the end if this script started it),
# install the CRDs, run the benchmark program (examples/bench) and print its
# table. Results: target/bench/results.json (or $BENCH_OUT/results.json).
#
#   BENCH_SCALE=small|default   sizes (default: default; small takes a few minutes)
#   BENCH_ARGS="..."            extra flags, e.g. "--policies 300 --idle-seconds 30"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

scale="${BENCH_SCALE:-default}"
out="${BENCH_OUT:-$root/target/bench}"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo="${CARGO:-cargo}"

echo ">> building release binaries" >&2
"$cargo" build --release --quiet -p haltsql-operator --bin haltsql-operator --example bench
"$cargo" build --release --quiet -p haltsql --bin haltsql
verify_args=()
if "$cargo" build --release --quiet -p haltsql --example verify_bench; then
  verify_args=(--verify-bench "$target/release/examples/verify_bench")
else
  echo ">> haltsql's verify_bench example does not build; scenario 5 is skipped" >&2
fi

# Capture first: `status | grep -q` under pipefail can fail on SIGPIPE and
# make a running (shared) cluster look stopped, which would stop it at the end.
started=0
cluster_status="$(hack/cluster.sh status full)"
if ! grep -q 'kube-apiserver: running' <<<"$cluster_status"; then
  started=1
  hack/cluster.sh up full
fi
cleanup() {
  local status=$?
  if [ "$started" = 1 ]; then hack/cluster.sh down full >/dev/null 2>&1 || true; fi
  exit $status
}
trap cleanup EXIT
bin/kubectl --kubeconfig "$root/.cluster/full/kubeconfig" apply --server-side --force-conflicts -f crds/ >/dev/null
bin/kubectl --kubeconfig "$root/.cluster/full/kubeconfig" wait --for=condition=Established --timeout=60s \
  crd/haltsqlpolicies.haltsql.dev crd/haltsqlservers.haltsql.dev >/dev/null

mkdir -p "$out"
# shellcheck disable=SC2086
"$target/release/examples/bench" \
  --scale "$scale" \
  --kubeconfig "$root/.cluster/full/kubeconfig" \
  --kubectl "$root/bin/kubectl" \
  --operator-bin "$target/release/haltsql-operator" \
  --haltsql-bin "$target/release/haltsql" \
  --out-dir "$out" \
  "${verify_args[@]}" ${BENCH_ARGS:-} | tee "$out/table.txt"
