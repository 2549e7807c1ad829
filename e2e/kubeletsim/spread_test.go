package kubeletsim

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

type countingClient struct {
	rpc.CNIBackendClient
	calls int
}

func (c *countingClient) AllocateIP(context.Context, *rpc.AllocateIPRequest, ...grpc.CallOption) (*rpc.AllocateIPReply, error) {
	c.calls++
	return &rpc.AllocateIPReply{IsSuccess: true}, nil
}

func TestConfig_Endpoints_MergesAndDeduplicates(t *testing.T) {
	c := Config{CNIEndpoint: "a:1", CNIEndpoints: []string{"b:2", "", "a:1", "c:3"}}
	if got, want := c.endpoints(), []string{"a:1", "b:2", "c:3"}; !slices.Equal(got, want) {
		t.Fatalf("endpoints() = %v, want %v", got, want)
	}
	if got := (Config{}).endpoints(); len(got) != 0 {
		t.Fatalf("no endpoints configured, got %v", got)
	}
}

func TestSpreadClient_AllocateIP_ReachesEveryEndpoint(t *testing.T) {
	a, b, c := &countingClient{}, &countingClient{}, &countingClient{}
	client := spreadClient{a, b, c}.client()
	for range 300 {
		if _, err := client.AllocateIP(context.Background(), &rpc.AllocateIPRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// 300 uniform picks leave an endpoint without a call with probability
	// 3*(2/3)^300, far below anything a run will ever see.
	for i, cc := range []*countingClient{a, b, c} {
		if cc.calls == 0 {
			t.Errorf("endpoint %d got no call of 300", i)
		}
	}
	if a.calls+b.calls+c.calls != 300 {
		t.Errorf("calls %d+%d+%d, want 300", a.calls, b.calls, c.calls)
	}
	if single := (spreadClient{a}).client(); single != rpc.CNIBackendClient(a) {
		t.Errorf("one endpoint should be used directly")
	}
}
