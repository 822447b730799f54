# shellcheck shell=bash
# The `node` mode of hack/cluster.sh (sourced by it): a real node beside the
# control plane, as Kubernetes' hack/local-up-cluster.sh runs one. containerd
# (Debian's, with its own config, root, state and socket under .cluster/node/),
# kubelet and kube-proxy (built by hack/build-tools.sh), the Debian CNI bridge
# plugin. Needs root and cgroups; hack/node-deps.sh installs the packages.
#
# The interface the tests and the end-to-end scenario rely on:
#   node name        haltsql-node-0, InternalIP 198.19.0.1 (a /32 on lo)
#   API server       https://198.19.0.1:32443 (+ HALTSQL_CLUSTER_PORT_OFFSET)
#   Service CIDR     198.19.128.0/24 (kubernetes Service: 198.19.128.1:443)
#   pod CIDR         198.18.0.0/24 on the bridge haltsql0 (gateway 198.18.0.1)
#   sandbox image    haltsql.local/pause:3.10 (built from hack/pause/pause.c)
#   images           hack/cluster.sh load node FILE.tar... (imagePullPolicy: IfNotPresent)
#
# Only one node runs per machine: the kubelet and the CNI plugins use a few
# fixed host paths (node_host_paths), and the node owns the cgroup
# /haltsql-node, the bridge and the lo address. Host changes are undone by
# `down`, and also by the next `up` when a run was killed without `down`.

node_name=haltsql-node-0
node_ip=198.19.0.1
service_cidr=198.19.128.0/24
service_ip=198.19.128.1
pod_cidr=198.18.0.0/24
pod_gateway=198.18.0.1
bridge=haltsql0
cgroup_root=haltsql-node
pause_image=haltsql.local/pause:3.10
kubelet_port=$((32250 + offset))
kubelet_healthz_port=$((32248 + offset))
proxy_metrics_port=$((32249 + offset))
proxy_healthz_port=$((32256 + offset))

api_host=$node_ip
extra_sans=",IP:$node_ip,IP:$service_ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc.cluster.local"
apiserver_mode_flags=(
  --service-cluster-ip-range "$service_cidr"
  # NodePorts stay below the node's own ports (32248-32443).
  --service-node-port-range 30000-31999
  --endpoint-reconciler-type lease
  --authorization-mode Node,RBAC
  # The hostname resolves to 127.0.0.1 here; the node's address is on lo.
  --kubelet-preferred-address-types InternalIP
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt"
  --kubelet-client-key "$pki/apiserver-kubelet-client.key"
  --kubelet-certificate-authority "$pki/ca.crt"
)

ctrd_dir="$state/containerd"
ctrd_sock="$ctrd_dir/containerd.sock"
kubelet_dir="$state/kubelet"
cni_dir="$state/cni"
# Paths outside .cluster/ that the kubelet, containerd's shims and the CNI
# library use whatever their configuration says. `up` records which of them
# did not exist before (state/host-paths) and the teardown removes exactly those.
node_host_paths=(/var/lib/kubelet /var/lib/cni /var/log/containers /var/log/pods /run/containerd)
# Those paths, the node's address and the bridge are the machine's: one node
# per machine. The checkout whose node holds them is named here.
node_owner_file=/run/haltsql-operator-node.owner

# Refuses to start while another checkout's node runs; else names this one.
claim_node() {
  local other name pid
  other=$(cat "$node_owner_file" 2>/dev/null || true)
  if [ -n "$other" ] && [ "$other" != "$state" ]; then
    for name in "${components[@]}"; do
      pid=$(cat "$other/$name.pid" 2>/dev/null || true)
      if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        echo "the node of another checkout is running ($other, $name pid $pid): one node per machine;" \
          "stop it first: (cd '${other%/.cluster/node}' && hack/cluster.sh down node)" >&2
        exit 1
      fi
    done
  fi
  echo "$state" >"$node_owner_file"
}

release_node() {
  if [ "$(cat "$node_owner_file" 2>/dev/null)" = "$state" ]; then rm -f "$node_owner_file"; fi
}

# Host settings the kubelet, kube-proxy and the bridge plugin change; saved at
# the first `up` and restored by the teardown.
node_sysctls=(net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.conf.all.route_localnet)

ctr() { command ctr --address "$ctrd_sock" -n k8s.io "$@"; }

# owned PID EXE...: PID is alive and runs one of the given executables (so a
# recorded pid that the kernel reused for something else is never signalled).
owned() {
  local pid=$1 exe; shift
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=${exe% (deleted)}
  local want
  for want in "$@"; do [ "$exe" = "$(readlink -f "$want")" ] && return 0; done
  return 1
}

