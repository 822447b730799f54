#!/usr/bin/env bash
# `make loadtest`: haltsql serve (release build) on loopback under hostile
# clients while wrk measures well-behaved ones. Bounded: LOADTEST_SECONDS
# (default 20) of attack, LOADTEST_SLOW slow connections (default 2000,
# four times the server's max_connections of 500), LOADTEST_FLOOD clients
# sending 16 MiB bodies (default 16). Prints the figures; exits 1 when a
# target is missed (p99 of well-behaved clients >= 50 ms, a failed health
# probe, a slow connection kept past the header timeout, or more memory
# than the in-flight bound allows).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${LOADTEST_SECONDS:-20}"
slow="${LOADTEST_SLOW:-2000}"
flood="${LOADTEST_FLOOD:-16}"
max_connections=500
header_timeout=5
max_in_flight=64

if ! command -v wrk >/dev/null 2>&1; then
  echo ">> installing wrk (apt)" >&2
  apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi
echo ">> building haltsql and the hostile client driver (release)" >&2
cargo build --release --quiet -p haltsql --bin haltsql --example hostile_clients
target="${CARGO_TARGET_DIR:-$root/target}/release"

# Slow connections, flood and wrk all come from this shell: raise the limit.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

work="$(mktemp -d /tmp/haltsql-loadtest.XXXXXX)"
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=hack/serve-fixture.sh
source "$root/hack/serve-fixture.sh"
pick_ports
token="loadtest-token"
hash="$(printf '%s' "$token" | "$target/haltsql" hash-token)"
quick_start_policy "$work/policy.yaml"
cat > "$work/config.yaml" <<YAML
apiVersion: haltsql.dev/v1
kind: Config
server:
  listen: 127.0.0.1:$api_port
  health_listen: 127.0.0.1:$health_port
  auth:
    tokens: [{name: agent, policy: orders-agent, sha256: $hash}]
policies: [{file: policy.yaml}]
audit:
  sinks: [{type: file, path: $work/audit.log}]
logging:
  level: error
limits:
  header_read_timeout_seconds: $header_timeout
  idle_timeout_seconds: 10
  max_connections: $max_connections
  max_requests_in_flight: $max_in_flight
YAML
"$target/haltsql" serve --config "$work/config.yaml" 2>"$work/serve.log" &
server_pid=$!
ready=""
for _ in $(seq 100); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$health_port") 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
[[ -n $ready ]] || { echo "haltsql serve did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }
rss() { awk '/^VmRSS:/ {printf "%.1f", $2/1024}' "/proc/$server_pid/status"; }
idle_rss="$(rss)"

cat > "$work/verify.lua" <<LUA
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $token"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"sql": "SELECT id, status FROM orders WHERE status = \'open\' LIMIT 10"}'
-- Well-behaved: each connection pauses 10 ms between requests (about 800
-- requests/s in all) instead of saturating the two shared cores itself.
function delay()
  return 10
end
LUA

echo ">> attack: $slow slow connections (bound $max_connections), $flood clients sending 16 MiB bodies, ${seconds}s" >&2
"$target/examples/hostile_clients" --api "127.0.0.1:$api_port" --health "127.0.0.1:$health_port" \
  --pid "$server_pid" --token "$token" --slow "$slow" --flood "$flood" --seconds "$seconds" \
  > "$work/hostile.txt" &
driver_pid=$!
# Let the slow connections pile up first.
sleep 3
wrk_seconds=$(( seconds > 8 ? seconds - 6 : 2 ))
wrk -t1 -c8 -d"${wrk_seconds}s" --latency -s "$work/verify.lua" "http://127.0.0.1:$api_port/v1/verify" > "$work/wrk.txt"
wait "$driver_pid"
server_cpu="$(ps -o cputime= -p "$server_pid" | tr -d ' ')"
hwm="$(awk '/^VmHWM:/ {printf "%.1f", $2/1024}' "/proc/$server_pid/status")"

field() { awk -v k="$1" '$1 == k {print $2}' "$work/hostile.txt"; }
to_ms() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}; printf "%.2f", v}'; }
p50="$(awk '$1 == "50%" {print $2}' "$work/wrk.txt" | to_ms)"
p99="$(awk '$1 == "99%" {print $2}' "$work/wrk.txt" | to_ms)"
requests="$(awk '/requests in/ {print $1}' "$work/wrk.txt")"
non2xx="$(awk '/Non-2xx/ {print $NF}' "$work/wrk.txt")"
errors="$(awk '/Socket errors/ {print}' "$work/wrk.txt")"

echo "== haltsql serve under hostile clients (loopback, release build, ${seconds}s) =="
echo "limits: max_connections $max_connections, header_read_timeout ${header_timeout}s, idle_timeout 10s, max_requests_in_flight $max_in_flight, max_request_bytes 65536"
echo "well-behaved (wrk -t1 -c8, 10 ms pause per connection, ${wrk_seconds}s): requests ${requests:-0}, p50 ${p50} ms, p99 ${p99} ms, non-2xx ${non2xx:-0}${errors:+, $errors}"
echo "slow connections: opened $(field slow_connections_opened), closed by the server $(field slow_connections_closed_by_server) (503 at accept $(field slow_connections_refused_503)), lifetime p50 $(field slow_lifetime_ms_p50) ms, p99 $(field slow_lifetime_ms_p99) ms, max $(field slow_lifetime_ms_max) ms"
echo "16 MiB bodies: $(field flood_requests) requests, 413 $(field flood_413), 503 $(field flood_503), other $(field flood_other), $(field flood_mib_sent) MiB sent"
echo "health port /readyz: ok $(field health_readyz_ok), failed $(field health_readyz_failed), max $(field health_readyz_ms_max) ms"
echo "server memory: idle ${idle_rss} MiB, peak RSS $(field server_rss_peak_mib) MiB, VmHWM ${hwm} MiB; server CPU time ${server_cpu}"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

fail=0
awk -v p="$p99" 'BEGIN {exit !(p < 50)}' || { echo "MISSED: p99 ${p99} ms >= 50 ms"; fail=1; }
[[ "$(field health_readyz_failed)" == 0 ]] || { echo "MISSED: health probes failed"; fail=1; }
# A slow connection lives at most the header timeout plus the 1 s its client
# waits between bytes (eviction closes most of them sooner).
awk -v m="$(field slow_lifetime_ms_max)" -v t="$header_timeout" 'BEGIN {exit !(m <= (t + 1.5) * 1000)}' \
  || { echo "MISSED: a slow connection lived longer than the header timeout"; fail=1; }
# Bodies in flight cost at most max_in_flight * 64 KiB (4 MiB) on top of
# the connections' buffers; 256 MiB would mean bodies are buffered whole.
awk -v h="$hwm" 'BEGIN {exit !(h < 256)}' || { echo "MISSED: memory peak ${hwm} MiB"; fail=1; }
[[ $fail == 0 ]] && echo "all targets met"
exit "$fail"
