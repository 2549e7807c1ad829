package cni

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// recordingBackend is a narrow stand-in: these tests cover the service's own
// job (validation, limits, deadlines, wire shape), not allocation.
type recordingBackend struct {
	mu       sync.Mutex
	calls    []podip.PodRef
	allocate func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, error)
	release  func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, bool, error)
}

func (b *recordingBackend) record(pod podip.PodRef) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, pod)
}

func (b *recordingBackend) Calls() []podip.PodRef {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]podip.PodRef(nil), b.calls...)
}

func (b *recordingBackend) Allocate(ctx context.Context, pod podip.PodRef) (podip.Endpoint, error) {
	b.record(pod)
	if b.allocate != nil {
		return b.allocate(ctx, pod)
	}
	return podip.Endpoint{IP: "10.0.0.5", ENIID: "eni-1", MAC: "fa:16:3e:00:00:01", Node: "node-1", SubnetID: "sbn-1"}, nil
}

func (b *recordingBackend) Release(ctx context.Context, pod podip.PodRef) (podip.Endpoint, bool, error) {
	b.record(pod)
	if b.release != nil {
		return b.release(ctx, pod)
	}
	return podip.Endpoint{}, false, nil
}

func (b *recordingBackend) Check(ctx context.Context, pod podip.PodRef) (podip.Endpoint, bool, error) {
	b.record(pod)
	if pod.Name == "known" {
		return podip.Endpoint{IP: "10.0.0.9"}, true, nil
	}
	return podip.Endpoint{}, false, nil
}

// serve starts the service on a real gRPC server on 127.0.0.1.
func serve(t *testing.T, cfg Config, b podip.Backend, reg prometheus.Registerer) rpc.CNIBackendClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.RegisterCNIBackendServer(gs, NewServer(cfg, b, nil, reg))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return rpc.NewCNIBackendClient(conn)
}

func allocReq(ns, name, id string) *rpc.AllocateIPRequest {
	return &rpc.AllocateIPRequest{K8SPodNamespace: ns, K8SPodName: name, K8SPodInfraContainerID: id}
}

func withNode(r *rpc.AllocateIPRequest, node string) *rpc.AllocateIPRequest {
	r.K8SNodeName = node
	return r
}

func withType(r *rpc.AllocateIPRequest, t rpc.IPType) *rpc.AllocateIPRequest {
	r.IPType = t
	return r
}

// releaseReq and checkReq are requests for a pod of the default namespace.
func releaseReq(name, id string) *rpc.ReleaseIPRequest {
	return &rpc.ReleaseIPRequest{K8SPodNamespace: "default", K8SPodName: name, K8SPodInfraContainerID: id}
}

func checkReq(name, id string) *rpc.CheckIPRequest {
	return &rpc.CheckIPRequest{K8SPodNamespace: "default", K8SPodName: name, K8SPodInfraContainerID: id}
}

func TestServer_AllocateIP_Success(t *testing.T) {
	b := &recordingBackend{}
	c := serve(t, DefaultConfig(), b, nil)
	req := allocReq("default", "web-0", "abc123")
	req.K8SNodeName = "node-1"
	reply, err := c.AllocateIP(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !reply.IsSuccess || reply.GetENIMultiIP().GetIP() != "10.0.0.5" || reply.GetENIMultiIP().GetENIID() != "eni-1" {
		t.Fatalf("reply = %v, want success with 10.0.0.5 on eni-1", reply)
	}
	want := podip.PodRef{Namespace: "default", Name: "web-0", ContainerID: "abc123", Node: "node-1"}
	if calls := b.Calls(); len(calls) != 1 || calls[0] != want {
		t.Fatalf("backend calls = %v, want [%v]", calls, want)
	}
}

func TestServer_AllocateIP_InvalidRequests(t *testing.T) {
	cases := []struct {
		name    string
		req     *rpc.AllocateIPRequest
		wantMsg string
	}{
		{"empty", &rpc.AllocateIPRequest{}, "pod namespace"},
		{"no name", allocReq("default", "", "id"), "pod name"},
		{"bad namespace", allocReq("Default_NS", "p", "id"), "pod namespace"},
		{"bad name", allocReq("default", "p/../x", "id"), "pod name"},
		{"no container", allocReq("default", "p", ""), "container ID is empty"},
		{"long container", allocReq("default", "p", strings.Repeat("a", 300)), "bytes long"},
		{"space in container", allocReq("default", "p", "ab cd"), "non-printable or space"},
		{"control char", allocReq("default", "p", "ab\x01cd"), "non-printable or space"},
		{"bad node", withNode(allocReq("default", "p", "id"), "Node_1"), "node name"},
		{"bbc", withType(allocReq("default", "p", "id"), rpc.IPType_BBCPrimaryENIMultiIPType), "unsupported IP type BBCPrimaryENIMultiIPType (1, BBC pods)"},
		{"crossvpc", withType(allocReq("default", "p", "id"), rpc.IPType_CrossVPCENIIPType), "(2, cross-VPC ENI pods)"},
		{"roce", withType(allocReq("default", "p", "id"), rpc.IPType_RoCEENIMultiIPType), "(3, RoCE pods)"},
		{"eri", withType(allocReq("default", "p", "id"), rpc.IPType_ERIENIMultiIPType), "(4, ERI pods)"},
	}
	b := &recordingBackend{}
	reg := prometheus.NewRegistry()
	c := serve(t, DefaultConfig(), b, reg)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reply, err := c.AllocateIP(context.Background(), tc.req)
			if err != nil {
				t.Fatalf("gRPC error %v; failures must travel as IsSuccess=false", err)
			}
			if reply.IsSuccess || !strings.Contains(reply.ErrMsg, tc.wantMsg) {
				t.Fatalf("reply = %v, want failure mentioning %q", reply, tc.wantMsg)
			}
		})
	}
	if calls := b.Calls(); len(calls) != 0 {
		t.Fatalf("backend saw invalid requests: %v", calls)
	}
	m := newMetricsForRead(t, reg)
	if got := m("AllocateIP", resultInvalid); got != float64(len(cases)) {
		t.Fatalf("invalid counter = %v, want %d", got, len(cases))
	}
}

