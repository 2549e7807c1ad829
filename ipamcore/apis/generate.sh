#!/usr/bin/env bash
# Regenerates everything derived from the cce.io/v1alpha1 types:
#
#   ipamcore/apis/cce/v1alpha1/zz_generated.deepcopy.go   deepcopy-gen
#   ipamcore/generated/clientset/versioned/...            client-gen (+ fake)
#   ipamcore/generated/listers/...                        lister-gen
#   ipamcore/generated/informers/externalversions/...     informer-gen
#   charts/cce-ipam/crds/cce.io_*.yaml                    controller-gen
#
# The generators are the `tool` entries of go.mod (k8s.io/code-generator
# v0.37.2, sigs.k8s.io/controller-tools v0.23.0), run with `go tool`, so the
# only thing needed is Go and the module proxy (or a warm module cache).
# The script works on the module tree it lives in, deletes the previous output
# first and is idempotent. Run it through `make generate`; the test in
# ipamcore/apis runs it on a copy of the tree and fails when the committed
# output differs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

MODULE="$(go list -m)"
API_DIR="ipamcore/apis/cce/v1alpha1"
API_PKG="$MODULE/$API_DIR"
OUT_DIR="ipamcore/generated"
OUT_PKG="$MODULE/$OUT_DIR"
CRD_DIR="charts/cce-ipam/crds"
HEADER="ipamcore/apis/boilerplate.go.txt"

rm -f "$API_DIR/zz_generated.deepcopy.go"
rm -rf "$OUT_DIR/clientset" "$OUT_DIR/listers" "$OUT_DIR/informers"
rm -f "$CRD_DIR"/cce.io_*.yaml
mkdir -p "$OUT_DIR" "$CRD_DIR"

# Two independent chains run in parallel: the clients need only the types,
# while controller-gen needs the deepcopy functions to type-check the package.
types() {
	go tool deepcopy-gen \
		--go-header-file "$HEADER" \
		--output-file zz_generated.deepcopy.go \
		"$API_PKG"
	go tool controller-gen \
		crd:crdVersions=v1 \
		paths="./$API_DIR/..." \
		output:crd:artifacts:config="$CRD_DIR"
}

clients() {
	go tool client-gen \
		--go-header-file "$HEADER" \
		--clientset-name versioned \
		--input-base "" \
		--input "$API_PKG" \
		--output-dir "$OUT_DIR/clientset" \
		--output-pkg "$OUT_PKG/clientset"
	go tool lister-gen \
		--go-header-file "$HEADER" \
		--output-dir "$OUT_DIR/listers" \
		--output-pkg "$OUT_PKG/listers" \
		"$API_PKG"
	go tool informer-gen \
		--go-header-file "$HEADER" \
		--versioned-clientset-package "$OUT_PKG/clientset/versioned" \
		--listers-package "$OUT_PKG/listers" \
		--output-dir "$OUT_DIR/informers" \
		--output-pkg "$OUT_PKG/informers" \
		"$API_PKG"
}

types &
types_pid=$!
clients &
clients_pid=$!
status=0
wait "$types_pid" || { echo "generate.sh: deepcopy-gen or controller-gen failed" >&2; status=1; }
wait "$clients_pid" || { echo "generate.sh: client-gen, lister-gen or informer-gen failed" >&2; status=1; }
exit "$status"
