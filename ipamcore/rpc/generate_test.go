package rpc

import (
	"context"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestGeneratedCodeMatchesProto compiles rpc.proto and compares its
// descriptor with the one embedded in the committed rpc.pb.go: any edit of
// the .proto without `make generate` fails here.
func TestGeneratedCodeMatchesProto(t *testing.T) {
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{"."}}),
	}
	files, err := compiler.Compile(context.Background(), "rpc.proto")
	if err != nil {
		t.Fatalf("compile rpc.proto: %v", err)
	}
	fromSource := protodesc.ToFileDescriptorProto(files[0])
	committed := protodesc.ToFileDescriptorProto(File_rpc_proto)
	fromSource.SourceCodeInfo, committed.SourceCodeInfo = nil, nil
	if !proto.Equal(fromSource, committed) {
		t.Fatalf("rpc.pb.go is stale: run `make generate`\nproto:     %v\ncommitted: %v", fromSource, committed)
	}
}

// TestWireContract pins the field numbers the reference CNI plugin relies on.
// A renumbering in rpc.proto would pass the staleness test after regenerating,
// but it must not pass this one.
func TestWireContract(t *testing.T) {
	want := map[string]map[string]int32{
		"AllocateIPRequest": {"K8sPodName": 1, "K8sPodNamespace": 2, "K8sPodInfraContainerID": 3, "Netns": 4,
			"IfName": 5, "K8sNodeName": 6, "IPType": 7, "ENIMultiIP": 8, "CrossVPCENI": 9},
		"ReleaseIPRequest": {"K8sPodName": 1, "K8sPodNamespace": 2, "K8sPodInfraContainerID": 3, "Netns": 4,
			"IfName": 5, "K8sNodeName": 6, "IPType": 7, "ENIMultiIP": 8, "CrossVPCENI": 9},
		"CheckIPRequest": {"K8sPodName": 1, "K8sPodNamespace": 2, "K8sPodInfraContainerID": 3, "Netns": 4,
			"IfName": 5, "K8sNodeName": 6, "ENIMultiIP": 7, "CrossVPCENI": 8},
		"AllocateIPReply": {"IsSuccess": 1, "ErrMsg": 2, "IPType": 3, "ENIMultiIP": 4, "CrossVPCENI": 5},
		"ReleaseIPReply":  {"IsSuccess": 1, "ErrMsg": 2, "IPType": 3, "ENIMultiIP": 4, "CrossVPCENI": 5},
		"CheckIPReply":    {"IsSuccess": 1, "ErrMsg": 2, "IPType": 3, "ENIMultiIP": 4, "CrossVPCENI": 5},
		"ENIMultiIPReply": {"IP": 1, "Type": 2, "Mac": 3, "Gw": 4, "ENIID": 5, "Node": 6, "SubnetID": 7,
			"EnableFixIP": 8, "FixIPDeletePolicy": 9},
		"CrossVPCENIReply": {"IP": 1, "Mac": 2, "VPCCIDR": 3},
	}
	fd := File_rpc_proto
	if fd.Package() != "rpc" {
		t.Fatalf("proto package = %q, want rpc", fd.Package())
	}
	if svc := fd.Services().ByName("CNIBackend"); svc == nil || svc.Methods().Len() != 3 {
		t.Fatalf("service rpc.CNIBackend with 3 methods missing")
	}
	for msgName, fields := range want {
		msg := fd.Messages().ByName(protoreflectName(msgName))
		if msg == nil {
			t.Errorf("message %s missing", msgName)
			continue
		}
		if msg.Fields().Len() != len(fields) {
			t.Errorf("%s has %d fields, want %d", msgName, msg.Fields().Len(), len(fields))
		}
		for name, num := range fields {
			f := msg.Fields().ByName(protoreflectName(name))
			if f == nil {
				t.Errorf("%s.%s missing", msgName, name)
				continue
			}
			if int32(f.Number()) != num {
				t.Errorf("%s.%s = %d, want %d", msgName, name, f.Number(), num)
			}
		}
	}
	for name, num := range map[string]int32{"BCCMultiENIMultiIPType": 0, "BBCPrimaryENIMultiIPType": 1, "CrossVPCENIIPType": 2} {
		if got := int32(IPType_value[name]); got != num {
			t.Errorf("IPType %s = %d, want %d", name, got, num)
		}
	}
}

func protoreflectName(s string) protoreflect.Name { return protoreflect.Name(s) }
