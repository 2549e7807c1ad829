package bcesim_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baidubce/bce-sdk-go/services/eni"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// countingTransport counts the HTTP requests a client sends.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// The per-second call counters (GET /admin/stats), which the e2e chaos
// suite checks I5 against, count every authenticated HTTP request: answered
// normally, throttled (429), failed by an injected 5xx before or after the
// mutation, refused by the lagging replica, or given up by the client during
// injected latency. The SDK's retries are separate requests, each counted.
func TestServer_StatsCountEveryRequest(t *testing.T) {
	w := startWorld(t, bcesim.Config{})
	c := newSDK(t, w.url, testAK, testSK)
	ct := &countingTransport{next: c.eni.HTTPClient.Transport}
	c.eni.HTTPClient.Transport = ct

	id := createENI(t, c, w, "c-abc/i-big/node1/abcdef")
	list := func() { _, _ = c.eni.ListEni(&eni.ListEniArgs{VpcId: testVPC}) }
	list()
	// Throttled: one token, then 429s (the SDK retries them too).
	if err := w.srv.SetRateLimits(map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {QPS: 0.001, Burst: 1}}); err != nil {
		t.Fatal(err)
	}
	list()
	list()
	if err := w.srv.SetRateLimits(map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {}}); err != nil {
		t.Fatal(err)
	}
	// 5xx before the call is handled, every time: the SDK retries.
	if err := w.srv.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{"*": 1}}); err != nil {
		t.Fatal(err)
	}
	list()
	_, _ = c.eni.BatchAddPrivateIp(&eni.EniBatchPrivateIpArgs{EniId: id, PrivateIpAddressCount: 2})
	// 5xx after the mutation was applied.
	if err := w.srv.SetFaults(bcesim.Faults{FailAfterMutation: map[bcesim.Op]int{bcesim.OpBatchAddPrivateIP: 2}}); err != nil {
		t.Fatal(err)
	}
	_, _ = c.eni.BatchAddPrivateIp(&eni.EniBatchPrivateIpArgs{EniId: id, PrivateIpAddressCount: 1})
	// Lagging reads, and a release of an address younger than the lag.
	if err := w.srv.SetFaults(bcesim.Faults{ReplicaLagMs: 60_000}); err != nil {
		t.Fatal(err)
	}
	res, _ := c.eni.BatchAddPrivateIp(&eni.EniBatchPrivateIpArgs{EniId: id, PrivateIpAddressCount: 1})
	if res != nil && len(res.PrivateIpAddresses) == 1 {
		_ = c.eni.DeletePrivateIp(&eni.EniPrivateIpArgs{EniId: id, PrivateIpAddress: res.PrivateIpAddresses[0]})
	}
	list()
	// Latency past the client's patience: the request was received.
	if err := w.srv.SetFaults(bcesim.Faults{LatencyMs: map[bcesim.Op]int{bcesim.OpGetENI: 500}}); err != nil {
		t.Fatal(err)
	}
	c.eni.HTTPClient.Timeout = 100 * time.Millisecond
	_, _ = c.eni.GetEniDetail(id)
	c.eni.HTTPClient.Timeout = 0
	if err := w.srv.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}

	st := w.srv.Stats()
	var perSecond int64
	for _, s := range st.All.PerSecond {
		perSecond += s.Calls
	}
	sent := ct.n.Load()
	t.Logf("client sent %d HTTP requests; bce-sim counted %d (%d throttled), %d in its per-second counts", sent, st.All.Calls, st.All.Throttled, perSecond)
	if st.All.Calls != sent || perSecond != sent {
		t.Fatalf("client sent %d HTTP requests, bce-sim counted %d (per second: %d)", sent, st.All.Calls, perSecond)
	}
	if st.All.Throttled < 1 || st.Ops[bcesim.OpListENIs].Calls < 6 || st.Ops[bcesim.OpGetENI].Calls < 1 {
		t.Fatalf("not every kind of request was made: %+v", st.Ops)
	}
}
