package cni

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// FuzzAllocateIPRequest feeds arbitrary bytes through protobuf decoding and
// the service. It must never panic; a request that reaches the backend must be
// one that validation accepts, and a success must come from the backend.
func FuzzAllocateIPRequest(f *testing.F) {
	for _, r := range []*rpc.AllocateIPRequest{
		allocReq("default", "web-0", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
		{K8SPodNamespace: "kube-system", K8SPodName: "coredns-1", K8SPodInfraContainerID: "x", K8SNodeName: "10.0.0.1", IPType: 7},
		{K8SPodName: "\xff", IPType: rpc.IPType_CrossVPCENIIPType},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rpc.AllocateIPRequest
		if err := proto.Unmarshal(data, &req); err != nil {
			return // gRPC would reject it before our code runs
		}
		b := &recordingBackend{}
		srv := NewServer(DefaultConfig(), b, nil, nil)
		reply, err := srv.AllocateIP(context.Background(), &req)
		if err != nil {
			t.Fatalf("gRPC error %v: failures must be IsSuccess=false", err)
		}
		calls := b.Calls()
		if reply.IsSuccess != (len(calls) == 1) {
			t.Fatalf("success=%v with %d backend calls", reply.IsSuccess, len(calls))
		}
		for _, pod := range calls {
			if _, err := decode(&req); err != nil || checkIPType(req.GetIPType()) != nil {
				t.Fatalf("backend got %v although validation says %v", pod, err)
			}
			if pod.Name != req.GetK8SPodName() || pod.Namespace != req.GetK8SPodNamespace() || pod.ContainerID != req.GetK8SPodInfraContainerID() {
				t.Fatalf("backend got %v for request %v", pod, &req)
			}
		}
		if !reply.IsSuccess && reply.ErrMsg == "" {
			t.Fatal("failure without ErrMsg")
		}
		if _, err := proto.Marshal(reply); err != nil {
			t.Fatalf("reply cannot be sent: %v", err)
		}
	})
}
