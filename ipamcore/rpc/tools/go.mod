// Tools module for generating the gRPC stubs of ../rpc.proto without protoc:
// protocompile parses the .proto, and the official Go plugins generate code.
module github.com/cce-ipam/sharded/ipamcore/rpc/tools

go 1.26.0

require (
	github.com/bufbuild/protocompile v0.14.1
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2
	google.golang.org/protobuf v1.36.12
)

require golang.org/x/sync v0.8.0 // indirect
