# Sourced by hack/loadtest.sh and hack/verify-bench.sh: what both need to
# start a `haltsql serve` on loopback.

# A free port in 20000-39999: nothing answers on it yet.
port() {
  local p
  while :; do
    p=$(( 20000 + RANDOM % 20000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}

# Sets api_port and health_port to two different free ports.
pick_ports() {
  api_port="$(port)"; health_port="$(port)"
  while [[ $health_port == "$api_port" ]]; do health_port="$(port)"; done
}

# Writes the quick-start policy, as config/samples ships it (the document
# under spec.policy), to FILE; fails if the sample holds none.
quick_start_policy() {
  local sample=config/samples/haltsql_v1alpha1_haltsqlpolicy.yaml
  sed -n '/^  policy: |$/,$p' "$sample" | tail -n +2 | sed 's/^    //' > "$1"
  grep -q '^kind: Policy$' "$1" || { echo "no policy in $sample" >&2; return 1; }
}