// An IP type the reference does not know is served as BCC, as it does.
func TestServer_AllocateIP_UnknownIPTypeIsBCC(t *testing.T) {
	b := &recordingBackend{}
	c := serve(t, DefaultConfig(), b, nil)
	req := allocReq("default", "p", "id")
	req.IPType = rpc.IPType(99)
	reply, err := c.AllocateIP(context.Background(), req)
	if err != nil || !reply.IsSuccess {
		t.Fatalf("reply = %v, err %v; want success", reply, err)
	}
}

// With --cni-slot-wait 0 (the reference's behaviour) a call beyond the limit
// is answered busy at once.
func TestServer_AllocateIP_BusyAnswersAtOnce(t *testing.T) {
	entered := make(chan struct{})
	unblock := make(chan struct{})
	b := &recordingBackend{allocate: func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, error) {
		entered <- struct{}{}
		<-unblock
		return podip.Endpoint{IP: "10.0.0.1"}, nil
	}}
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.AllocateConcurrency, cfg.ReleaseConcurrency = 1, 1
	cfg.SlotWait = 0
	c := serve(t, cfg, b, reg)

	first := make(chan *rpc.AllocateIPReply, 1)
	go func() {
		r, _ := c.AllocateIP(context.Background(), allocReq("default", "a", "1"))
		first <- r
	}()
	<-entered
	reply, err := c.AllocateIP(context.Background(), allocReq("default", "b", "2"))
	if err != nil || reply.IsSuccess || !strings.HasPrefix(reply.ErrMsg, BusyMessage) {
		t.Fatalf("second allocation = %v, err %v; want %q", reply, err, BusyMessage)
	}
	// Allocations must not use up the release slots (the reference's bug).
	rel, err := c.ReleaseIP(context.Background(), releaseReq("c", "3"))
	if err != nil || !rel.IsSuccess {
		t.Fatalf("release during a full allocation limit = %v, err %v; want success", rel, err)
	}
	close(unblock)
	if r := <-first; !r.IsSuccess {
		t.Fatalf("first allocation = %v, want success", r)
	}
	if got := newMetricsForRead(t, reg)("AllocateIP", resultBusy); got != 1 {
		t.Fatalf("busy counter = %v, want 1", got)
	}
}

