# haltsql-operator: see README.md. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN := $(ROOT)/bin
CARGO ?= cargo
KUBECTL := $(BIN)/kubectl
IMG ?= haltsql-operator:dev

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

.PHONY: tools
tools: ## Build kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok and helm from Go modules into bin/.
	hack/build-tools.sh

.PHONY: build
build: ## Build the operator and the haltsql CLI (debug).
	$(CARGO) build --workspace --bins

.PHONY: manifests
manifests: ## Regenerate the CRDs and the ClusterRole from the Rust types.
	$(CARGO) run --quiet --bin crdgen

.PHONY: generate
generate: manifests ## Alias of manifests (no other generated code).

.PHONY: install-manifests
install-manifests: ## Print config/default (CRDs, RBAC, operator) with the image set to IMG.
	@mkdir -p "$(ROOT)/.cache"; tmp="$$(mktemp -d "$(ROOT)/.cache/install-manifests.XXXXXX")"; \
	trap 'rm -rf "$$tmp"' EXIT; \
	printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization' \
	  'resources:' '- ../../config/default' 'images:' '- name: controller' '  newName: "$(IMG)"' \
	  > "$$tmp/kustomization.yaml"; \
	$(KUBECTL) kustomize "$$tmp"

HALTSQL_IMG ?= haltsql:dev

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

.PHONY: cluster-down
cluster-down: ## Stop both local clusters and remove their state.
	hack/cluster.sh down full
	hack/cluster.sh down envtest

.PHONY: lint
lint: ## cargo fmt --check and clippy with warnings as errors.
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: bench
bench: tools ## Benchmarks on the local cluster: table on stdout, target/bench/results.json (BENCH_SCALE=small: a few minutes).
	hack/bench.sh

.PHONY: test
test: tools ## Build everything, start the local clusters, run every test tier, stop the clusters.
	hack/test.sh

.PHONY: fuzz
fuzz: ## The verify engine for longer: PostgreSQL oracle with FUZZ_QUERIES SQLsmith queries (20000), property tests with FUZZ_CASES cases (20000).
	hack/fuzz.sh

.PHONY: demo
demo: ## Local cluster + operator + config/samples: shows Valid/Synced/Ready and two /v1/verify answers (DEMO_STOP=1 stops everything after).
	hack/demo.sh

.PHONY: e2e
e2e: tools ## The end-to-end test on kind (needs Docker and kind; HALTSQL_IMAGE=<haltsql image>, HALTSQL_E2E_KEEP_CLUSTER=1).
	HALTSQL_E2E_PROVIDER=kind $(CARGO) test -p haltsql-operator --test e2e -- --nocapture

.PHONY: e2e-local
e2e-local: tools ## Only the end-to-end test, on the local cluster (started if needed, left running).
	$(CARGO) build -p haltsql-operator -p haltsql --bins
	hack/cluster.sh up full
	HALTSQL_E2E_PROVIDER=local $(CARGO) test -p haltsql-operator --test e2e -- --nocapture
