#!/usr/bin/env bash
# `make demo`: from a fresh clone, build what is needed, start the local
# control plane with a real node (kubelet + containerd), build and load the
# images, install the operator from config/default, apply config/samples,
# wait, and ask a real server pod two questions through kubectl port-forward;
# then publish a signed bundle to a local S3 server (s3s-fs on the node's
# address), point config/samples' bundle policy at it, and ask a pod of a
# second server that loads only the bundle.
#
#   hack/demo.sh               run the demo; the cluster keeps running
#   DEMO_STOP=1 hack/demo.sh   ... and stop everything at the end
#   hack/demo.sh stop          stop the local cluster and the demo's S3 server
#
# Needs root (the kubelet and containerd), like the node tier of `make test`.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
state="$root/.cache/demo"
kubeconfig="$root/.cluster/node/kubeconfig"
images="${IMAGES_DIR:-$root/.cache/images}"
ns=agents
node_ip=198.19.0.1   # the node's InternalIP (hack/cluster-node.sh), which the pods reach
operator_ns=haltsql-system
operator_deploy=haltsql-operator-controller-manager

say() { printf '>> %s\n' "$*" >&2; }
k() { "$root/bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

stop_s3() {
  if [ -f "$state/s3s-fs.pid" ]; then
    kill "$(cat "$state/s3s-fs.pid")" 2>/dev/null || true
    rm -f "$state/s3s-fs.pid"
  fi
}

if [ "${1:-}" = stop ]; then
  stop_s3
  hack/cluster.sh down node
  rm -rf "$state"
  exit 0
fi

for tool in cargo go openssl curl; do
  command -v "$tool" >/dev/null || { echo "make demo needs $tool on PATH" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "make demo runs a kubelet and containerd: run it as root" >&2; exit 1; }
started=$SECONDS
stop_s3
rm -rf "$state"
mkdir -p "$state"

say "building the control-plane tools (Go modules; cached per machine after the first build)"
hack/build-tools.sh

say "building the S3 server of the bundle step (s3s-fs; hack/install-peers.sh, cached per machine)"
hack/install-peers.sh

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

say "a signed bundle: haltsql bundle keygen/build/sign, published to s3s-fs on $node_ip"
profile=${IMAGES_PROFILE:-release}
[ "$profile" = dev ] && profile=debug
haltsql="${CARGO_TARGET_DIR:-$root/target}/$profile/haltsql"   # the binary of the image
mkdir -p "$state/bundle/src" "$state/s3/policies/prod"
# The bundle holds the quick-start policy of config/samples, read back from the cluster.
k -n "$ns" get haltsqlpolicy orders -o jsonpath='{.spec.policy}' >"$state/bundle/src/orders.yaml"
(
  cd "$state/bundle"
  "$haltsql" bundle keygen --private-key bundle.key --public-key bundle.pub
  "$haltsql" bundle build src -o bundle.tar.gz --revision demo
  "$haltsql" bundle sign --key bundle.key bundle.tar.gz
)
cp "$state/bundle/bundle.tar.gz.sig" "$state/bundle/bundle.tar.gz" "$state/s3/policies/prod/"
s3_port=$(python3 -c "import socket; s=socket.socket(); s.bind(('$node_ip', 0)); print(s.getsockname()[1])")
s3_secret="$(openssl rand -hex 24)"
setsid "$root/bin/s3s-fs" --host "$node_ip" --port "$s3_port" --access-key demo-access \
  --secret-key "$s3_secret" "$state/s3" >"$state/s3s-fs.log" 2>&1 </dev/null &
echo $! >"$state/s3s-fs.pid"

say "config/samples' prod-bundle pointed at http://$node_ip:$s3_port (static credentials in Secret bundle-s3), and a server haltsql-bundle that loads it"
k -n "$ns" create secret generic bundle-s3 --from-literal=access_key_id=demo-access \
  --from-literal=secret_access_key="$s3_secret" --dry-run=client -o yaml | k apply --server-side --force-conflicts -f - >/dev/null
{
  cat <<YAML
apiVersion: haltsql.dev/v1alpha1
kind: HaltSQLPolicy
metadata: {name: prod-bundle, namespace: $ns}
spec:
  bundleSource:
    s3: {bucket: policies, key: prod/bundle.tar.gz, region: us-east-1, endpoint: "http://$node_ip:$s3_port", credentials: {source: static, secretName: bundle-s3}}
    namePrefix: prod.
    pollIntervalSeconds: 10
    publicKeys:
    - |
YAML
  sed 's/^/      /' "$state/bundle/bundle.pub"
  cat <<YAML
---
apiVersion: haltsql.dev/v1alpha1
kind: HaltSQLServer
metadata: {name: haltsql-bundle, namespace: $ns}
spec:
  replicas: 1
  image: $haltsql_img
  policies: [{name: prod-bundle}]
  auth:
    tokens:
    - {name: orders-agent, policy: prod.orders-agent, sha256SecretRef: {name: haltsql-tokens, key: orders-agent.sha256}}
YAML
} >"$state/bundle.yaml"
# Client-side apply, like the samples' apply -k: the sample's oci source is removed.
k apply -f "$state/bundle.yaml"
k -n "$ns" wait --for=condition=Ready haltsqlserver/haltsql-bundle --timeout=240s
k -n "$ns" wait --for=condition=Synced haltsqlpolicy/prod-bundle --timeout=60s

forwards=()
trap 'for f in "${forwards[@]}"; do kill "$f" 2>/dev/null || true; done' EXIT
# forward SERVICE: kubectl port-forward svc/SERVICE to a server pod; prints the local port.
forward() {
  local log="$state/port-forward-$1.log" port=
  k -n "$ns" port-forward --address 127.0.0.1 "svc/$1" :8080 >"$log" 2>&1 </dev/null &
  forwards+=($!)
  for _ in $(seq 1 100); do
    port=$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$log" | head -n1)
    [ -n "$port" ] && break
    sleep 0.2
  done
  [ -n "$port" ] || { echo "kubectl port-forward svc/$1 did not start:" >&2; cat "$log" >&2; exit 1; }
  echo "$port"
}
say "kubectl port-forward svc/haltsql and svc/haltsql-bundle to server pods"
port=$(forward haltsql)
bundle_port=$(forward haltsql-bundle)

# verify PORT SQL
verify() {
  curl -sS "http://127.0.0.1:$1/v1/verify" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/json' -d "{\"sql\":\"$2\"}"
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
echo "\$ POST /v1/verify  SELECT id, status FROM orders LIMIT 10        (svc/haltsql)"
verify "$port" "SELECT id, status FROM orders LIMIT 10"
echo "\$ POST /v1/verify  SELECT id, email FROM orders LIMIT 10         (svc/haltsql)"
verify "$port" "SELECT id, email FROM orders LIMIT 10"
echo "\$ POST /v1/verify  SELECT id, status FROM orders LIMIT 10        (svc/haltsql-bundle: the signed bundle from S3)"
verify "$bundle_port" "SELECT id, status FROM orders LIMIT 10"
echo

if [ "${DEMO_STOP:-0}" = 1 ]; then
  say "stopping (DEMO_STOP=1)"
  stop_s3
  hack/cluster.sh down node
  rm -rf "$state"
  say "done in $((SECONDS - started))s"
else
  say "done in $((SECONDS - started))s. The cluster keeps running (export KUBECONFIG=$kubeconfig). Stop it and the S3 server with: hack/demo.sh stop"
fi
