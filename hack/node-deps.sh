#!/usr/bin/env bash
# Installs with apt what the `node` cluster mode needs beside the binaries that
# hack/build-tools.sh builds: containerd, runc, the CNI plugins, the netfilter
# tools kube-proxy and the bridge plugin call, and gcc for the pause binary.
# Fast when everything is present: apt runs only when a command is missing.
set -euo pipefail

# command -> Debian package that provides it
declare -A need=(
  [containerd]=containerd
  [ctr]=containerd
  [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins
  [/usr/lib/cni/host-local]=containernetworking-plugins
  [/usr/lib/cni/loopback]=containernetworking-plugins
  [/usr/lib/cni/portmap]=containernetworking-plugins
  [iptables]=iptables
  [ip6tables]=iptables
  [iptables-save]=iptables
  [conntrack]=conntrack
  [nft]=nftables
  [ip]=iproute2
  [mount]=mount
  [findmnt]=util-linux
  [nsenter]=util-linux
  [gcc]=gcc
  [openssl]=openssl
  [curl]=curl
)

missing=()
for cmd in "${!need[@]}"; do
  if [[ $cmd == /* ]]; then
    [ -x "$cmd" ] && continue
  else
    command -v "$cmd" >/dev/null 2>&1 && continue
    # sbin tools are not on every PATH (e.g. a non-login shell of a user).
    [ -x "/usr/sbin/$cmd" ] || [ -x "/sbin/$cmd" ] && continue
  fi
  missing+=("${need[$cmd]}")
done
# gcc alone does not link static binaries: libc6-dev brings libc.a.
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -f /usr/lib/aarch64-linux-gnu/libc.a ] || missing+=(libc6-dev)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
  echo "node dependencies missing (${missing[*]}); run hack/node-deps.sh as root" >&2
  exit 1
fi
echo ">> installing node dependencies: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
