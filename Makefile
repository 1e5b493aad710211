# Lethe — erasure operator. `make help` lists the targets.
#
# Every tool and service version is pinned here, in one place. Tools are built
# once per machine into a per-user cache ($(LETHE_CACHE)) keyed by version and
# linked into ./bin, so a fresh clone (as CI makes) reuses them.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

# --- pinned versions ---------------------------------------------------------
CONTROLLER_GEN_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION  ?= v2.15.0
HELM_VERSION           ?= v3.22.0
CYCLONEDX_GOMOD_VERSION ?= v1.10.0
PROMTOOL_VERSION       ?= v0.316.0
KUBE_VERSION           ?= 1.37.2
ETCD_VERSION           ?= 3.6.16
PG_MAJOR               ?= 15
PGVECTOR_VERSION       ?= 0.8.0
FALKORDB_NPM           ?= @falkordblite/linux-x64@8.2.3-falkordb.4.16.3
FALKORDB_SHA256        ?= 7e9e39ce69780fbae2cf7a31c28e05a51b4e9177b73e755384de0c3cf9f812e5
# Velero and what it needs, built from Go modules; the sums are the modules' go.sum hashes.
VELERO_VERSION            ?= v1.18.1
VELERO_SUM                ?= h1:eV+urQYesy7tJLVkGM5fs9s/nfOWKtoFezcY1r8IjJM=
VELERO_AWS_PLUGIN_VERSION ?= v1.14.3
VELERO_AWS_PLUGIN_SUM     ?= h1:3WuiNvatCGXWp/TfeH9e5LAq4skGMHUDxRMeej2FCAM=
GOFAKES3_VERSION          ?= v1.2.0
GOFAKES3_SUM              ?= h1:I9VEzPWvvAUAGzDlhYFoZjF0AXMlkcEyZlmBwiI6Oms=
export KUBE_VERSION ETCD_VERSION PG_MAJOR PGVECTOR_VERSION FALKORDB_NPM FALKORDB_SHA256
export VELERO_VERSION VELERO_SUM VELERO_AWS_PLUGIN_VERSION VELERO_AWS_PLUGIN_SUM GOFAKES3_VERSION GOFAKES3_SUM

LETHE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/lethe
export LETHE_CACHE
LOCALBIN := $(CURDIR)/bin
CONTROLLER_GEN := $(LOCALBIN)/controller-gen
GOLANGCI_LINT  := $(LOCALBIN)/golangci-lint
export LETHE_HELM := $(LOCALBIN)/helm
export LETHE_PROMTOOL := $(LOCALBIN)/promtool

# What the tests need to find the real services (see internal/testenv).
export KUBEBUILDER_ASSETS      := $(LOCALBIN)/k8s
export LETHE_PG_BIN            := /usr/lib/postgresql/$(PG_MAJOR)/bin
export LETHE_FALKORDB_MODULE   := $(LOCALBIN)/falkordb.so
export LETHE_CHROMIUM          := /usr/bin/chromium
export LETHE_VELERO            := $(LOCALBIN)/velero
export LETHE_VELERO_PLUGIN_AWS := $(LOCALBIN)/velero-plugin-for-aws
export LETHE_GOFAKES3          := $(LOCALBIN)/gofakes3

# -shuffle on: no test may depend on the order the tests run in (go test prints
# the seed to replay a failing order with -shuffle N).
GO_TEST_FLAGS ?= -count=1 -timeout 30m -shuffle on

