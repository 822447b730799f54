# haltsql-operator: see README.md. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN := $(ROOT)/bin
CARGO ?= cargo
# kubectl for install-manifests: KUBECTL=... if given, else bin/kubectl, else the one on PATH.
KUBECTL ?=
IMG ?= haltsql-operator:dev

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

.PHONY: tools
tools: ## Build kube-apiserver, controller-manager, scheduler, kubectl, kubelet, kube-proxy, etcd, kwok and helm from Go modules into bin/.
	hack/build-tools.sh

.PHONY: peers
peers: ## Build or install the bundle and audit sink tests' peers (registry, oras, s3s-fs, nginx, fake-gcs-server, Kafka, OpenSearch) into bin/.
	hack/install-peers.sh

.PHONY: build
build: ## Build the operator and the haltsql CLI (debug).
	$(CARGO) build --workspace --bins

.PHONY: manifests
manifests: ## Regenerate the CRDs and the ClusterRole from the Rust types.
	$(CARGO) run --quiet --bin crdgen

.PHONY: generate
generate: manifests ## Alias of manifests (no other generated code).

.PHONY: install-manifests
install-manifests: ## Print config/default (CRDs, RBAC, operator) with the image set to IMG (needs kubectl: bin/kubectl or on PATH).
	@kubectl="$(KUBECTL)"; \
	if [ -z "$$kubectl" ]; then \
	  if [ -x "$(BIN)/kubectl" ]; then kubectl="$(BIN)/kubectl"; \
	  elif command -v kubectl >/dev/null 2>&1; then kubectl="$$(command -v kubectl)"; \
	  else echo "make install-manifests: kubectl not found: install kubectl and put it on PATH, or run 'make tools' to build bin/kubectl" >&2; exit 1; fi; \
	fi; \
	mkdir -p "$(ROOT)/.cache"; tmp="$$(mktemp -d "$(ROOT)/.cache/install-manifests.XXXXXX")"; \
	trap 'rm -rf "$$tmp"' EXIT; \
	mkdir "$$tmp/overlay"; \
	printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization' \
	  'resources:' '- ../../../config/default' 'images:' '- name: controller' '  newName: "$(IMG)"' \
	  > "$$tmp/overlay/kustomization.yaml"; \
	if ! "$$kubectl" kustomize "$$tmp/overlay" > "$$tmp/out.yaml"; then \
	  echo "make install-manifests: $$kubectl kustomize failed; nothing printed" >&2; exit 1; \
	fi; \
	cat "$$tmp/out.yaml"

HALTSQL_IMG ?= haltsql:dev

.PHONY: images
images: tools ## Build the haltsql and operator images as archives in .cache/images (no Docker needed).
	hack/images.sh

.PHONY: docker-build-haltsql
docker-build-haltsql: ## Build the haltsql image HALTSQL_IMG from ./haltsql (needs Docker).
	docker build -f haltsql/Dockerfile -t "$(HALTSQL_IMG)" .

.PHONY: docker-build
docker-build: ## Build the operator image IMG on top of the haltsql image HALTSQL_IMG (needs Docker).
	docker build --build-arg HALTSQL_IMAGE="$(HALTSQL_IMG)" -t "$(IMG)" .

.PHONY: cluster-up
cluster-up: tools ## Start the full local cluster (kubeconfig: .cluster/kubeconfig).
	hack/cluster.sh up full

.PHONY: cluster-up-envtest
cluster-up-envtest: tools ## Start etcd + kube-apiserver only (kubeconfig: .cluster/envtest/kubeconfig).
	hack/cluster.sh up envtest

.PHONY: cluster-up-node
cluster-up-node: tools ## Start the control plane with a real node (root; kubeconfig: .cluster/node/kubeconfig).
	hack/cluster.sh up node

.PHONY: cluster-down
cluster-down: ## Stop every local cluster (full, envtest, node) and remove their state.
	hack/cluster.sh down full
	hack/cluster.sh down envtest
	hack/cluster.sh down node

.PHONY: cluster-check-clean
cluster-check-clean: ## Fail if a node run left a process, mount, interface, rule or cgroup behind.
	hack/cluster.sh check-clean node

.PHONY: lint
lint: ## cargo fmt --check and clippy with warnings as errors.
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: bench
bench: tools ## Benchmarks on the local cluster: table on stdout, target/bench/results.json (BENCH_SCALE=small: a few minutes).
	hack/bench.sh

.PHONY: loadtest
loadtest: ## haltsql serve under slow connections and 16 MiB bodies while wrk measures good clients (loopback, ~1 min; installs wrk with apt when missing).
	hack/loadtest.sh

.PHONY: verify-bench
verify-bench: ## Verify throughput of a real haltsql serve under wrk at 4 connections (decisions/s, p50/p99, load average; ~1 min; installs wrk with apt when missing).
	hack/verify-bench.sh

.PHONY: test
test: tools ## Build everything, start the local clusters, run every test tier, stop the clusters.
	hack/test.sh

.PHONY: chaos
chaos: tools ## The fault suite: operator kills, API server and etcd restarts, validator faults, with invariants checked all along (own cluster; tables on stdout).
	hack/chaos.sh

.PHONY: fuzz
fuzz: ## The verify engine for longer: PostgreSQL oracle with FUZZ_QUERIES SQLsmith queries (20000), property tests with FUZZ_CASES cases (20000).
	hack/fuzz.sh

.PHONY: demo
demo: ## Local cluster with a real node + images + operator + config/samples: Valid/Synced/Ready and two /v1/verify answers from a real pod (DEMO_STOP=1 stops everything after; root).
	hack/demo.sh

.PHONY: e2e
e2e: tools ## The end-to-end test on kind (needs Docker and kind; HALTSQL_IMAGE=<haltsql image>, HALTSQL_E2E_KEEP_CLUSTER=1).
	HALTSQL_E2E_PROVIDER=kind $(CARGO) test -p haltsql-operator --test e2e -- --nocapture

.PHONY: e2e-node
e2e-node: tools ## Only the end-to-end test, on the local cluster with a real node (started if needed, left running; root).
	$(CARGO) build -p haltsql --bins
	hack/images.sh
	hack/cluster.sh up node
	HALTSQL_E2E_PROVIDER=node $(CARGO) test -p haltsql-operator --test e2e -- --nocapture
