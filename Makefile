# cce-ipam: a sharded, active-active ENI IPAM for Baidu Cloud CCE.
#
#   make demo    the main job: local control plane, bce-sim, cce-ipam, kubelet-sim; pods get IPs (one replica until sharding)
#   make test    unit tests (-race) + integration tests against a real etcd + kube-apiserver
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

## lint: gofmt and go vet must be clean (also with the integration tag).
lint:
	@unformatted=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags $(INTEGRATION_TAGS) ./...

fmt:
	gofmt -w $$(git ls-files -co --exclude-standard '*.go')

## unit: unit tests only, with the race detector.
unit:
	$(GO) test -race -count=1 ./...

## test: the README's test command: tools, lint, unit + integration tests with -race.
test: tools binaries lint
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -tags $(INTEGRATION_TAGS) ./...

## integration: the same as test without the lint step.
integration: tools binaries
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -tags $(INTEGRATION_TAGS) ./...

## generate: regenerate committed code (API clientsets, CRD manifests, gRPC stubs).
## Each generator has a test that fails when its committed output is stale.
generate:
	@for g in ipamcore/apis/generate.sh ipamcore/rpc/generate.sh; do \
		if [ -x "$$g" ]; then echo "generate: $$g"; "$$g" || exit 1; fi; \
	done

## binaries: build cce-ipam, bce-sim and kubelet-sim into bin/.
binaries:
	$(GO) build -o $(BIN)/ ./cmd/cce-ipam ./cmd/bce-sim ./cmd/kubelet-sim

## demo: everything on this machine with real parts (DEMO_ARGS="--nodes 10 --pods 100 --keep").
DEMO_ARGS ?=
demo: tools binaries
	$(GO) run ./e2e/demo --bin-dir $(BIN) $(DEMO_ARGS)

clean:
	rm -rf $(BIN)