##@ General
.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development
.PHONY: manifests
manifests: controller-gen ## Generate the CRDs and RBAC from the markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/..." paths="./controllers/..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@# The Helm chart ships the same CRDs (rendered by templates/crds/) and the same manager rules.
	@mkdir -p charts/lethe/files/crds
	@cp config/crd/bases/*.yaml charts/lethe/files/crds/
	@cp config/rbac/role.yaml charts/lethe/files/manager-role.yaml
	@cp config/prometheus/rules.yaml charts/lethe/files/prometheus-rules.yaml
	@cp config/grafana/lethe-dashboard.json charts/lethe/files/grafana-dashboard.json

.PHONY: generate
generate: controller-gen ## Generate deepcopy code from the markers, and the database's redactor from internal/redact.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."
	go run ./hack/genredact migrations/00014_redaction.sql

.PHONY: verify-gen
verify-gen: generate manifests ## Fail when generated files differ from what is committed (go.mod and go.sum tidy too).
	@go mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy; run 'go mod tidy' and commit:"; go mod tidy -diff; exit 1; }
	@if [ -n "$$(git status --porcelain -- api config charts migrations)" ]; then \
		echo "generated files are out of date; run 'make generate manifests' and commit:"; \
		git status --porcelain -- api config charts migrations; git --no-pager diff --stat -- api config charts migrations; exit 1; fi

.PHONY: fmt
fmt: ## go fmt.
	go fmt ./...

.PHONY: vet
vet: ## go vet.
	go vet ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

##@ Test
.PHONY: dev-deps
dev-deps: envtest-assets postgres falkordb velero ## Install and cache the services the dev stack and the demo start.

.PHONY: test-deps
test-deps: dev-deps helm promtool cyclonedx-gomod chromium ## Install and cache every service and tool the tests start.

.PHONY: test
test: test-deps manifests generate ## Install what the tests need, then run every test against real services, then a short fuzz run.
	go test $(GO_TEST_FLAGS) ./...
	@$(MAKE) --no-print-directory fuzz

# Fuzz targets: a short run of each in `make test`; `make fuzz FUZZTIME=5000000x` for a long one.
# FUZZTIME is a count of executions, not a duration: Go 1.26's fuzzing coordinator can
# fail a target with a bare "context deadline exceeded" when a duration runs out while a
# worker is mid-call (golang/go#75804, fixed in Go 1.27). A count has no deadline to race.
FUZZ_TARGETS := FuzzParamsHeader:./internal/graph FuzzVerifyRequest:./internal/evidence FuzzReadBundle:./internal/evidence FuzzCreateRequest:./internal/erasurecli FuzzAdmissionRules:./test/admission
FUZZTIME ?= 10000x

.PHONY: fuzz
fuzz: test-deps ## Run every fuzz target for FUZZTIME executions (10000x by default, 1-6 s each here).
	@for t in $(FUZZ_TARGETS); do echo "fuzz $${t%%:*} ($(FUZZTIME))"; \
		go test -run '^$$' -fuzz "^$${t%%:*}$$" -fuzztime $(FUZZTIME) $${t#*:} || exit 1; done

# The history checker: `make test` runs its short mode (6 runs); this is the full one.
HISTORY_RUNS ?= 1000
HISTORY_PER_ROUND ?= 10

.PHONY: history
history: test-deps ## Run the crash-safety history checker in full (HISTORY_RUNS randomized runs with manager kills, connection drops, FalkorDB restarts, re-ingestion attempts and database restores).
	LETHE_HISTORY_RUNS=$(HISTORY_RUNS) LETHE_HISTORY_PER_ROUND=$(HISTORY_PER_ROUND) \
		go test -run '^TestRandomizedFaultHistories$$' -count 1 -timeout 6h -v ./test/history

# Each benchmark runs BENCH_COUNT times; the table gives each figure's median
# and spread over the runs, its target and whether it is met. One package at
# a time (-p 1): two benchmarks running at once on 2 cores would share them.
BENCH_COUNT ?= 3
BENCH_REPORT := $(CURDIR)/.bench/report.jsonl

.PHONY: bench
bench: test-deps ## Run the benchmarks (ratios against a baseline in the same run) BENCH_COUNT times, then print the table of figures and targets.
	@mkdir -p $(dir $(BENCH_REPORT)) && rm -f $(BENCH_REPORT)
	LETHE_BENCH_REPORT=$(BENCH_REPORT) go test -p 1 -run '^$$' -bench . -benchtime 1x -count $(BENCH_COUNT) -timeout 4h ./...
	@go run ./hack/benchtable -runs $(BENCH_COUNT) $(BENCH_REPORT)

##@ Build
.PHONY: build
build: ## Build the manager into ./bin.
	go build -o $(LOCALBIN)/manager ./cmd/manager

.PHONY: run
run: build ## Run the manager against the dev stack (.dev/env).
	source .dev/env && $(LOCALBIN)/manager --kubeconfig "$$KUBECONFIG" --metrics-bind-address 127.0.0.1:0 --health-probe-bind-address 127.0.0.1:0

##@ Local stack
.PHONY: dev-up
dev-up: ## Start the local dev stack (control plane, Postgres, FalkorDB) and write .dev/env.
	hack/dev-stack.sh up

.PHONY: dev-down
dev-down: ## Stop the local dev stack.
	hack/dev-stack.sh down

.PHONY: demo
demo: ## Run the demo: dev stack, manager, a sample MemoryStore reaching Ready.
	hack/demo.sh

##@ Release
# Nothing is published: the artifacts land in $(DIST) (git-ignored).
VERSION           ?= $(shell git describe --tags --always --dirty)
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
RELEASE_URL       ?= https://github.com/lethe-dev/lethe/releases/download/$(VERSION)
DIST              ?= $(CURDIR)/dist
IMG               ?= ghcr.io/lethe-dev/lethe:$(VERSION)
IMAGE_PLATFORMS   ?= linux/amd64
export CYCLONEDX_GOMOD := $(LOCALBIN)/cyclonedx-gomod

.PHONY: release
release: helm cyclonedx-gomod ## Build the release into dist/: plugin and manager for RELEASE_PLATFORMS (archives), SBOMs, chart, krew manifest, checksums.
	VERSION="$(VERSION)" RELEASE_PLATFORMS="$(RELEASE_PLATFORMS)" RELEASE_URL="$(RELEASE_URL)" DIST="$(DIST)" hack/release.sh release

.PHONY: image
image: ## Build the manager's image IMG for IMAGE_PLATFORMS with the Dockerfile (needs docker, podman or buildah).
	VERSION="$(VERSION)" IMG="$(IMG)" IMAGE_PLATFORMS="$(IMAGE_PLATFORMS)" hack/release.sh image

.PHONY: cyclonedx-gomod
cyclonedx-gomod: ## Build and cache cyclonedx-gomod (the release's SBOMs).
	@hack/go-install-tool.sh cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod $(CYCLONEDX_GOMOD_VERSION)

##@ Dependencies
.PHONY: helm
helm: ## Build and cache helm (the chart's tests run helm lint and helm template).
	@hack/go-install-tool.sh helm helm.sh/helm/v3/cmd/helm $(HELM_VERSION)

.PHONY: promtool
promtool: ## Build and cache promtool from the Prometheus module (the alert rules' tests run it; minutes the first time).
	@hack/go-install-tool.sh promtool github.com/prometheus/prometheus/cmd/promtool $(PROMTOOL_VERSION)

.PHONY: envtest-assets
envtest-assets: ## Build and cache kube-apiserver and etcd (minutes the first time).
	@hack/install-control-plane.sh >/dev/null

.PHONY: postgres
postgres: ## Install PostgreSQL and build pgvector (needs root for apt).
	@hack/install-postgres.sh

.PHONY: velero
velero: ## Build the Velero server, its AWS plugin and an S3-compatible server from Go modules (about 10 minutes, once per machine).
	@hack/install-velero.sh

.PHONY: falkordb
falkordb: ## Install Valkey and the FalkorDB module.
	@hack/install-falkordb.sh

.PHONY: chromium
chromium: ## Install headless Chromium (the certificate's screenshot test; needs root for apt).
	@hack/install-chromium.sh >/dev/null

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN):
	@hack/go-install-tool.sh controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen $(CONTROLLER_GEN_VERSION)

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT)
$(GOLANGCI_LINT):
	@hack/go-install-tool.sh golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint $(GOLANGCI_LINT_VERSION)
