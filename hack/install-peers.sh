#!/usr/bin/env bash
# Installs the real peers of the bundle, identity and audit sink tests
# (haltsql/tests/bundle_sources.rs, serve_identity.rs, serve_reload.rs, audit_sinks.rs)
# and links them into bin/:
#   registry, oras  the CNCF distribution registry and the oras client (Go modules,
#                   hack/tools/{registry,oras}, built by hack/build-tools.sh)
#   oidc-issuer     a real OIDC issuer (oauth2-proxy/mockoidc, hack/tools/oidc, Go module)
#   curl            the real TLS client of the mTLS tests (Debian package)
#   fake-gcs-server a GCS JSON API server (Go module, hack/tools/fake-gcs)
#   s3s-fs          an S3 server on a folder (crates.io, cargo install, cached per machine)
#   kafka-libs/     Apache Kafka (the broker's jars from Maven Central, hack/tools/kafka/pom.xml,
#                   fetched with the machine's Maven; run on its Java 17)
#   opensearch-node/  OpenSearch (jars from Maven Central, hack/tools/opensearch/pom.xml) and
#                   the class that starts one node (compiled with the machine's javac)
#   nginx, openssl, htpasswd   from Debian's packages (nginx-light, openssl, apache2-utils)
# Idempotent: a second run only links.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${HALTSQL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/haltsql-operator/tools}"
bin="$root/bin"
mkdir -p "$bin" "$cache"

HALTSQL_TOOLS="registry oras oidc fake-gcs" "$root/hack/build-tools.sh"

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
# Kafka and OpenSearch run on Java 17 (and are fetched with Maven).
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
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
# Kafka: the jars of kafka_2.13 and its runtime dependencies, keyed by the pom.
kafka_pom="$root/hack/tools/kafka/pom.xml"
kafka_dir="$cache/kafka-$(sha256sum "$kafka_pom" | cut -c1-16)"
if [ ! -f "$kafka_dir/.complete" ]; then
  echo ">> fetching the Kafka broker's jars into $kafka_dir" >&2
  rm -rf "$kafka_dir.tmp"
  (cd "$root/hack/tools/kafka" && mvn -B -q -Dstyle.color=never dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$kafka_dir.tmp/libs")
  touch "$kafka_dir.tmp/.complete"
  rm -rf "$kafka_dir"
  mv "$kafka_dir.tmp" "$kafka_dir"
fi
ln -sfn "$kafka_dir/libs" "$bin/kafka-libs"

# OpenSearch: its jars plus our starter class, keyed by the pom and the source.
os_src="$root/hack/tools/opensearch"
os_dir="$cache/opensearch-$(cat "$os_src/pom.xml" "$os_src"/src/main/java/dev/haltsql/peers/*.java | sha256sum | cut -c1-16)"
if [ ! -f "$os_dir/.complete" ]; then
  echo ">> fetching OpenSearch's jars into $os_dir" >&2
  rm -rf "$os_dir.tmp"
  (cd "$os_src" && mvn -B -q -Dstyle.color=never dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$os_dir.tmp/libs")
  javac -nowarn -d "$os_dir.tmp/classes" -cp "$os_dir.tmp/libs/*" \
    "$os_src"/src/main/java/dev/haltsql/peers/*.java
  touch "$os_dir.tmp/.complete"
  rm -rf "$os_dir"
  mv "$os_dir.tmp" "$os_dir"
fi
ln -sfn "$os_dir" "$bin/opensearch-node"

echo ">> bundle, identity and audit sink test peers ready in $bin" >&2
