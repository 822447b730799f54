#!/usr/bin/env bash
# The local control plane used by the tests and the demo, built from source by
# hack/build-tools.sh. Everything listens on loopback only (the node mode's
# 198.19.0.1 sits on lo too).
#
#   hack/cluster.sh up [full|envtest|node]   start (idempotent) and wait until ready
#   hack/cluster.sh down [full|envtest|node] stop exactly the processes it started, remove state
#   hack/cluster.sh status [full|envtest|node|chaos]
#   hack/cluster.sh stop MODE COMPONENT [SIGNAL]  stop one component by its recorded pid
#                                        (SIGTERM by default); `up MODE` starts it again
#   hack/cluster.sh load node FILE.tar...    import image archives into the node's containerd
#   hack/cluster.sh check-clean node         list (and fail on) anything a node run left behind
#
# full:    etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
#          with one fake Node; kubeconfig at .cluster/kubeconfig.
# envtest: etcd and kube-apiserver only (no controllers: tests write Deployment
#          status themselves); kubeconfig at .cluster/envtest/kubeconfig.
# chaos:   like full, for the fault suite (tests/chaos/), which restarts its
#          kube-apiserver and etcd: its own ports and state (.cluster/chaos), an
#          audit log of writes (logs/audit.log) and etcd compaction every 10 s
#          (so a watch resumed after an outage may get 410 Gone).
# node:    a real node (needs root): the full control plane plus containerd,
#          kubelet and kube-proxy, pods on a bridge in 198.18.0.0/24; see
#          hack/cluster-node.sh. Kubeconfig at .cluster/node/kubeconfig.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/bin"
cmd=${1:-}
mode=${2:-full}
[ $# -ge 2 ] && shift 2 || shift $#

# HALTSQL_KCM_EXTRA_FLAGS adds flags to kube-controller-manager (full, chaos
# and node modes), for experiments such as a higher client rate limit
# ("--kube-api-qps=200 --kube-api-burst=400"; see the README's benchmarks).
#
# HALTSQL_CLUSTER_PORT_OFFSET moves every port, so a second checkout can run
# its own clusters beside the first. Every port stays below 32768, where the
# kernel's ephemeral ports begin: a listener there can find its port taken
# by some outgoing connection (it happened to the chaos etcd's peer port).
offset=${HALTSQL_CLUSTER_PORT_OFFSET:-0}
case "$mode" in
  full)    etcd_port=$((12379 + offset)); api_port=$((16443 + offset)) ;;
  envtest) etcd_port=$((22379 + offset)); api_port=$((26443 + offset)) ;;
  node)    etcd_port=$((32379 + offset)); api_port=$((32443 + offset)) ;;
  chaos)   etcd_port=$((27379 + offset)); api_port=$((29443 + offset)) ;;
  *) echo "unknown cluster mode: $mode (full, envtest, node or chaos)" >&2; exit 2 ;;
esac
# The node's pods reach the API server through the kubernetes Service, so it
# listens on the node's own address (on lo) instead of 127.0.0.1.
api_host=127.0.0.1
state="$root/.cluster/$mode"
pki="$state/pki"
logs="$state/logs"
kubeconfig="$state/kubeconfig"
components=(etcd kube-apiserver)
[ "$mode" = full ] || [ "$mode" = chaos ] && components+=(kube-controller-manager kube-scheduler kwok)
[ "$mode" = node ] && components+=(kube-controller-manager kube-scheduler containerd kubelet kube-proxy)

log() { echo ">> [$mode] $*" >&2; }

pid_running() { # pid_running PID: alive and not a zombie (this machine's init reaps slowly)
  kill -0 "$1" 2>/dev/null || return 1
  local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ "$st" != Z ]
}

alive() { # alive NAME: the recorded process is still running
  local pidfile="$state/$1.pid"
  [ -f "$pidfile" ] && pid_running "$(cat "$pidfile")"
}

start() { # start NAME CMD...: run in the background, record the pid, log to logs/NAME.log
  local name=$1; shift
  if alive "$name"; then return 0; fi
  setsid "$@" >"$logs/$name.log" 2>&1 < /dev/null &
  echo $! >"$state/$name.pid"
}

