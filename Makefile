# cce-ipam: a sharded, active-active ENI IPAM for Baidu Cloud CCE.
#
#   make demo    the main job: local control plane, bce-sim, 3 cce-ipam replicas, kubelet-sim; live view until Ctrl-C
#   make test    unit tests (-race) + integration tests against a real etcd + kube-apiserver, then the kind
#                suite where Docker is usable (E2E_KIND=0 skips it)
#
# Test tools (etcd, kube-apiserver, kube-controller-manager, helm) are built from
# the Go module proxy into bin/ by `make tools`, once per pinned version.

SHELL := /usr/bin/env bash
BIN   := $(CURDIR)/bin
GO    ?= go
# Integration tests start real control-plane processes; they carry this tag so
# that a plain `go test ./...` stays a fast unit run.
INTEGRATION_TAGS := integration
TEST_TIMEOUT ?= 30m
# Packages tested at once. Most integration tests wait (on gossip, Leases, watches)
# far more than they compute, so one and a half per core keeps the cores busy.
TEST_PARALLEL ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$((n + (n + 1) / 2)))

export CCE_IPAM_BIN_DIR := $(BIN)

.PHONY: all build tools test unit integration lint fmt vet demo binaries clean help generate

all: build

help:
	@sed -n '1,10p' Makefile

## build: compile every package and binary of the product module.
build:
	$(GO) build ./...

## tools: build the pinned test tools into bin/ (idempotent).
tools:
	@e2e/tools/build.sh $(BIN)
	@charts/tools/install-prometheus.sh

## lint: gofmt, go vet and golangci-lint (.golangci.yml, pinned, built into bin/) must be clean; the
## integration-tagged files are linted too.
lint:
	@e2e/tools/build.sh $(BIN) lint >/dev/null
	@unformatted=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags $(INTEGRATION_TAGS) ./...
	$(BIN)/golangci-lint run ./...

fmt:
	gofmt -w $$(git ls-files -co --exclude-standard '*.go')

## unit: unit tests only, with the race detector.
unit:
	$(GO) test -race -count=1 ./...

## test: the README's test command: tools, lint, unit + integration tests with -race, then the kind
## suite (e2e/kind/suite.sh: run when Docker is usable here, else skipped with the reason; E2E_KIND=0|1|auto).
test: tools binaries lint
	$(GO) test -race -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) -tags $(INTEGRATION_TAGS) ./...
	@e2e/kind/suite.sh

## integration: the same as test without the lint step.
integration: tools binaries
	$(GO) test -race -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) -tags $(INTEGRATION_TAGS) ./...

## generate: regenerate committed code (API clientsets, CRD manifests, gRPC stubs).
## Each generator has a test that fails when its committed output is stale.
generate:
	@for g in ipamcore/apis/generate.sh ipamcore/rpc/generate.sh; do \
		if [ -x "$$g" ]; then echo "generate: $$g"; "$$g" || exit 1; fi; \
	done

## binaries: build cce-ipam, bce-sim, kubelet-sim and ipamctl into bin/.
binaries:
	$(GO) build -o $(BIN)/ ./cmd/cce-ipam ./cmd/bce-sim ./cmd/kubelet-sim ./cmd/ipamctl

## demo: everything on this machine with real parts (DEMO_ARGS="--nodes 10 --pods 100 --keep").
DEMO_ARGS ?=
demo: tools binaries
	$(GO) run ./e2e/demo --bin-dir $(BIN) $(DEMO_ARGS)

clean:
	rm -rf $(BIN)

## chart: the Helm chart, its docs and the container image.
IMAGE       ?= cce-ipam:$(shell awk '/^appVersion:/ {gsub(/"/, "", $$2); print $$2}' charts/cce-ipam/Chart.yaml)
IMAGE_SIM   ?= cce-ipam-bce-sim:$(lastword $(subst :, ,$(IMAGE)))
CHART       := charts/cce-ipam
.PHONY: image image-context chart-docs helm-lint

