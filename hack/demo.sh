#!/usr/bin/env bash
# `make demo`: from a fresh clone, build what is needed, start the local
# control plane, install the CRDs and RBAC, run the operator (as its own
# ServiceAccount), apply config/samples, wait, and show the result.
#
#   hack/demo.sh          run the demo; the cluster and the operator keep running
#   DEMO_STOP=1 hack/demo.sh   ... and stop everything at the end
#   hack/demo.sh stop     stop the demo's operator and the local cluster
#
# The local cluster's pods are kwok pods: they become Ready but run no
# containers. The /v1/verify answers therefore come from a `haltsql serve`
# started from the rendered ConfigMap and the token Secret laid out as in the pod
# (the same trick as the end-to-end test, e2e/serve.rs).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
state="$root/.cluster/demo"
kubeconfig="$root/.cluster/full/kubeconfig"
target="${CARGO_TARGET_DIR:-$root/target}/debug"
ns=agents
operator_ns=haltsql-system
operator_sa=haltsql-operator-controller-manager

say() { printf '>> %s\n' "$*" >&2; }
k() { "$root/bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() { # stop_pidfile FILE: TERM the recorded process group, then KILL
  local file=$1 pid
  alive "$file" || { rm -f "$file"; return 0; }
  pid=$(cat "$file")
  kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "-$pid" 2>/dev/null || true
  rm -f "$file"
}

stop() {
  stop_pidfile "$state/serve.pid"
  stop_pidfile "$state/operator.pid"
  rm -rf "$state"
  hack/cluster.sh down full
}

free_port() { # a free loopback port (python3), or the fallback $1
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo "$1"
}

wait_http() { # wait_http URL SECONDS
  local deadline=$((SECONDS + $2))
  until curl -sf -o /dev/null "$1"; do
    if [ $SECONDS -ge "$deadline" ]; then return 1; fi
    sleep 0.3
  done
}

if [ "${1:-}" = stop ]; then
  stop
  exit 0
fi

for tool in cargo go openssl curl; do
  command -v "$tool" >/dev/null || { echo "make demo needs $tool on PATH" >&2; exit 1; }
done
started=$SECONDS

say "building the control-plane tools (Go modules; cached per machine after the first build)"
hack/build-tools.sh

say "building the operator and the haltsql CLI (cargo build)"
cargo build -p haltsql-operator -p haltsql --bins

say "starting the local cluster (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
hack/cluster.sh up full
mkdir -p "$state"

say "installing the CRDs and RBAC (config/crd, config/rbac in namespace $operator_ns)"
k apply --server-side --force-conflicts -f config/manager/namespace.yaml >/dev/null
mkdir -p "$state/install"
cat >"$state/install/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $operator_ns
resources:
- ../../../config/crd
- ../../../config/rbac
EOF
k kustomize "$state/install" | k apply --server-side --force-conflicts -f - >/dev/null
k wait --for=condition=Established --timeout=60s \
  crd/haltsqlpolicies.haltsql.dev crd/haltsqlservers.haltsql.dev >/dev/null

# The operator runs as a local process whose requests impersonate its
# ServiceAccount, so the RBAC of config/rbac is what authorizes it. It watches
# only the samples' namespace. A small supervisor stops it when the cluster's
# kube-apiserver goes away (`make cluster-down`).
say "running the operator as $operator_sa (log: .cluster/demo/operator.log)"
stop_pidfile "$state/operator.pid"
health_port="${DEMO_HEALTH_PORT:-$(free_port 28081)}"
metrics_port="${DEMO_METRICS_PORT:-$(free_port 28080)}"
sed -e "/^    client-key:/a\\
    as: system:serviceaccount:$operator_ns:$operator_sa\\
    as-groups: [system:serviceaccounts, system:serviceaccounts:$operator_ns, system:authenticated]" \
  "$kubeconfig" >"$state/operator.kubeconfig"
grep -q "^    as: " "$state/operator.kubeconfig" || { echo "cannot write the operator's kubeconfig" >&2; exit 1; }
KUBECONFIG="$state/operator.kubeconfig" setsid bash -c '
  apiserver_pid=$1 state=$2; shift 2
  "$@" & op=$!
  trap "kill -TERM $op 2>/dev/null; wait $op; exit 0" TERM INT
  while kill -0 "$op" 2>/dev/null; do
    if ! kill -0 "$(cat "$apiserver_pid" 2>/dev/null)" 2>/dev/null; then
      kill -TERM "$op"; wait "$op"; rm -rf "$state"; rmdir "${state%/*}" 2>/dev/null; exit 0
    fi
    sleep 2
  done
