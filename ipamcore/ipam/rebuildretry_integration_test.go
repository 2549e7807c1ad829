//go:build integration

package ipam_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/shard"
)

// A node the IPAM cannot rebuild (its providerID carries a path, so no
// instance can be read from it) must not be retried every second with a
// VPC-wide ListENIs: the coordinator backs the node off exponentially, so
// over a window of w seconds bce-sim sees O(log w) lists.
func TestCoordinator_UnrebuildableNodeBacksOff(t *testing.T) {
	// No node of its own: the only node to serve is the broken one. The ENI
	// sync is off so that every ListENIs counted is a rebuild's.
	e := newEnvIn(t, "rr", 0, testConfig(func(c *ipam.Config) {
		c.PoolCheckPeriod = time.Hour
		c.ENISyncPeriod = time.Hour
	}), world{annotateMaxIPs: true})
	const bad = "rr-bad-node"
	// A served BCC node whose rebuild cannot succeed: the cloud answers
	// every ENI list with a 500 (a providerID that does not parse no longer
	// works here: ipam.ServesNode leaves such a node unserved).
	if err := e.sim.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpListENIs: 1}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.sim.SetFaults(bcesim.Faults{}) })
	_, err := e.kube.CoreV1().Nodes().Create(e.ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: bad},
		Spec:       corev1.NodeSpec{ProviderID: "cce://i-rr-bad"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.kube.CoreV1().Nodes().Delete(context.Background(), bad, metav1.DeleteOptions{}) })

	scfg := shard.DefaultConfig()
	scfg.Namespace = e.ns
	scfg.Ring.Partitions = 7
	scfg.LeaveTimeout = 2 * time.Second
	scfg.ColdStartSettle = 0 // one replica: claim at once
	scfg.FencingPolicy = ""  // no fencing policy installed here
	coord, err := shard.New(scfg, "rr-0", shard.Addresses{GRPC: "127.0.0.1:1", HTTP: "127.0.0.1:2"},
		shard.Deps{Kube: e.kube, Nodes: e.ipam, NodeInformer: e.ipam.NodeInformer()},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- coord.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("coordinator Run: %v", err)
		}
		coord.Close()
	})

	// Each rebuild's list is sent 1 + SDKRetries times (the SDK retries a
	// 500): count rebuild attempts, not HTTP calls.
	perAttempt := int64(1 + cloud.DefaultConfig().SDKRetries)
	lists := func() int64 { return (e.sim.Stats().Ops[bcesim.OpListENIs].Calls + perAttempt - 1) / perAttempt }
	eventually(t, 30*time.Second, "the coordinator's first rebuild of the node", func() bool { return lists() > 0 })
	const window = 20 * time.Second
	time.Sleep(window)
	got := lists()
	// Doubling from 1 s: attempts at about 0, 1, 3, 7, 15 s; allow one
	// more for jitter and the first attempt's timing.
	limit := 2 + int(math.Log2(window.Seconds()))
	if got > int64(limit) {
		t.Fatalf("%d rebuilds in %s for one node that cannot be rebuilt, want at most %d (retries must back off)", got, window, limit)
	}
	t.Logf("%d rebuilds in %s (limit %d)", got, window, limit)
}

// A node whose ENI carries one malformed address in the cloud's reply is
// still served: the address is skipped, the others are used, and more are
// added as pods need them.
func TestIPAM_MalformedCloudAddressSkipped(t *testing.T) {
	e := newEnv(t, "mf", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 3
		c.IdleMax = 6
		c.BatchAdd = 4
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.ENISyncPeriod = time.Hour
	}))
	node, inst := e.nodes[0], e.instance[e.nodes[0]]
	eventually(t, 10*time.Second, "the pool filled", func() bool { return e.stats(node).Idle >= 3 })
	e.stop()

	// The address to garble: any secondary address on the node's ENI.
	var broken string
	for ip := range e.cloudIPs()[inst] {
		broken = ip
		break
	}
	if broken == "" {
		t.Fatal("the node's ENI has no secondary address")
	}
	// A proxy in front of bce-sim rewrites the address in every ENI read
	// reply into something that does not parse, as a garbled reply would.
	simURL, err := url.Parse(e.sim.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(simURL)
	rp.ModifyResponse = func(r *http.Response) error {
		if r.Request.Method != http.MethodGet || !strings.HasPrefix(r.Request.URL.Path, "/v1/eni") {
			return nil
		}
		body, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return err
		}
		body = bytes.ReplaceAll(body, []byte(`"`+broken+`"`), []byte(`"`+broken+`.999"`))
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	proxy := httptest.NewServer(rp)
	t.Cleanup(proxy.Close)
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = proxy.URL
	bceCfg.AccessKeyID = testAK
	bceCfg.SecretAccessKey = testSK
	bceCfg.Rate = 1e6
	bceCfg.Burst = 1e6
	bceCfg.SDKRetryBase = time.Millisecond
	bceCfg.ThrottleBackoff = time.Millisecond
	garbled, err := cloud.New(bceCfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(garbled.Close)
	enis, err := garbled.ListENIs(e.ctx, cloud.ListENIsOptions{VPCID: testVPC, InstanceID: inst})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, en := range enis {
		for _, p := range en.PrivateIPs {
			seen = append(seen, p.Address)
		}
	}
	if !slices.Contains(seen, broken+".999") {
		t.Fatalf("the proxy does not garble %s in the ENI list: %v", broken, seen)
	}

	// A new IPAM (a restart or a takeover) rebuilds the node through the
	// garbled replies.
	e.cloud = garbled
	e.start()
	pods := e.createPods("p", 8)
	replies := e.allocateAll(pods, 2)
	if len(replies) != len(pods) {
		t.Fatalf("%d of %d pods got an IP", len(replies), len(pods))
	}
	for name, r := range replies {
		if r.IP == broken {
			t.Fatalf("pod %s got %s, the address the cloud's reply garbled", name, r.IP)
		}
	}
	// The datastore has every cloud address but the skipped one (once the
	// refills the ADDs started have been recorded).
	var got, want int
	if !settles(10*time.Second, func() bool {
		got, want = e.stats(node).Total, len(e.cloudIPs()[inst])-1
		return got == want
	}) {
		t.Fatalf("datastore holds %d addresses, want %d (the cloud's minus the skipped one)", got, want)
	}
}
