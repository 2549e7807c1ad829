package kubeletsim

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

type okCNI struct {
	rpc.UnimplementedCNIBackendServer
}

func (okCNI) AllocateIP(context.Context, *rpc.AllocateIPRequest) (*rpc.AllocateIPReply, error) {
	return &rpc.AllocateIPReply{IsSuccess: true}, nil
}

func (okCNI) ReleaseIP(context.Context, *rpc.ReleaseIPRequest) (*rpc.ReleaseIPReply, error) {
	return &rpc.ReleaseIPReply{IsSuccess: true}, nil
}

// With CNIConnectionPerCall every call opens its own connection (as the CNI
// plugin's process does, so that a Service balances each call); without it
// all calls share one.
func TestDialCNI_ConnectionPerCall(t *testing.T) {
	for _, perCall := range []bool{false, true} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cl := &countingListener{Listener: lis}
		gs := grpc.NewServer()
		rpc.RegisterCNIBackendServer(gs, okCNI{})
		go func() { _ = gs.Serve(cl) }()

		clients, closeConns, err := dialCNI([]string{lis.Addr().String()}, perCall)
		if err != nil {
			t.Fatal(err)
		}
		c := clients.client()
		ctx := context.Background()
		for range 3 {
			if r, err := c.AllocateIP(ctx, &rpc.AllocateIPRequest{}); err != nil || !r.IsSuccess {
				t.Fatalf("perCall=%v: AllocateIP: %v %v", perCall, r, err)
			}
		}
		if r, err := c.ReleaseIP(ctx, &rpc.ReleaseIPRequest{}); err != nil || !r.IsSuccess {
			t.Fatalf("perCall=%v: ReleaseIP: %v %v", perCall, r, err)
		}
		closeConns()
		gs.Stop()
		want := int64(1)
		if perCall {
			want = 4
		}
		if got := cl.accepted.Load(); got != want {
			t.Errorf("perCall=%v: %d connections for 4 calls, want %d", perCall, got, want)
		}
	}
}
