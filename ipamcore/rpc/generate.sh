#!/usr/bin/env bash
# Regenerates rpc.pb.go and rpc_grpc.pb.go from rpc.proto with the plugins
# pinned in tools/go.mod. Needs only Go: protocompile stands in for protoc.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
	cd "$here/tools"
	go build -o "$work/protogen" .
	go build -o "$work/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
	go build -o "$work/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
)
cd "$here"
"$work/protogen" -proto rpc.proto -out . \
	-plugin "$work/protoc-gen-go=paths=source_relative" \
	-plugin "$work/protoc-gen-go-grpc=paths=source_relative"
echo "generated: ipamcore/rpc/rpc.pb.go ipamcore/rpc/rpc_grpc.pb.go"