component_exe() { # the executable a component's recorded pid must run
  case "$1" in
    containerd) command -v containerd ;;
    *) echo "$bin/$1" ;;
  esac
}

# node_alive NAME: the recorded process runs and is really that component.
node_alive() {
  local pidfile="$state/$1.pid"
  [ -f "$pidfile" ] && owned "$(cat "$pidfile")" "$(component_exe "$1")"
}

kill_pid() { # kill_pid PID SIGNAL: the process group it leads, else the process
  kill "-$2" "-$1" 2>/dev/null || kill "-$2" "$1" 2>/dev/null || true
}

stop_component() { # stop_component NAME: TERM, wait up to 5 s, then KILL
  local name=$1 pid
  node_alive "$name" || return 0
  pid=$(cat "$state/$name.pid")
  kill_pid "$pid" TERM
  for _ in $(seq 1 50); do owned "$pid" "$(component_exe "$name")" || return 0; sleep 0.1; done
  kill_pid "$pid" KILL
}

cgroup_v2() { [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; }

cgroup_dirs() { # the node's cgroup root in every hierarchy (v1) or the unified one (v2)
  local d
  if cgroup_v2; then
    d=/sys/fs/cgroup/$cgroup_root
    [ -d "$d" ] && echo "$d"
    return 0
  fi
  for d in /sys/fs/cgroup/*/"$cgroup_root"; do
    [ -d "$d" ] && echo "$d"
  done
}

cgroup_pids() { # pids of every process in the node's cgroups
  local d
  for d in $(cgroup_dirs); do
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

in_our_cgroup() { grep -q ":/$cgroup_root/" "/proc/$1/cgroup" 2>/dev/null; }

# Kills containerd's shims and every process in the node's cgroups (the
# containers and sandboxes): after a killed run they outlive containerd and the
# kubelet. A shim is ours when it runs the shim binary in a bundle directory
# under our containerd state (its shim.pid may be gone with a stopped sandbox).
kill_workloads() {
  local pid shim cwd
  shim=$(command -v containerd-shim-runc-v2 || echo /usr/bin/containerd-shim-runc-v2)
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    owned "$pid" "$shim" || continue
    cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || continue
    if [[ $cwd == "$ctrd_dir/state/"* ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  for _ in $(seq 1 50); do
    local left=0
    for pid in $(cgroup_pids); do
      in_our_cgroup "$pid" || continue
      left=1
      kill -KILL "$pid" 2>/dev/null || true
    done
    [ $left = 0 ] && return 0
    sleep 0.1
  done
  log "processes left in the node's cgroups: $(cgroup_pids | tr '\n' ' ')"
}

our_mounts() { # mount points under the node's paths, deepest first
  local prefixes=("$state/" /var/lib/kubelet/ /run/containerd/)
  awk '{print $5}' /proc/self/mountinfo | while IFS= read -r m; do
    m=$(printf '%b' "$m") # mountinfo escapes blanks as \040
    for p in "${prefixes[@]}"; do
      if [[ "$m/" == "$p"* ]]; then echo "$m"; break; fi
    done
  done | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-
}

unmount_all() {
  local m
  for _ in 1 2 3; do
    local any=0
    while IFS= read -r m; do
      [ -n "$m" ] || continue
      any=1
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(our_mounts)
    [ $any = 0 ] && return 0
  done
}

# remove_chains IPTABLES: deletes every KUBE-* and HALTSQL-* chain (kubelet,
# kube-proxy and ours) in every table, after the rules that jump to them.
remove_chains() {
  local ipt=$1 table chain rule
  command -v "$ipt" >/dev/null || return 0
  for table in filter nat mangle raw; do
    "$ipt" -t "$table" -S >/dev/null 2>&1 || continue
    while IFS= read -r rule; do
      # shellcheck disable=SC2086 # a rule from -S is a list of words
      "$ipt" -t "$table" ${rule/-A /-D } 2>/dev/null || true
    done < <("$ipt" -t "$table" -S | grep -E '^-A ' | grep -E -- '-j (KUBE|HALTSQL)-' | grep -vE '^-A (KUBE|HALTSQL)-')
    for chain in $("$ipt" -t "$table" -S | awk '/^-N (KUBE|HALTSQL)-/ {print $2}'); do
      "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $("$ipt" -t "$table" -S | awk '/^-N (KUBE|HALTSQL)-/ {print $2}'); do
      "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

# iptables-nft creates its tables on first use; the ones that did not exist
# before the node and hold no rule any more are deleted.
remove_new_nft_tables() {
  command -v nft >/dev/null && [ -f "$state/host-nft-tables" ] || return 0
  local family name
  while read -r _ family name; do
    grep -qx "table $family $name" "$state/host-nft-tables" && continue
    nft -j list table "$family" "$name" 2>/dev/null | grep -q '"rule"' && continue
    nft delete table "$family" "$name" 2>/dev/null || true
  done < <(nft list tables 2>/dev/null)
}

restore_sysctls() {
  [ -f "$state/host-sysctls" ] || return 0
  local key value
  while read -r key value; do
    sysctl -qw "$key=$value" >/dev/null 2>&1 || true
  done <"$state/host-sysctls"
}

# Undoes everything a node run did to the host, whether it ended with `down`
# or was killed: processes, mounts, network, rules, cgroups, host paths.
node_teardown() {
  local name
  for ((i = ${#components[@]} - 1; i >= 0; i--)); do stop_component "${components[$i]}"; done
  kill_workloads
  unmount_all
  # Veths whose pod netns is gone disappear with it; the rest are removed here.
  local link
  for link in $(ip -o link show master "$bridge" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  ip addr del "$node_ip/32" dev lo 2>/dev/null || true
  if [ -x "$bin/kube-proxy" ]; then "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  remove_chains iptables
  remove_chains ip6tables
  remove_new_nft_tables
  local d
  for d in $(cgroup_dirs); do
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  if [ -f "$state/host-paths" ]; then
    while IFS= read -r d; do
      [ -n "$d" ] && rm -rf "$d"
    done <"$state/host-paths"
  fi
  restore_sysctls
  rm -rf "$state"
}

# Called by `up` before anything starts: a complete running node is left as it
# is; anything else (a killed run's leftovers) is torn down first.
node_prepare() {
  [ "$(id -u)" -eq 0 ] || { echo "the node mode needs root" >&2; exit 1; }
  "$root/hack/node-deps.sh"
  local tool
  for tool in kubelet kube-proxy kube-controller-manager kube-scheduler; do
    [ -x "$bin/$tool" ] || { echo "missing $bin/$tool: run 'make tools' first" >&2; exit 1; }
  done
  claim_node
  if [ -d "$state" ]; then
    local all=1
    for name in "${components[@]}"; do node_alive "$name" || all=0; done
    if [ $all = 1 ]; then return 0; fi
    log "cleaning up after a run that ended without 'down'"
    node_teardown
  fi
  mkdir -p "$state"
  local p
  for p in "${node_host_paths[@]}"; do [ -e "$p" ] || echo "$p"; done >"$state/host-paths"
  for p in "${node_sysctls[@]}"; do
    printf '%s %s\n' "$p" "$(sysctl -n "$p" 2>/dev/null)"
  done | awk 'NF == 2' >"$state/host-sysctls"
  if command -v nft >/dev/null; then nft list tables >"$state/host-nft-tables" 2>/dev/null || true; fi
  ip addr add "$node_ip/32" dev lo 2>/dev/null || ip addr show dev lo | grep -q " $node_ip/32 "
}

node_cert() { # node_cert NAME SUBJECT EXT: a key and a CA-signed cert in pki/
  local name=$1 subject=$2 ext=$3
  [ -f "$pki/$name.crt" ] && return 0
  (
    cd "$pki"
    printf '%b\n' "$ext" >"$name.ext"
    openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$name.key" -out "$name.csr" 2>/dev/null
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile "$name.ext" -out "$name.crt" 2>/dev/null
    chmod 600 "$name.key"
  )
}

node_pki() {
  node_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" 'extendedKeyUsage=clientAuth'
  node_cert kubelet-client "/O=system:nodes/CN=system:node:$node_name" 'extendedKeyUsage=clientAuth'
  node_cert kubelet-serving "/O=system:nodes/CN=system:node:$node_name" \
    "subjectAltName=IP:$node_ip,DNS:$node_name\nextendedKeyUsage=serverAuth"
  node_cert kube-proxy "/CN=system:kube-proxy" 'extendedKeyUsage=clientAuth'
}

# write_file PATH < CONTENT: replaces PATH only when the content differs, since
# kube-proxy exits when its configuration file changes.
write_file() {
  local tmp="$1.tmp"
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

component_kubeconfig() { # component_kubeconfig CERT: a kubeconfig for that client cert
  cat <<KC
apiVersion: v1
kind: Config
clusters:
- name: haltsql-node
  cluster: {server: "https://$node_ip:$api_port", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: haltsql-node
  context: {cluster: haltsql-node, user: $1}
current-context: haltsql-node
KC
}

write_containerd_config() {
  mkdir -p "$ctrd_dir" "$cni_dir/net.d"
  write_file "$ctrd_dir/config.toml" <<TOML
version = 2
root = "$ctrd_dir/root"
state = "$ctrd_dir/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$ctrd_sock"
[ttrpc]
  address = "$ctrd_dir/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$ctrd_dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below ours.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$ctrd_dir/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$cni_dir/net.d"
    max_conf_num = 1
TOML
  # No ipMasq: pods reach the node and each other, nothing beyond the machine.
  write_file "$cni_dir/net.d/10-haltsql.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "haltsql-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$cni_dir/ipam",
        "ranges": [[{"subnet": "$pod_cidr", "gateway": "$pod_gateway"}]]
      }
    }
  ]
}
JSON
}

write_kubelet_config() {
  mkdir -p "$kubelet_dir" "$state/pod-logs"
  component_kubeconfig kubelet-client | write_file "$state/kubelet.kubeconfig"
  write_file "$state/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $kubelet_healthz_port
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
  webhook: {enabled: true}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$ctrd_sock
imageServiceEndpoint: unix://$ctrd_sock
cgroupDriver: cgroupfs
cgroupRoot: /$cgroup_root
# This machine kind has cgroup v1 and may have swap.
failCgroupV1: false
failSwapOn: false
podLogsDir: $state/pod-logs
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
registerNode: true
maxPods: 110
serializeImagePulls: false
imageMinimumGCAge: 24h
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
# The first status is NotReady (no pod sync yet): report again soon.
nodeStatusUpdateFrequency: 3s
nodeStatusReportFrequency: 10s
shutdownGracePeriod: 0s
YAML
}

write_proxy_config() {
  component_kubeconfig kube-proxy | write_file "$state/kube-proxy.kubeconfig"
  write_file "$state/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $state/kube-proxy.kubeconfig}
hostnameOverride: $node_name
bindAddress: $node_ip
clusterCIDR: $pod_cidr
mode: iptables
healthzBindAddress: 127.0.0.1:$proxy_healthz_port
metricsBindAddress: 127.0.0.1:$proxy_metrics_port
nodePortAddresses: ["$node_ip/32"]
iptables:
  # Service traffic from a pod back to a pod on the same bridge must return
  # through the host; and localhost NodePorts would need route_localnet.
  masqueradeAll: true
  localhostNodePorts: false
conntrack:
  # Leave the host's conntrack sysctls alone.
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
YAML
}

# The sandbox image: a static pause binary of our own, packed by bin/oci-image.
build_pause_image() {
  local out="$state/images/pause.tar"
  [ -f "$out" ] && { echo "$out"; return 0; }
  mkdir -p "$state/images"
  [ -x "$bin/oci-image" ] || { echo "missing $bin/oci-image: run 'make tools' first" >&2; return 1; }
  gcc -static -Os -Wall -Wextra -o "$state/images/pause" "$root/hack/pause/pause.c"
  "$bin/oci-image" --out "$out.tmp" --tag "$pause_image" --entrypoint /pause --user 65535:65535 \
    --label org.opencontainers.image.title=haltsql-pause --file "$state/images/pause:/pause:0755" >&2
  mv "$out.tmp" "$out"
  echo "$out"
}

node_up() {
  write_containerd_config
  write_kubelet_config
  write_proxy_config
  # The kubelet wants its cgroup root to exist in every hierarchy; a new v1
  # cpuset starts with no CPUs, so it inherits the root's.
  if cgroup_v2; then
    mkdir -p /sys/fs/cgroup/"$cgroup_root"
  else
    local d
    for d in /sys/fs/cgroup/*/; do
      [ "$(basename "$d")" = unified ] && continue
      if [ -f "$d/cgroup.procs" ]; then mkdir -p "$d/$cgroup_root"; fi
    done
    if [ -d /sys/fs/cgroup/cpuset/"$cgroup_root" ]; then
      cat /sys/fs/cgroup/cpuset/cpuset.cpus >/sys/fs/cgroup/cpuset/"$cgroup_root"/cpuset.cpus
      cat /sys/fs/cgroup/cpuset/cpuset.mems >/sys/fs/cgroup/cpuset/"$cgroup_root"/cpuset.mems
    fi
  fi

  start containerd containerd --config "$ctrd_dir/config.toml"
  wait_for "containerd" 60 ctr version
  local pause_tar
  pause_tar=$(build_pause_image)
  ctr images ls -q | grep -qx "$pause_image" || ctr images import "$pause_tar" >/dev/null

  start kubelet "$bin/kubelet" --config "$state/kubelet.yaml" --kubeconfig "$state/kubelet.kubeconfig" \
    --root-dir "$kubelet_dir" --hostname-override "$node_name" --node-ip "$node_ip" --v=1
  start kube-proxy "$bin/kube-proxy" --config "$state/kube-proxy.yaml" --v=1
  # Pods must not send anything beyond this machine: only the bridge itself
  # may be the way out of the bridge (the node's own addresses are INPUT).
  if ! iptables -S HALTSQL-NODE-EGRESS >/dev/null 2>&1; then
    iptables -N HALTSQL-NODE-EGRESS
    iptables -A HALTSQL-NODE-EGRESS -i "$bridge" ! -o "$bridge" -j DROP
    iptables -I FORWARD 1 -j HALTSQL-NODE-EGRESS
  fi
  # kube-proxy's healthz answers 200 once it has programmed the Services.
  wait_for "kube-proxy's first sync" 120 curl -sf "http://127.0.0.1:$proxy_healthz_port/healthz"
  wait_for "the node $node_name to be Ready" 180 kubectl wait --for=condition=Ready "node/$node_name" --timeout=5s
  wait_for "the default ServiceAccount" 120 kubectl -n default get serviceaccount default
}

node_down() {
  # Every host change of a node run comes after its state directory exists.
  if [ ! -d "$state" ]; then log "not running"; return 0; fi
  if node_alive kube-apiserver && node_alive kubelet && node_alive containerd; then
    # Let the kubelet stop the pods (CNI DEL removes their veths): first stop
    # the controllers that would replace them.
    stop_component kube-controller-manager
    stop_component kube-scheduler
    kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 30))
    while [ $SECONDS -lt $deadline ]; do
      [ -z "$(ctr tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING"')" ] && break
      sleep 0.5
    done
  fi
  node_teardown
  release_node
  rmdir "$root/.cluster" 2>/dev/null || true
  log "stopped"
}