// A call from a CNI plugin beyond the limit waits for a slot and is served
// when one frees; one whose wait runs out is answered busy; a forwarded call
// never waits (its entry replica holds a slot meanwhile).
func TestServer_AllocateIP_WaitsForASlot(t *testing.T) {
	entered := make(chan string, 4)
	unblock := make(chan struct{})
	b := &recordingBackend{allocate: func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, error) {
		entered <- pod.Name
		if pod.Name == "a" {
			<-unblock
		}
		return podip.Endpoint{IP: "10.0.0.1"}, nil
	}}
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.AllocateConcurrency = 1
	cfg.SlotWait = time.Minute
	s := NewServer(cfg, b, nil, reg, WithForwarded(func(ctx context.Context) bool {
		return ctx.Value(forwardedMark{}) != nil
	}))
	first := make(chan *rpc.AllocateIPReply, 1)
	go func() {
		r, _ := s.AllocateIP(context.Background(), allocReq("default", "a", "1"))
		first <- r
	}()
	if got := <-entered; got != "a" {
		t.Fatalf("first call in = %q", got)
	}
	// Forwarded: refused at once although the wait is a minute.
	fwd := context.WithValue(context.Background(), forwardedMark{}, true)
	if r, _ := s.AllocateIP(fwd, allocReq("default", "f", "2")); r.IsSuccess || !strings.HasPrefix(r.ErrMsg, BusyMessage) {
		t.Fatalf("forwarded call at the limit = %v, want busy at once", r)
	}
	// A caller whose own deadline ends first is answered busy then.
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if r, _ := s.AllocateIP(short, allocReq("default", "d", "3")); r.IsSuccess || !strings.HasPrefix(r.ErrMsg, BusyMessage) {
		t.Fatalf("call whose deadline ended in the wait = %v, want busy", r)
	}
	second := make(chan *rpc.AllocateIPReply, 1)
	go func() {
		r, _ := s.AllocateIP(context.Background(), allocReq("default", "b", "4"))
		second <- r
	}()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(s.metrics.waiting) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the second call never waited for a slot")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case name := <-entered:
		t.Fatalf("%q reached the backend while the only slot was taken", name)
	default:
	}
	close(unblock)
	if r := <-first; !r.IsSuccess {
		t.Fatalf("first = %v", r)
	}
	if r := <-second; !r.IsSuccess {
		t.Fatalf("the waiting call = %v, want served once the slot freed", r)
	}
	if got := testutil.ToFloat64(s.metrics.requests.WithLabelValues(methodAllocate, resultBusy, HopEntry)); got != 1 {
		t.Errorf("busy entry calls = %v, want 1 (the one whose deadline ended)", got)
	}
	if got := testutil.ToFloat64(s.metrics.waiting); got != 0 {
		t.Errorf("cce_ipam_cni_requests_waiting = %v after the calls, want 0", got)
	}
}

func TestServer_AllocateIP_Deadline(t *testing.T) {
	b := &recordingBackend{allocate: func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, error) {
		<-ctx.Done()
		return podip.Endpoint{}, ctx.Err()
	}}
	cfg := DefaultConfig()
	cfg.RequestTimeout = 20 * time.Millisecond
	c := serve(t, cfg, b, nil)
	reply, err := c.AllocateIP(context.Background(), allocReq("default", "slow", "1"))
	if err != nil || reply.IsSuccess || !strings.Contains(reply.ErrMsg, context.DeadlineExceeded.Error()) {
		t.Fatalf("reply = %v, err %v; want a deadline failure", reply, err)
	}
}

func TestServer_AllocateIP_BackendErrorNamesPod(t *testing.T) {
	b := &recordingBackend{allocate: func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, error) {
		return podip.Endpoint{}, errors.New("subnet sbn-1 has no more IP")
	}}
	c := serve(t, DefaultConfig(), b, nil)
	reply, _ := c.AllocateIP(context.Background(), allocReq("team", "api-7", "0123456789abcdef"))
	if reply.IsSuccess || !strings.Contains(reply.ErrMsg, "team/api-7") || !strings.Contains(reply.ErrMsg, "no more IP") {
		t.Fatalf("ErrMsg = %q, want the pod and the cause", reply.ErrMsg)
	}
}

func TestServer_ReleaseIP(t *testing.T) {
	b := &recordingBackend{release: func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, bool, error) {
		if pod.Name == "held" {
			return podip.Endpoint{IP: "10.0.0.7"}, true, nil
		}
		return podip.Endpoint{}, false, nil
	}}
	c := serve(t, DefaultConfig(), b, nil)
	held, err := c.ReleaseIP(context.Background(), releaseReq("held", "1"))
	if err != nil || !held.IsSuccess || held.GetENIMultiIP().GetIP() != "10.0.0.7" {
		t.Fatalf("release of a held IP = %v, err %v", held, err)
	}
	unknown, err := c.ReleaseIP(context.Background(), releaseReq("gone", "1"))
	if err != nil || !unknown.IsSuccess || unknown.GetENIMultiIP() != nil {
		t.Fatalf("release of an unknown pod = %v, err %v; want success without payload", unknown, err)
	}
}

