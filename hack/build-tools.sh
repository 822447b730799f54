#!/usr/bin/env bash
# Builds the local control plane's binaries (Kubernetes with the node's kubelet
# and kube-proxy, etcd, kwok, helm) from
# the pinned Go modules under hack/tools/ and links them into bin/.
#
# Built binaries live in a per-machine cache keyed by each module's go.mod,
# go.sum, build flags and Go version, so a fresh clone links instead of
# rebuilding, and a changed pin rebuilds exactly that tool.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${HALTSQL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/haltsql-operator/tools}"
bin="$root/bin"
mkdir -p "$bin" "$cache"

export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod

# version_ldflags PKG VERSION: the -X flags that make a binary report VERSION.
k8s_version=v1.36.3
k8s_ldflags() {
  local v=$k8s_version major minor
  major=$(echo "${v#v}" | cut -d. -f1)
  minor=$(echo "${v#v}" | cut -d. -f2)
  local flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=2026-01-01T00:00:00Z"
  done
  echo "$flags"
}

# build MODULE_DIR "LDFLAGS" PACKAGE...: builds into the cache (if needed), links into bin/.
build() {
  local module=$1 ldflags=$2; shift 2
  # HALTSQL_TOOLS="a b" builds (and links) only those modules.
  if [ -n "${HALTSQL_TOOLS:-}" ] && [[ " $HALTSQL_TOOLS " != *" $module "* ]]; then return 0; fi
  local dir="$root/hack/tools/$module"
  local key
  key=$( { cat "$dir/go.mod" "$dir/go.sum"; echo "$ldflags"; go version; echo "$*"; } | sha256sum | cut -c1-16)
  local out="$cache/$module-$key"
  if [ ! -f "$out/.complete" ]; then
    echo ">> building $module ($*) into $out" >&2
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp/" "$@")
    # etcd's main package is the server module root, so go names the binary "server".
    if [ -f "$out.tmp/server" ]; then mv "$out.tmp/server" "$out.tmp/etcd"; fi
    touch "$out.tmp/.complete"
    rm -rf "$out"
    mv "$out.tmp" "$out"
  fi
  local f
  for f in "$out"/*; do
    ln -sfn "$f" "$bin/$(basename "$f")"
  done
}

build kubernetes "$(k8s_ldflags)" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy
build etcd "-X go.etcd.io/etcd/api/v3/version.GitSHA=v3.6.8" go.etcd.io/etcd/server/v3
build kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=v0.8.0" sigs.k8s.io/kwok/cmd/kwok
build helm "-X helm.sh/helm/v3/internal/version.version=v3.22.0 -X helm.sh/helm/v3/internal/version.gitTreeState=clean" helm.sh/helm/v3/cmd/helm
# Our own image packer (go-containerregistry): images without Docker or a registry.
build oci-image "" .

# The bundle tests' peers: an OCI registry and the oras client that publishes to it.
build registry "-X github.com/distribution/distribution/v3/version.version=v3.1.2" \
  github.com/distribution/distribution/v3/cmd/registry
build oras "" oras.land/oras/cmd/oras
# The OIDC tests' issuer: oauth2-proxy/mockoidc over HTTPS (hack/tools/oidc).
build oidc "" .
# The gcs audit sink tests' peer.
build fake-gcs "" github.com/fsouza/fake-gcs-server

# kwok's stage definitions ship in its module; the cluster script passes them with --config.
if [ -n "${HALTSQL_TOOLS:-}" ] && [[ " $HALTSQL_TOOLS " != *" kwok "* ]]; then
  echo ">> tools ready in $bin" >&2
  exit 0
fi
kwok_dir=$(cd "$root/hack/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
mkdir -p "$bin/kwok-stages"
for stage in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  cp -f "$kwok_dir/kustomize/stage/$stage" "$bin/kwok-stages/$(basename "$stage")"
done
chmod -R u+w "$bin/kwok-stages"
echo ">> tools ready in $bin" >&2
