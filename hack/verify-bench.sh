#!/usr/bin/env bash
# `make verify-bench`: verify throughput of a real `haltsql serve` process.
#
# Builds haltsql (release), starts `haltsql serve` on loopback with the
# quick-start policy (config/samples), a static bearer token, an audit file
# sink and the default limits and log level, then drives POST /v1/verify
# with wrk (a separate process, installed with apt when missing) at
# VERIFY_BENCH_CONNECTIONS (default 4) keep-alive connections: once with a
# typical allowed query, once with a typical denied one. Prints
# decisions/s, latency p50/p99 and the load average (/proc/loadavg) at the
# start and the end of each run, with the server's CPU time (and the
# kernel's part of it) and context switches per decision (steadier than
# decisions/s when other work shares the cores) and wrk's own CPU time per
# decision, then runs the in-process benchmark
# (haltsql/examples/verify_bench.rs) for comparison.
#
# The goal (issue 19) is 20,000 decisions/s at 4 connections on 2 cores on
# an otherwise idle machine: the script says whether it was met, but only
# fails when a figure cannot be obtained (the server does not start, a
# request is not answered 200 with the expected decision, wrk fails).
#
# Settings: VERIFY_BENCH_SECONDS (default 10) per run after a 2 s warm-up,
# VERIFY_BENCH_CONNECTIONS (4), VERIFY_BENCH_THREADS (wrk threads, 1),
# VERIFY_BENCH_INPROCESS=0 skips verify_bench, VERIFY_BENCH_PERF=1 records
# the server with `perf record -g` during the allowed run (perf.data and a
# report in VERIFY_BENCH_OUT, default target/verify-bench), VERIFY_BENCH_BIN
# names a folder with prebuilt haltsql and verify_bench binaries (no build;
# to compare two builds side by side).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${VERIFY_BENCH_SECONDS:-10}"
connections="${VERIFY_BENCH_CONNECTIONS:-4}"
wrk_threads="${VERIFY_BENCH_THREADS:-1}"
inprocess="${VERIFY_BENCH_INPROCESS:-1}"
perf_on="${VERIFY_BENCH_PERF:-0}"
goal=20000
target="${CARGO_TARGET_DIR:-$root/target}/release"
haltsql="${VERIFY_BENCH_BIN:-$target}/haltsql"
verify_bench="${VERIFY_BENCH_BIN:-$target/examples}/verify_bench"
out="${VERIFY_BENCH_OUT:-${CARGO_TARGET_DIR:-$root/target}/verify-bench}"

# The bench's two queries (the same as verify_bench's).
allowed_sql="SELECT id, status, total_cents FROM orders WHERE status = 'paid' AND total_cents > 1000 ORDER BY id DESC LIMIT 50"
denied_sql="SELECT id, email FROM orders WHERE status = 'paid' ORDER BY id DESC LIMIT 50"

die() { echo "verify-bench: $*" >&2; exit 1; }

if ! command -v wrk >/dev/null 2>&1; then
  echo ">> installing wrk (apt)" >&2
  apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
command -v wrk >/dev/null 2>&1 || die "wrk is not available"
if [[ $perf_on == 1 ]] && ! command -v perf >/dev/null 2>&1; then
  echo ">> installing perf (apt linux-perf)" >&2
  apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null
fi
if [[ -z ${VERIFY_BENCH_BIN:-} ]]; then
  echo ">> building haltsql and verify_bench (release)" >&2
  cargo build --release --quiet -p haltsql --bin haltsql --example verify_bench
fi
[[ -x $haltsql && -x $verify_bench ]] || die "no $haltsql or $verify_bench"