// A DEL of another IPAM's IP type must not block the pod's teardown: it
// reaches the backend as a BCC release, which succeeds with nothing when we
// hold nothing and frees what we do hold.
func TestServer_ReleaseIP_ForeignIPTypes(t *testing.T) {
	b := &recordingBackend{release: func(ctx context.Context, pod podip.PodRef) (podip.Endpoint, bool, error) {
		if pod.Name == "held" {
			return podip.Endpoint{IP: "10.0.0.7"}, true, nil
		}
		return podip.Endpoint{}, false, nil
	}}
	c := serve(t, DefaultConfig(), b, nil)
	for _, typ := range []rpc.IPType{rpc.IPType_BBCPrimaryENIMultiIPType, rpc.IPType_CrossVPCENIIPType,
		rpc.IPType_RoCEENIMultiIPType, rpc.IPType_ERIENIMultiIPType} {
		req := releaseReq("gone", "1")
		req.IPType = typ
		none, err := c.ReleaseIP(context.Background(), req)
		if err != nil || !none.IsSuccess || none.GetENIMultiIP() != nil || none.IPType != typ {
			t.Fatalf("%s release of a pod we hold nothing for = %v, err %v; want success without payload in its type", typ, none, err)
		}
		req = releaseReq("held", "1")
		req.IPType = typ
		held, err := c.ReleaseIP(context.Background(), req)
		if err != nil || !held.IsSuccess || held.GetENIMultiIP().GetIP() != "10.0.0.7" || held.IPType != rpc.IPType_BCCMultiENIMultiIPType {
			t.Fatalf("%s release of a pod holding a BCC IP = %v, err %v; want it released as BCC", typ, held, err)
		}
	}
	if calls := b.Calls(); len(calls) != 8 {
		t.Fatalf("backend saw %d releases, want 8", len(calls))
	}
}

func TestServer_CheckIP_IsTruthful(t *testing.T) {
	c := serve(t, DefaultConfig(), &recordingBackend{}, nil)
	known, _ := c.CheckIP(context.Background(), checkReq("known", "1"))
	if !known.IsSuccess || known.GetENIMultiIP().GetIP() != "10.0.0.9" {
		t.Fatalf("check of a pod with an IP = %v", known)
	}
	none, _ := c.CheckIP(context.Background(), checkReq("other", "1"))
	if none.IsSuccess {
		t.Fatalf("check of a pod without an IP = %v, want failure", none)
	}
}

func TestConfig_Validate(t *testing.T) {
	for name, change := range map[string]func(*Config){
		"negative concurrency": func(c *Config) { c.AllocateConcurrency = -1 },
		"negative slot wait":   func(c *Config) { c.SlotWait = -time.Second },
		"zero allocations":     func(c *Config) { c.AllocateConcurrency = 0 },
		"zero releases":        func(c *Config) { c.ReleaseConcurrency = 0 },
		"zero timeout":         func(c *Config) { c.RequestTimeout = 0 },
	} {
		c := DefaultConfig()
		change(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, c)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("the defaults rejected: %v", err)
	}
}

// The flags hold the only defaults, and they are what users' command lines
// have always had.
func TestConfig_DefaultsAreTheFlags(t *testing.T) {
	var flagged Config
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	flagged.RegisterFlags(fs)
	want := Config{AllocateConcurrency: 20, ReleaseConcurrency: 30, SlotWait: 5 * time.Second, RequestTimeout: 30 * time.Second}
	if flagged != want || DefaultConfig() != want {
		t.Fatalf("flag defaults %+v, DefaultConfig %+v, want %+v", flagged, DefaultConfig(), want)
	}
}

func TestNewServer_PanicsOnInvalidConfig(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("NewServer accepted a zero config (every call would be answered busy)")
		}
	}()
	NewServer(Config{}, &recordingBackend{}, nil, nil)
}

func newMetricsForRead(t *testing.T, reg *prometheus.Registry) func(method, result string) float64 {
	t.Helper()
	return func(method, result string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "cce_ipam_cni_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["method"] == method && labels["result"] == result {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
}

type forwardedMark struct{}

// WithForwarded splits the metrics by hop: a call its test calls forwarded
// is not counted as an entry, so hop="entry" counts each CNI call once.
func TestServer_Metrics_HopLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewServer(DefaultConfig(), &recordingBackend{}, nil, reg, WithForwarded(func(ctx context.Context) bool {
		return ctx.Value(forwardedMark{}) != nil
	}))
	fwd := context.WithValue(context.Background(), forwardedMark{}, true)
	for _, ctx := range []context.Context{context.Background(), fwd, fwd} {
		if reply, err := s.AllocateIP(ctx, allocReq("default", "web-0", "abc")); err != nil || !reply.IsSuccess {
			t.Fatalf("AllocateIP: %v, %v", reply, err)
		}
	}
	for hop, want := range map[string]float64{HopEntry: 1, HopForwarded: 2} {
		if got := testutil.ToFloat64(s.metrics.requests.WithLabelValues(methodAllocate, resultOK, hop)); got != want {
			t.Errorf("cce_ipam_cni_requests_total{hop=%q} = %v, want %v", hop, got, want)
		}
	}
}
