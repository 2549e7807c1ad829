package shard_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
	"github.com/cce-ipam/sharded/shard"
)

// fixedRoute routes every node the same way.
type fixedRoute shard.Route

func (r fixedRoute) RouteOf(string) shard.Route { return shard.Route(r) }

// oneNode places every pod on node n1 and serves its calls locally.
type oneNode struct{}

func (oneNode) PodNode(context.Context, podip.PodRef) (string, error) { return "n1", nil }
func (oneNode) CallNode(ref podip.PodRef) (string, bool)              { return ref.Node, ref.Node != "" }
func (oneNode) EndpointNode(context.Context, podip.PodRef) (string, bool, error) {
	return "n1", true, nil
}
func (oneNode) NodeGone(context.Context, string) bool { return false }
func (oneNode) ReleaseOnDeletedNode(context.Context, podip.PodRef) (podip.Endpoint, bool, error) {
	return podip.Endpoint{}, false, nil
}
func (oneNode) Allocate(context.Context, podip.PodRef) (podip.Endpoint, error) {
	return podip.Endpoint{IP: "10.0.0.7", Node: "n1"}, nil
}
func (oneNode) Release(context.Context, podip.PodRef) (podip.Endpoint, bool, error) {
	return podip.Endpoint{IP: "10.0.0.7", Node: "n1"}, true, nil
}
func (oneNode) Check(context.Context, podip.PodRef) (podip.Endpoint, bool, error) {
	return podip.Endpoint{IP: "10.0.0.7", Node: "n1"}, true, nil
}

// hopReplica is one replica's CNI path as cmd/cce-ipam wires it: the
// router's interceptor in front of cni.Server, which asks shard.Forwarded.
type hopReplica struct {
	addr string
	reg  *prometheus.Registry
	cli  rpc.CNIBackendClient
}

func startHopReplica(t *testing.T, name string, lis net.Listener, routes shard.Routes, auth *shard.Authenticator) *hopReplica {
	t.Helper()
	reg := prometheus.NewRegistry()
	fwd := shard.NewForwarder(shard.ForwarderDeps{Self: name, Routes: routes, Auth: auth, OwnerWait: time.Second}, nil, reg)
	t.Cleanup(fwd.Close)
	router := shard.NewRouter(shard.RouterDeps{Forwarder: fwd, Local: oneNode{}, Locator: oneNode{}}, nil)
	gs := grpc.NewServer(grpc.UnaryInterceptor(router.UnaryInterceptor))
	rpc.RegisterCNIBackendServer(gs, cni.NewServer(cni.DefaultConfig(), router, nil, reg, cni.WithForwarded(shard.Forwarded)))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &hopReplica{addr: lis.Addr().String(), reg: reg, cli: rpc.NewCNIBackendClient(conn)}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// A call that enters one replica and is forwarded to the node's owner is
// counted once as hop="entry" (where the CNI plugin called) and once as
// hop="forwarded" (at the owner); the owner counts no entry for it.
func TestRouter_ForwardedCallCountedOnceAsEntry(t *testing.T) {
	auth := shard.NewAuthenticator([]byte("0123456789abcdef0123456789abcdef"))
	ownerLis := listen(t)
	owner := startHopReplica(t, "owner", ownerLis, fixedRoute{Local: true}, auth)
	entry := startHopReplica(t, "entry", listen(t), fixedRoute{Owner: "owner", GRPC: owner.addr}, auth)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := entry.cli.AllocateIP(ctx, &rpc.AllocateIPRequest{K8SPodName: "web-0", K8SPodNamespace: "default",
		K8SPodInfraContainerID: "sandbox-1", IPType: rpc.IPType_BCCMultiENIMultiIPType})
	if err != nil || !reply.GetIsSuccess() || reply.GetENIMultiIP().GetIP() != "10.0.0.7" {
		t.Fatalf("forwarded AllocateIP: %v, %v", reply, err)
	}
	// And one call the owner receives itself.
	if reply, err := owner.cli.ReleaseIP(ctx, &rpc.ReleaseIPRequest{K8SPodName: "web-0", K8SPodNamespace: "default",
		K8SPodInfraContainerID: "sandbox-1"}); err != nil || !reply.GetIsSuccess() {
		t.Fatalf("local ReleaseIP: %v, %v", reply, err)
	}

	count := func(r *hopReplica, method, hop string) float64 {
		t.Helper()
		mfs, err := r.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, mf := range mfs {
			if mf.GetName() != "cce_ipam_cni_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["method"] == method && labels["hop"] == hop && labels["result"] == "ok" {
					sum += m.GetCounter().GetValue()
				}
			}
		}
		return sum
	}
	for _, c := range []struct {
		name        string
		r           *hopReplica
		method, hop string
		want        float64
	}{
		{"entry replica, its call", entry, "AllocateIP", cni.HopEntry, 1},
		{"entry replica, nothing forwarded to it", entry, "AllocateIP", cni.HopForwarded, 0},
		{"owner, the forwarded hop", owner, "AllocateIP", cni.HopForwarded, 1},
		{"owner, no second entry for it", owner, "AllocateIP", cni.HopEntry, 0},
		{"owner, its own call", owner, "ReleaseIP", cni.HopEntry, 1},
	} {
		if got := count(c.r, c.method, c.hop); got != c.want {
			t.Errorf("%s: cce_ipam_cni_requests_total{method=%q,hop=%q} = %v, want %v", c.name, c.method, c.hop, got, c.want)
		}
	}
}