' demo-operator "$root/.cluster/full/kube-apiserver.pid" "$state" \
  "$target/haltsql-operator" \
  --haltsql-binary "$target/haltsql" \
  --watch-namespaces "$ns" \
  --metrics-bind-address "127.0.0.1:$metrics_port" \
  --health-probe-bind-address "127.0.0.1:$health_port" \
  >"$state/operator.log" 2>&1 </dev/null &
echo $! >"$state/operator.pid"
if ! wait_http "http://127.0.0.1:$health_port/readyz" 60; then
  echo "the operator did not become ready; its log:" >&2
  tail -n 30 "$state/operator.log" >&2
  exit 1
fi

say "applying config/samples in namespace $ns (with a fresh agent token in Secret haltsql-tokens)"
token="$(openssl rand -hex 32)"
hash="$(printf '%s' "$token" | "$target/haltsql" hash-token)"
k create namespace "$ns" --dry-run=client -o yaml | k apply --server-side -f - >/dev/null
k -n "$ns" create secret generic haltsql-tokens --from-literal=orders-agent.sha256="$hash" \
  --dry-run=client -o yaml | k apply --server-side --force-conflicts -f - >/dev/null
k apply -k config/samples

say "waiting for the policies to be Valid and Synced and the server Ready"
k -n "$ns" wait --for=condition=Valid haltsqlpolicy --all --timeout=180s
k -n "$ns" wait --for=condition=Synced haltsqlpolicy/orders --timeout=180s
k -n "$ns" wait --for=condition=Ready haltsqlserver/haltsql --timeout=180s

# A stand-in for one server pod: the rendered ConfigMap's files and the token
# hash at /var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256, both
# under a private root; listen on a free loopback port.
say "starting haltsql serve from the rendered ConfigMap haltsql-haltsql-config (kwok pods run no containers)"
stop_pidfile "$state/serve.pid"
pod="$state/pod"
rm -rf "$pod"
mkdir -p "$pod/etc/haltsql" "$pod/var/run/haltsql/secrets/haltsql-tokens"
cm() { k -n "$ns" get configmap haltsql-haltsql-config -o go-template="$1"; }
for key in $(cm '{{range $k, $v := .data}}{{$k}}{{"\n"}}{{end}}'); do
  cm "{{index .data \"$key\"}}" >"$pod/etc/haltsql/$key"
done
printf '%s' "$hash" >"$pod/var/run/haltsql/secrets/haltsql-tokens/orders-agent.sha256"
port="$(free_port 28090)"
sed -i -e "s#\${file:/#\${file:$pod/#g" -e "s#^\(  listen:\).*#\1 127.0.0.1:$port#" "$pod/etc/haltsql/config.yaml"
setsid "$target/haltsql" serve --config "$pod/etc/haltsql/config.yaml" >"$state/serve.log" 2>&1 </dev/null &
echo $! >"$state/serve.pid"
if ! wait_http "http://127.0.0.1:$port/readyz" 30; then
  echo "haltsql serve did not start; its log:" >&2
  cat "$state/serve.log" >&2
  exit 1
fi

verify() {
  curl -sS "http://127.0.0.1:$port/v1/verify" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/json' -d "{\"sql\":\"$1\"}"
  echo
}

echo
echo "\$ kubectl -n $ns get haltsqlpolicies,haltsqlservers"
k -n "$ns" get haltsqlpolicies,haltsqlservers
# Explain any condition that is not True (prod-bundle: no server loads it).
k -n "$ns" get haltsqlpolicies -o go-template='{{range .items}}{{$n := .metadata.name}}{{range .status.conditions}}{{if ne .status "True"}}# {{$n}}: {{.type}}={{.status}} ({{.reason}}): {{.message}}{{"\n"}}{{end}}{{end}}{{end}}'
echo
echo "\$ POST /v1/verify  SELECT id, status FROM orders LIMIT 10"
verify "SELECT id, status FROM orders LIMIT 10"
echo "\$ POST /v1/verify  SELECT id, email FROM orders LIMIT 10"
verify "SELECT id, email FROM orders LIMIT 10"
echo
stop_pidfile "$state/serve.pid"

if [ "${DEMO_STOP:-0}" = 1 ]; then
  say "stopping (DEMO_STOP=1)"
  stop
  say "done in $((SECONDS - started))s"
else
  say "done in $((SECONDS - started))s. The cluster and the operator keep running (export KUBECONFIG=$kubeconfig; operator log .cluster/demo/operator.log). Stop them with: make cluster-down"
fi