## image-context: the static binaries (linux, GOARCH of the host unless set) and the CA bundle the
## Dockerfile copies, in bin/image/. No base image is pulled: the images are FROM scratch.
IMAGE_CONTEXT := $(BIN)/image
CA_BUNDLE     ?= /etc/ssl/certs/ca-certificates.crt
image-context:
	@[ -r "$(CA_BUNDLE)" ] || { echo "make image: no CA bundle at $(CA_BUNDLE) (install ca-certificates or set CA_BUNDLE)" >&2; exit 1; }
	@mkdir -p $(IMAGE_CONTEXT)
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -buildvcs=auto \
		-ldflags="-s -w -X main.version=$(lastword $(subst :, ,$(IMAGE)))" \
		-o $(IMAGE_CONTEXT)/ ./cmd/cce-ipam ./cmd/bce-sim ./cmd/ipamctl
	cp $(CA_BUNDLE) $(IMAGE_CONTEXT)/ca-certificates.crt
	cp Dockerfile $(IMAGE_CONTEXT)/Dockerfile

## image: build the cce-ipam image (with ipamctl) and bce-sim's, for kind e2e, with docker or podman.
image: image-context
	@engine=$$(command -v docker || command -v podman || true); \
	if [ -z "$$engine" ]; then echo "make image: neither docker nor podman is installed; install one to build $(IMAGE)" >&2; exit 1; fi; \
	if ! "$$engine" info >/dev/null 2>&1; then echo "make image: $$engine is installed but cannot reach its daemon/runtime ($$engine info failed)" >&2; exit 1; fi; \
	"$$engine" build --target cce-ipam -t $(IMAGE) $(IMAGE_CONTEXT) && \
	"$$engine" build --target bce-sim -t $(IMAGE_SIM) $(IMAGE_CONTEXT)

## chart-docs: regenerate the values table of charts/cce-ipam/README.md from values.yaml.
chart-docs:
	$(GO) run ./charts/tools/valuesdoc -values $(CHART)/values.yaml -readme $(CHART)/README.md

## helm-lint: helm lint with the default values and with every ci/ values file.
helm-lint: tools
	$(BIN)/helm lint $(CHART)
	@for f in $(CHART)/ci/*-values.yaml; do echo "helm lint -f $$f"; $(BIN)/helm lint $(CHART) -f $$f || exit 1; done

## e2e: suites on the local control plane, chaos, and the kind path.
E2E_CHAOS_DURATION ?= 10m
E2E_CHAOS_SEED     ?= 1
.PHONY: e2e e2e-chaos e2e-kind

## e2e: the e2e suites (fleet, lifecycle, sharding, short chaos) on a local control plane; make test runs them too.
e2e: tools binaries
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -tags $(INTEGRATION_TAGS) ./e2e/fleet/ ./e2e/suites/...

## e2e-chaos: the long chaos profile (E2E_CHAOS_DURATION=10m, E2E_CHAOS_SEED=1).
e2e-chaos: tools binaries
	E2E_CHAOS_DURATION=$(E2E_CHAOS_DURATION) E2E_CHAOS_SEED=$(E2E_CHAOS_SEED) \
		$(GO) test -race -count=1 -timeout 60m -tags $(INTEGRATION_TAGS) -v -run TestChaos ./e2e/suites/chaos/

## e2e-kind: a kind cluster built offline (e2e/kind/README.md), the chart with 3 replicas and bce-sim, the lifecycle suite, a rolling update and a replica deletion under load (root).
e2e-kind: tools binaries
	e2e/kind/run.sh

## bench: the benchmark report, bench/results/<date>/report.md (short) or report-long.md, with plots.
## bench: short profile (≤ 15 min on two cores); bench-long: 1,000 and 3,000 nodes (long).
.PHONY: bench bench-long
BENCH_ARGS ?=
bench: tools binaries
	BENCH_COMMAND="make bench" $(GO) run ./bench/cmd/bench --profile short --bin-dir $(BIN) $(BENCH_ARGS)

bench-long: tools binaries
	BENCH_COMMAND="make bench-long" $(GO) run ./bench/cmd/bench --profile long --bin-dir $(BIN) $(BENCH_ARGS)
