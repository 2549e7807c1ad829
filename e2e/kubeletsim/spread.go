package kubeletsim

import (
	"context"
	"math/rand/v2"

	"google.golang.org/grpc"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// spreadClient sends each CNI call to one of several endpoints picked at
// random, the way a Service spreads the plugins' calls over IPAM replicas.
type spreadClient []rpc.CNIBackendClient

// client returns the one client when there is one endpoint, else a client
// that picks per call.
func (c spreadClient) client() rpc.CNIBackendClient {
	if len(c) == 1 {
		return c[0]
	}
	return c
}

func (c spreadClient) pick() rpc.CNIBackendClient { return c[rand.IntN(len(c))] }

func (c spreadClient) AllocateIP(ctx context.Context, in *rpc.AllocateIPRequest, opts ...grpc.CallOption) (*rpc.AllocateIPReply, error) {
	return c.pick().AllocateIP(ctx, in, opts...)
}

func (c spreadClient) ReleaseIP(ctx context.Context, in *rpc.ReleaseIPRequest, opts ...grpc.CallOption) (*rpc.ReleaseIPReply, error) {
	return c.pick().ReleaseIP(ctx, in, opts...)
}

func (c spreadClient) CheckIP(ctx context.Context, in *rpc.CheckIPRequest, opts ...grpc.CallOption) (*rpc.CheckIPReply, error) {
	return c.pick().CheckIP(ctx, in, opts...)
}
