#!/usr/bin/env bash
# `make bench`: build the release binaries, start the full local cluster if
# it is not running (and stop it again at the end if this script started it),
# install the CRDs, run the benchmark program (examples/bench) and print its
# table. Results: target/bench/results.json (or $BENCH_OUT/results.json).
#
#   BENCH_SCALE=small|default|large|curve   sizes (default: default; small takes a
#                               few minutes; curve runs small, default and large one
#                               after the other and prints how the figures grow)
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
# A CRD created a moment ago has no conditions yet, and kubectl wait then
# fails at once instead of waiting: try again for a minute.
for attempt in $(seq 60); do
  bin/kubectl --kubeconfig "$root/.cluster/full/kubeconfig" wait --for=condition=Established --timeout=5s \
    crd/haltsqlpolicies.haltsql.dev crd/haltsqlservers.haltsql.dev >/dev/null 2>&1 && break
  [ "$attempt" = 60 ] && { echo "bench: the CRDs did not become Established" >&2; exit 1; }
  sleep 1
done

bench() { # bench SCALE OUT
  mkdir -p "$2"
  # shellcheck disable=SC2086
  "$target/release/examples/bench" \
    --scale "$1" \
    --kubeconfig "$root/.cluster/full/kubeconfig" \
    --kubectl "$root/bin/kubectl" \
    --operator-bin "$target/release/haltsql-operator" \
    --haltsql-bin "$target/release/haltsql" \
    --out-dir "$2" \
    "${verify_args[@]}" ${BENCH_ARGS:-} | tee "$2/table.txt"
}
if [ "$scale" = curve ]; then
  for size in small default large; do
    echo ">> BENCH_SCALE=$size" >&2
    bench "$size" "$out/$size"
  done
  "$target/release/examples/bench" --scale default --operator-bin - --haltsql-bin - \
    --curve "$out/small" "$out/default" "$out/large" | tee "$out/curve.txt"
else
  bench "$scale" "$out"
fi