node_load() {
  [ $# -gt 0 ] || { echo "usage: hack/cluster.sh load node FILE.tar..." >&2; exit 2; }
  node_alive containerd || { echo "the node is not running: hack/cluster.sh up node" >&2; exit 1; }
  local f
  for f in "$@"; do
    ctr images import "$f"
  done
}

# Lists everything of a node run that is still on the host; fails if anything is.
node_check_clean() {
  local found=0
  report() { echo "left: $*"; found=1; }
  local pid exe cmdline
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
    case "$(basename "${exe% (deleted)}")" in
      kubelet | kube-proxy | containerd | containerd-shim-runc-v2 | runc)
        report "process $pid: $cmdline" ;;
      *)
        if [[ $cmdline == *"$state/"* ]] || in_our_cgroup "$pid"; then report "process $pid: $cmdline"; fi ;;
    esac
  done
  local m
  while IFS= read -r m; do [ -n "$m" ] && report "mount $m"; done < <(our_mounts)
  ip link show "$bridge" >/dev/null 2>&1 && report "bridge $bridge"
  while IFS= read -r m; do [ -n "$m" ] && report "veth $m"; done < <(ip -o link show type veth 2>/dev/null | awk -F': ' '{print $2}')
  ip -o addr show dev lo | grep -q " $node_ip/" && report "address $node_ip on lo"
  [ -f "$node_owner_file" ] && report "owner file $node_owner_file ($(cat "$node_owner_file"))"
  local ipt
  for ipt in iptables ip6tables; do
    command -v "$ipt-save" >/dev/null || continue
    while IFS= read -r m; do [ -n "$m" ] && report "$ipt chain $m"; done < <("$ipt-save" 2>/dev/null | grep -oE '^:(KUBE|HALTSQL|CNI)-[^ ]+' | tr -d :)
  done
  if command -v nft >/dev/null; then
    while IFS= read -r m; do [ -n "$m" ] && report "nft $m"; done < <(nft list tables 2>/dev/null | grep -E 'kube-proxy|cni')
  fi
  while IFS= read -r m; do [ -n "$m" ] && report "cgroup $m"; done < <(cgroup_dirs)
  for m in "${node_host_paths[@]}"; do [ -e "$m" ] && report "path $m"; done
  [ -d "$state" ] && report "state $state"
  if [ $found = 0 ]; then echo "clean: no process, mount, link, address, rule, cgroup or path of the node is left"; fi
  return $found
}
