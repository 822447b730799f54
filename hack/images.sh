#!/usr/bin/env bash
# `make images`: the haltsql image and the operator image as image archives,
# without Docker or a registry, from this workspace's release binaries.
#
# The images mirror the Dockerfiles (tests/integration/manifests_docker.rs checks that
# they agree): the distroless "cc" layout (glibc and libgcc from this Debian
# machine, CA certificates, a passwd entry for the nonroot user 65532), the
# binaries in /usr/local/bin, user 65532:65532, the same entrypoints. The
# operator image holds the operator and the haltsql CLI it validates with.
#
#   HALTSQL_IMG  (haltsql.local/haltsql:dev)           tag of the haltsql image
#   IMG          (haltsql.local/haltsql-operator:dev)  tag of the operator image
#   IMAGES_DIR   (.cache/images)                       where the archives go
#   IMAGES_PROFILE (release)                           cargo profile of the binaries
#                (`dev` packs debug builds: quicker to rebuild while experimenting)
#
# `hack/cluster.sh load node ARCHIVE...` imports them into the node's containerd.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

haltsql_img=${HALTSQL_IMG:-haltsql.local/haltsql:dev}
operator_img=${IMG:-haltsql.local/haltsql-operator:dev}
out=${IMAGES_DIR:-$root/.cache/images}
target=${CARGO_TARGET_DIR:-$root/target}
oci_image="$root/bin/oci-image"
[ -x "$oci_image" ] || { echo "missing $oci_image: run 'make tools' first" >&2; exit 1; }

profile=${IMAGES_PROFILE:-release}
profile_dir=$profile
[ "$profile" = dev ] && profile_dir=debug
echo ">> cargo build --profile $profile (haltsql, haltsql-operator)" >&2
cargo build --locked --profile "$profile" --quiet -p haltsql --bin haltsql -p haltsql-operator --bin haltsql-operator
haltsql="$target/$profile_dir/haltsql"
operator="$target/$profile_dir/haltsql-operator"

mkdir -p "$out"
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The runtime files of the distroless cc base: the shared libraries the two
# binaries load (as ldd resolves them here), certificates and the user database.
runtime=()
# (ldd of two files heads each list with "FILE:"; those lines are skipped.)
for lib in $(ldd "$haltsql" "$operator" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u); do
  real=$(readlink -f "$lib")
  # Kept under the name the binary asks for (the loader's /lib64 path included).
  runtime+=(--file "$real:$lib:0755")
done
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$work/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$work/group"
runtime+=(--file "$work/passwd:/etc/passwd:0644" --file "$work/group:/etc/group:0644"
          --dir /tmp:1777 --dir /home/nonroot:0700)
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  runtime+=(--file /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:0644)
fi
version=$(awk -F'"' '/^version = / {print $2; exit}' Cargo.toml)
labels=(--label "org.opencontainers.image.version=$version"
        --label "org.opencontainers.image.licenses=Apache-2.0")

echo ">> $out/haltsql.tar ($haltsql_img)" >&2
"$oci_image" --out "$out/haltsql.tar" --tag "$haltsql_img" "${runtime[@]}" "${labels[@]}" \
  --label org.opencontainers.image.title=haltsql \
  --user 65532:65532 --entrypoint /usr/local/bin/haltsql --cmd --help \
  --file "$haltsql:/usr/local/bin/haltsql:0755"

echo ">> $out/haltsql-operator.tar ($operator_img)" >&2
"$oci_image" --out "$out/haltsql-operator.tar" --tag "$operator_img" "${runtime[@]}" "${labels[@]}" \
  --label org.opencontainers.image.title=haltsql-operator \
  --user 65532:65532 --entrypoint /usr/local/bin/haltsql-operator \
  --file "$haltsql:/usr/local/bin/haltsql:0755" \
  --file "$operator:/usr/local/bin/haltsql-operator:0755"
printf '%s\n' "$haltsql_img" >"$out/haltsql.tag"
printf '%s\n' "$operator_img" >"$out/haltsql-operator.tag"