work="$(mktemp -d /tmp/haltsql-verify-bench.XXXXXX)"
server_pid=""
perf_pid=""
cleanup() {
  if [[ -n $perf_pid ]]; then kill -INT "$perf_pid" 2>/dev/null || true; wait "$perf_pid" 2>/dev/null || true; fi
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=hack/serve-fixture.sh
source "$root/hack/serve-fixture.sh"
pick_ports
token="verify-bench-token"
hash="$(printf '%s' "$token" | "$haltsql" hash-token)"
quick_start_policy "$work/policy.yaml"
# The contract's example config, with a file sink instead of stdout (the
# same write per event, without a terminal in the way) and the default
# limits and log level.
cat > "$work/config.yaml" <<YAML
apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: 127.0.0.1:$api_port
  health_listen: 127.0.0.1:$health_port
  auth:
    tokens: [{name: agent, policy: orders-agent, sha256: $hash}]
policies: [{file: policy.yaml}]
logging: {level: info, format: json}
audit:
  log_raw_sql: false
  sinks: [{type: file, path: $work/audit.log}]
YAML
"$haltsql" serve --config "$work/config.yaml" 2>"$work/serve.log" &
server_pid=$!
ready=""
for _ in $(seq 100); do
  kill -0 "$server_pid" 2>/dev/null || break
  if (exec 3<>"/dev/tcp/127.0.0.1/$health_port") 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
[[ -n $ready ]] || { cat "$work/serve.log" >&2; die "haltsql serve did not start"; }

# One request of each kind must give the expected decision.
check() {
  local sql="$1" want="$2" got
  got="$(curl -sS --fail -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    --data "{\"sql\": \"$sql\"}" "http://127.0.0.1:$api_port/v1/verify")" \
    || die "POST /v1/verify failed for: $sql"
  [[ $got == *"\"allowed\":$want"* ]] || die "expected allowed=$want for '$sql', got: $got"
}
check "$allowed_sql" true
check "$denied_sql" false

lua() {
  cat <<LUA
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $token"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"sql": "$1"}'
LUA
}
lua "${allowed_sql//\'/\\\'}" > "$work/allowed.lua"
lua "${denied_sql//\'/\\\'}" > "$work/denied.lua"

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# Voluntary and involuntary context switches of every thread of PID.
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ {v += $2} /^nonvoluntary_ctxt_switches/ {n += $2} END {print v + 0, n + 0}'; }
to_ms() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}; printf "%.3f", v}'; }
mkdir -p "$out"
results=()
for kind in allowed denied; do
  url="http://127.0.0.1:$api_port/v1/verify"
  # Warm-up: connections, allocator and caches.
  wrk -t"$wrk_threads" -c"$connections" -d2s -s "$work/$kind.lua" "$url" > /dev/null \
    || die "wrk failed (warm-up, $kind)"
  if [[ $perf_on == 1 && $kind == allowed ]]; then
    perf record -F 999 -g -p "$server_pid" -o "$out/perf.data" 2>"$work/perf.log" &
    perf_pid=$!
    sleep 0.5
  fi
  cpu_before="$(awk '{print $14 + $15}' "/proc/$server_pid/stat")"
  sys_before="$(awk '{print $15}' "/proc/$server_pid/stat")"
  cs_before="$(switches "$server_pid")"
  load_start="$(loadavg)"
  # wrk's own CPU time (user and system seconds), from bash's `time`.
  TIMEFORMAT='%U %S'
  { time wrk -t"$wrk_threads" -c"$connections" -d"${seconds}s" --latency -s "$work/$kind.lua" "$url" \
    > "$work/wrk-$kind.txt" 2>&1 ; } 2> "$work/wrk-$kind.time" || die "wrk failed ($kind)"
  wrk_cpu="$(awk '{print $1 + $2}' "$work/wrk-$kind.time")"
  load_end="$(loadavg)"
  cpu_after="$(awk '{print $14 + $15}' "/proc/$server_pid/stat")"
  sys_after="$(awk '{print $15}' "/proc/$server_pid/stat")"
  cs_after="$(switches "$server_pid")"
  if [[ -n $perf_pid ]]; then
    kill -INT "$perf_pid" 2>/dev/null || true
    wait "$perf_pid" 2>/dev/null || true
    perf_pid=""
    perf report -i "$out/perf.data" --no-children --percent-limit 0.3 --stdio \
      > "$out/perf-report.txt" 2>/dev/null || true
    echo ">> perf: $out/perf.data, $out/perf-report.txt" >&2
  fi
  cp "$work/wrk-$kind.txt" "$out/wrk-$kind.txt"
  rps="$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$work/wrk-$kind.txt")"
  [[ -n $rps ]] || { cat "$work/wrk-$kind.txt" >&2; die "no Requests/sec from wrk ($kind)"; }
  if grep -q 'Non-2xx' "$work/wrk-$kind.txt"; then
    cat "$work/wrk-$kind.txt" >&2
    die "non-2xx answers ($kind)"
  fi
  p50="$(awk '$1 == "50%" {print $2}' "$work/wrk-$kind.txt" | to_ms)"
  p99="$(awk '$1 == "99%" {print $2}' "$work/wrk-$kind.txt" | to_ms)"
  errors="$(awk '/Socket errors/ {sub(/^ +/, ""); print}' "$work/wrk-$kind.txt")"
  ticks="$(getconf CLK_TCK)"
  server_cpu="$(awk -v a="$cpu_before" -v b="$cpu_after" -v t="$ticks" -v s="$seconds" 'BEGIN {printf "%.2f", (b - a) / t / s}')"
  requests="$(awk '/ requests in / {print $1}' "$work/wrk-$kind.txt")"
  per_decision="$(awk -v a="$cpu_before" -v b="$cpu_after" -v sa="$sys_before" -v sb="$sys_after" -v t="$ticks" -v r="$requests" -v c0="$cs_before" -v c1="$cs_after" 'BEGIN {
    split(c0, x, " "); split(c1, y, " ");
    if (r > 0) printf "%.1f us CPU (%.1f in the kernel), %.2f + %.2f context switches", (b - a) / t / r * 1e6, (sb - sa) / t / r * 1e6, (y[1] - x[1]) / r, (y[2] - x[2]) / r }')"
  wrk_per_decision="$(awk -v w="$wrk_cpu" -v r="$requests" 'BEGIN { if (r > 0) printf "%.1f us CPU", w / r * 1e6 }')"
  verdict="goal met"
  (( rps >= goal )) || verdict="goal NOT met"
  results+=("$(printf '%-8s %6s decisions/s  p50 %7s ms  p99 %7s ms  server CPU %4s cores  load avg %s -> %s  (%s: %d/s)%s' \
    "$kind" "$rps" "$p50" "$p99" "$server_cpu" "$load_start" "$load_end" "$verdict" "$goal" "${errors:+  $errors}")")
  results+=("$(printf '         server per decision: %s (voluntary + involuntary); wrk: %s' "$per_decision" "$wrk_per_decision")")
done
audit_lines="$(wc -l < "$work/audit.log")"

echo "== haltsql serve: POST /v1/verify on loopback (release build, wrk -t$wrk_threads -c$connections, ${seconds}s per run after a 2 s warm-up) =="
echo "machine: $(nproc) cores; load average = 1/5/15-minute /proc/loadavg at the start -> the end of the run"
echo "policy: config/samples quick-start (orders-agent); auth: static bearer token; audit: file sink; logging: info, json"
echo "allowed: $allowed_sql"
echo "denied:  $denied_sql"
printf '%s\n' "${results[@]}"
echo "audit events written: $audit_lines"

kill "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
server_pid=""

if [[ $inprocess == 1 ]]; then
  echo
  echo "== in-process: haltsql/examples/verify_bench.rs (load average at the start: $(loadavg)) =="
  "$verify_bench" 3 || die "verify_bench failed"
  echo "load average at the end: $(loadavg)"
fi
