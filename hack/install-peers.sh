#!/usr/bin/env bash
# Installs the real peers of the bundle and identity tests
# (haltsql/tests/bundle_sources.rs, serve_mtls.rs, serve_oidc.rs) and links them into bin/:
#   registry, oras  the CNCF distribution registry and the oras client (Go modules,
#                   hack/tools/{registry,oras}, built by hack/build-tools.sh)
#   oidc-issuer     a real OIDC issuer (oauth2-proxy/mockoidc, hack/tools/oidc, Go module)
#   curl            the real TLS client of the mTLS tests (Debian package)
#   s3s-fs          an S3 server on a folder (crates.io, cargo install, cached per machine)
#   nginx, openssl, htpasswd   from Debian's packages (nginx-light, openssl, apache2-utils)
# Idempotent: a second run only links.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${HALTSQL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/haltsql-operator/tools}"
bin="$root/bin"
mkdir -p "$bin" "$cache"

HALTSQL_TOOLS="registry oras oidc" "$root/hack/build-tools.sh"

s3s_version=0.14.1
s3s_dir="$cache/s3s-fs-$s3s_version"
if [ ! -x "$s3s_dir/bin/s3s-fs" ]; then
  echo ">> building s3s-fs $s3s_version into $s3s_dir" >&2
  rm -rf "$s3s_dir.tmp"
  cargo install --quiet --locked s3s-fs --version "$s3s_version" --features binary \
    --root "$s3s_dir.tmp" --target-dir "$cache/s3s-fs-build"
  rm -rf "$s3s_dir" "$cache/s3s-fs-build"
  mv "$s3s_dir.tmp" "$s3s_dir"
fi
ln -sfn "$s3s_dir/bin/s3s-fs" "$bin/s3s-fs"

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v openssl >/dev/null || missing+=(openssl)
command -v htpasswd >/dev/null || missing+=(apache2-utils)
command -v curl >/dev/null || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  echo ">> apt-get install ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
ln -sfn "$nginx_bin" "$bin/nginx"
ln -sfn "$(command -v htpasswd)" "$bin/htpasswd"
ln -sfn "$(command -v openssl)" "$bin/openssl"
ln -sfn "$(command -v curl)" "$bin/curl"
echo ">> bundle test peers ready in $bin" >&2
