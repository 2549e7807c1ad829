//go:build tools

package main

// The plugins protogen runs, pinned by this module's go.mod.
import (
	_ "google.golang.org/grpc/cmd/protoc-gen-go-grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
)
