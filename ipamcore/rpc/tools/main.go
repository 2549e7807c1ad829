// Command protogen compiles one .proto file with protocompile (pure Go, so no
// protoc is needed) and runs protoc plugins on it, as protoc would: it sends a
// CodeGeneratorRequest on the plugin's stdin and writes the files of the
// CodeGeneratorResponse.
//
// Usage: protogen -proto rpc.proto -out DIR -plugin PATH=PARAM [-plugin ...]
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/pluginpb"
)

type pluginFlags []string

func (p *pluginFlags) String() string     { return strings.Join(*p, ",") }
func (p *pluginFlags) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	protoFile := flag.String("proto", "", "the .proto file to compile (relative to -import-path)")
	importPath := flag.String("import-path", ".", "directory that .proto imports are resolved against")
	out := flag.String("out", ".", "directory generated files are written to")
	var plugins pluginFlags
	flag.Var(&plugins, "plugin", "PATH=PARAMETER of a protoc plugin binary (repeatable)")
	flag.Parse()
	if *protoFile == "" || len(plugins) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*importPath, *protoFile, *out, plugins); err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
}

func run(importPath, protoFile, out string, plugins []string) error {
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{importPath}}),
		// Keep comments so that generated code carries the .proto's docs.
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	files, err := compiler.Compile(context.Background(), protoFile)
	if err != nil {
		return err
	}
	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: []string{protoFile}}
	seen := map[string]bool{}
	var addWithDeps func(fd protoreflect.FileDescriptor)
	addWithDeps = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			addWithDeps(imports.Get(i).FileDescriptor)
		}
		req.ProtoFile = append(req.ProtoFile, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range files {
		addWithDeps(f)
	}
	for _, p := range plugins {
		bin, param, _ := strings.Cut(p, "=")
		req.Parameter = proto.String(param)
		if err := runPlugin(bin, req, out); err != nil {
			return fmt.Errorf("plugin %s: %w", bin, err)
		}
	}
	return nil
}

func runPlugin(bin string, req *pluginpb.CodeGeneratorRequest, out string) error {
	in, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	var stdout bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return err
	}
	var resp pluginpb.CodeGeneratorResponse
	if err := proto.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	if resp.Error != nil {
		return fmt.Errorf("%s", resp.GetError())
	}
	for _, f := range resp.File {
		path := filepath.Join(out, f.GetName())
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
			return err
		}
	}
	return nil
}
