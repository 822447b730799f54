#!/usr/bin/env bash
# `make demo`: from a fresh clone, build what is needed, start the local
# control plane with a real node (kubelet + containerd), build and load the
# images, install the operator from config/default, apply config/samples,
# wait, and ask a real server pod two questions through kubectl port-forward.
#
#   hack/demo.sh               run the demo; the cluster keeps running
#   DEMO_STOP=1 hack/demo.sh   ... and stop everything at the end
#   hack/demo.sh stop          stop the local cluster
#
# Needs root (the kubelet and containerd), like the node tier of `make test`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
state="$root/.cache/demo"
kubeconfig="$root/.cluster/node/kubeconfig"
images="${IMAGES_DIR:-$root/.cache/images}"
ns=agents
operator_ns=haltsql-system
operator_deploy=haltsql-operator-controller-manager

say() { printf '>> %s\n' "$*" >&2; }
k() { "$root/bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

if [ "${1:-}" = stop ]; then
  hack/cluster.sh down node
  rm -rf "$state"
  exit 0
fi

for tool in cargo go openssl curl; do
  command -v "$tool" >/dev/null || { echo "make demo needs $tool on PATH" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "make demo runs a kubelet and containerd: run it as root" >&2; exit 1; }
started=$SECONDS
rm -rf "$state"
mkdir -p "$state"

say "building the control-plane tools (Go modules; cached per machine after the first build)"
hack/build-tools.sh

say "building the images (release binaries; hack/images.sh)"
hack/images.sh
operator_img=$(cat "$images/haltsql-operator.tag")
haltsql_img=$(cat "$images/haltsql.tag")

say "starting the local cluster with a real node (hack/cluster.sh up node)"
hack/cluster.sh up node
hack/cluster.sh load node "$images/haltsql-operator.tar" "$images/haltsql.tar"

say "installing the operator: make install-manifests IMG=$operator_img | kubectl apply --server-side"
make -s --no-print-directory install-manifests IMG="$operator_img" >"$state/install.yaml"
k apply --server-side --force-conflicts -f "$state/install.yaml" >/dev/null
# Pods of an earlier demo keep the image they started with (same tag): restart them.
k -n "$operator_ns" rollout restart "deploy/$operator_deploy" >/dev/null
k -n "$operator_ns" rollout status "deploy/$operator_deploy" --timeout=180s

say "applying config/samples in namespace $ns (server image $haltsql_img, a fresh agent token in Secret haltsql-tokens)"
token="$(openssl rand -hex 32)"
hash="$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)"
k create namespace "$ns" --dry-run=client -o yaml | k apply --server-side -f - >/dev/null
k -n "$ns" create secret generic haltsql-tokens --from-literal=orders-agent.sha256="$hash" \
  --dry-run=client -o yaml | k apply --server-side --force-conflicts -f - >/dev/null
cat >"$state/kustomization.yaml" <<KUST
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../../config/samples
patches:
- target: {kind: HaltSQLServer, name: haltsql}
  patch: |-
    - op: replace
      path: /spec/image
      value: $haltsql_img
KUST
k apply -k "$state"

say "waiting for the policies to be Valid and Synced and the server Ready"
k -n "$ns" wait --for=condition=Valid haltsqlpolicy --all --timeout=180s
k -n "$ns" wait --for=condition=Synced haltsqlpolicy/orders --timeout=180s
k -n "$ns" wait --for=condition=Ready haltsqlserver/haltsql --timeout=240s

say "kubectl port-forward svc/haltsql to a server pod"
k -n "$ns" port-forward --address 127.0.0.1 svc/haltsql :8080 >"$state/port-forward.log" 2>&1 </dev/null &
forward=$!
trap 'kill "$forward" 2>/dev/null || true' EXIT
port=
for _ in $(seq 1 100); do
  port=$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$state/port-forward.log" | head -n1)
  [ -n "$port" ] && break
  sleep 0.2
done
[ -n "$port" ] || { echo "kubectl port-forward did not start:" >&2; cat "$state/port-forward.log" >&2; exit 1; }

verify() {
  curl -sS "http://127.0.0.1:$port/v1/verify" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/json' -d "{\"sql\":\"$1\"}"
  echo
}

echo
echo "\$ kubectl get pods -A -o wide"
k get pods -A -o wide
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

if [ "${DEMO_STOP:-0}" = 1 ]; then
  say "stopping (DEMO_STOP=1)"
  hack/cluster.sh down node
  rm -rf "$state"
  say "done in $((SECONDS - started))s"
else
  say "done in $((SECONDS - started))s. The cluster keeps running (export KUBECONFIG=$kubeconfig). Stop it with: make cluster-down"
fi