wait_for() { # wait_for WHAT SECONDS CMD...
  local what=$1 limit=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      log "timed out waiting for $what; last log lines:"
      tail -n 30 "$logs"/*.log >&2 || true
      return 1
    fi
    sleep 0.5
  done
}

make_pki() {
  [ -f "$pki/admin.crt" ] && return 0
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=haltsql-local-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    cat >serving.ext <<EXT
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:198.19.64.1,DNS:kubernetes.default.svc${extra_sans:-}
extendedKeyUsage=serverAuth
EXT
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout serving.key -out serving.csr 2>/dev/null
    openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile serving.ext -out serving.crt 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=local-admin" -keyout admin.key -out admin.csr 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out admin.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 600 ./*.key
  )
}

write_kubeconfig() {
  cat >"$kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: haltsql-$mode
  cluster:
    server: https://$api_host:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: local-admin
  user:
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: haltsql-$mode
  context: {cluster: haltsql-$mode, user: local-admin}
current-context: haltsql-$mode
KC
}

kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# Service IPs are only allocated here, never routed (kwok has no network);
# the range is in 198.18.0.0/15 like the node's, and a /20 leaves room for
# the large benchmark (1,000 Services).
apiserver_mode_flags=(--service-cluster-ip-range 198.19.64.0/20 --endpoint-reconciler-type none --authorization-mode RBAC)
if [ "$mode" = chaos ]; then
  apiserver_mode_flags+=(--audit-policy-file "$state/audit-policy.yaml" --audit-log-path "$logs/audit.log"
    --audit-log-maxsize 200 --etcd-compaction-interval 10s)
fi
if [ "$mode" = node ]; then
  # shellcheck source=hack/cluster-node.sh
  source "$root/hack/cluster-node.sh"
fi

up() {
  for tool in etcd kube-apiserver kubectl; do
    [ -x "$bin/$tool" ] || { echo "missing $bin/$tool: run 'make tools' first" >&2; exit 1; }
  done
  [ "$mode" = node ] && node_prepare
  mkdir -p "$state" "$logs"
  make_pki
  [ "$mode" = node ] && node_pki
  write_kubeconfig
  if [ "$mode" = chaos ]; then
    # Writes (not reads, not leases, not events) with who made them: the fault
    # suite checks that two operator replicas never write at once.
    cat >"$state/audit-policy.yaml" <<'AUDIT'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}, {group: "", resources: [events]}, {group: events.k8s.io, resources: [events]}]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
AUDIT
  fi
  [ "$mode" = full ] && ln -sfn "full/kubeconfig" "$root/.cluster/kubeconfig"

  start etcd "$bin/etcd" --name "haltsql-$mode" --data-dir "$state/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-cluster "haltsql-$mode=http://127.0.0.1:$((etcd_port + 1))" \
    --unsafe-no-fsync --quota-backend-bytes=8589934592 --log-level=warn
  wait_for "etcd" 60 curl -sf "http://127.0.0.1:$etcd_port/health"

  start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$api_host" --advertise-address "$api_host" --secure-port "$api_port" \
    --cert-dir "$state/apiserver-certs" \
    --tls-cert-file "$pki/serving.crt" --tls-private-key-file "$pki/serving.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    "${apiserver_mode_flags[@]}" \
    --v=1
  wait_for "kube-apiserver /readyz" 120 kubectl get --raw /readyz

  if [ "$mode" = full ] || [ "$mode" = node ] || [ "$mode" = chaos ]; then
    local kcm_extra_flags=()
    read -r -a kcm_extra_flags <<<"${HALTSQL_KCM_EXTRA_FLAGS:-}"
    start kube-controller-manager "$bin/kube-controller-manager" \
      --kubeconfig "$kubeconfig" --authentication-kubeconfig "$kubeconfig" --authorization-kubeconfig "$kubeconfig" \
      --bind-address 127.0.0.1 --secure-port 0 \
      --leader-elect=false --use-service-account-credentials=false \
      --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
      --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
      --controllers '*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle' \
      --concurrent-deployment-syncs 10 --concurrent-replicaset-syncs 10 --concurrent-gc-syncs 20 \
      "${kcm_extra_flags[@]}" --v=1
    start kube-scheduler "$bin/kube-scheduler" \
      --kubeconfig "$kubeconfig" --authentication-kubeconfig "$kubeconfig" --authorization-kubeconfig "$kubeconfig" \
      --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --v=1
  fi
  if [ "$mode" = node ]; then
    node_up
  elif [ "$mode" = full ] || [ "$mode" = chaos ]; then
    local stages=()
    for f in "$bin"/kwok-stages/*.yaml; do stages+=(--config "$f"); done
    start kwok "$bin/kwok" --kubeconfig "$kubeconfig" \
      --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
      --node-ip 127.0.0.1 --node-lease-duration-seconds 40 "${stages[@]}"
    kubectl apply --server-side -f - >/dev/null <<NODE
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: kwok-node-0, kubernetes.io/os: linux, type: kwok}
status:
  allocatable: {cpu: "1000", memory: 4Ti, pods: "5000"}
  capacity: {cpu: "1000", memory: 4Ti, pods: "5000"}
NODE
    wait_for "the kwok node to be Ready" 120 kubectl wait --for=condition=Ready node/kwok-node-0 --timeout=5s
    wait_for "the default ServiceAccount" 120 kubectl -n default get serviceaccount default
  fi
  log "ready: export KUBECONFIG=$kubeconfig"
}

down() {
  if [ "$mode" = node ]; then node_down; return; fi
  local name
  for ((i = ${#components[@]} - 1; i >= 0; i--)); do
    name=${components[$i]}
    if alive "$name"; then
      local pid; pid=$(cat "$state/$name.pid")
      kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$state"
  [ "$mode" = full ] && rm -f "$root/.cluster/kubeconfig"
  rmdir "$root/.cluster" 2>/dev/null || true
  log "stopped"
}

stop_component() { # stop_component NAME [SIGNAL]: stop one component by its recorded pid
  local name=$1 signal=${2:-TERM}
  alive "$name" || { log "$name is not running"; return 0; }
  local pid; pid=$(cat "$state/$name.pid")
  kill "-$signal" "-$pid" 2>/dev/null || kill "-$signal" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do pid_running "$pid" || break; sleep 0.1; done
  if pid_running "$pid"; then kill -KILL "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; fi
  log "$name stopped (SIG$signal)"
}

status() {
  for name in "${components[@]}"; do
    if alive "$name"; then echo "$name: running (pid $(cat "$state/$name.pid"))"; else echo "$name: stopped"; fi
  done
}

case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  stop) [ $# -ge 1 ] || { echo "usage: $0 stop MODE COMPONENT [SIGNAL]" >&2; exit 2; }; stop_component "$@" ;;
  load) [ "$mode" = node ] || { echo "load: only the node mode runs images" >&2; exit 2; }; node_load "$@" ;;
  check-clean) [ "$mode" = node ] || { echo "check-clean: only for the node mode" >&2; exit 2; }; node_check_clean ;;
  *) echo "usage: $0 up|down|status [full|envtest|node] | load node FILE.tar... | check-clean node" >&2; exit 2 ;;
esac
