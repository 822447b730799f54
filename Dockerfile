# syntax=docker/dockerfile:1
#
# The operator image: the haltsql image plus the operator binary, so that the
# operator validates policies with the same haltsql loader the servers run.
#
#   docker build -f haltsql/Dockerfile -t haltsql:dev .          # the haltsql image
#   docker build --build-arg HALTSQL_IMAGE=haltsql:dev -t haltsql-operator:dev .
#
# Without --build-arg HALTSQL_IMAGE, the haltsql image is built from this
# repository's haltsql crate in the same build (stage haltsql-from-source,
# the same recipe as haltsql/Dockerfile). Pass the image your servers run
# (ideally by digest) to validate with exactly that loader.
#
# The final image runs as uid/gid 65532 and expects a read-only root file
# system with a writable /tmp (see config/manager/manager.yaml).

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG HALTSQL_IMAGE=haltsql-from-source

# --- build the operator -------------------------------------------------------
FROM ${RUST_IMAGE} AS build-operator
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p haltsql-operator --bin haltsql-operator \
 && install -D -m 0755 target/release/haltsql-operator /out/haltsql-operator

# --- the default haltsql image, built from ./haltsql ------------------------------
FROM ${RUST_IMAGE} AS build-haltsql
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p haltsql --bin haltsql \
 && install -D -m 0755 target/release/haltsql /out/haltsql

FROM ${RUNTIME_IMAGE} AS haltsql-from-source
COPY --from=build-haltsql /out/haltsql /usr/local/bin/haltsql
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/haltsql"]

# --- the operator image -----------------------------------------------------------
FROM ${HALTSQL_IMAGE}
COPY --from=build-operator /out/haltsql-operator /usr/local/bin/haltsql-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/haltsql-operator"]
