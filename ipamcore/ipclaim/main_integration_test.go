//go:build integration

package ipclaim_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/cce-ipam/sharded/e2e/cluster"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	"github.com/cce-ipam/sharded/ipamcore/ipclaim"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

// setup installs the chart's CRDs (the IPClaim's among them) and deletes
// every claim before and after the test: claims are cluster-scoped, so the
// tests of this package, which run one after another, share them.
func setup(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	if err := cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	deleteAllClaims(ctx, t)
	t.Cleanup(func() { deleteAllClaims(context.Background(), t) })
	return ctx
}

func deleteAllClaims(ctx context.Context, t testing.TB) {
	t.Helper()
	err := admin().CceV1alpha1().IPClaims().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("delete every claim: %v", err)
	}
}

// clientConfig is the admin's, without client-side throttling: the
// contention test makes thousands of requests.
func clientConfig() *rest.Config {
	c := rest.CopyConfig(cp.Config)
	c.QPS, c.Burst = 5000, 5000
	return c
}

func admin() versioned.Interface { return versioned.NewForConfigOrDie(clientConfig()) }

// replica is one cce-ipam replica's ledger: its own client, claim informer
// and metrics.
type replica struct {
	name   string
	cs     versioned.Interface
	ledger *ipclaim.Ledger
	reg    *prometheus.Registry
	// freeze stops the replica's informer: its cache stays as it is (a
	// replica whose watch lags).
	freeze func()
}

func newReplica(ctx context.Context, t testing.TB, name string, cfg ipclaim.Config, clk clock.PassiveClock) *replica {
	t.Helper()
	rc := clientConfig()
	rc.UserAgent = "ipclaim-test/" + name
	cs := versioned.NewForConfigOrDie(rc)
	factory := externalversions.NewSharedInformerFactory(cs, 0)
	reg := prometheus.NewRegistry()
	l := ipclaim.New(cfg, cs, factory.Cce().V1alpha1().IPClaims(), clk, nil, reg)
	stop := make(chan struct{})
	stopped := false
	freeze := func() {
		if !stopped {
			stopped = true
			close(stop)
			factory.Shutdown()
		}
	}
	factory.Start(stop)
	t.Cleanup(freeze)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("replica %s: cache of %v did not sync", name, typ)
		}
	}
	if !l.HasSynced() {
		t.Fatalf("replica %s: the ledger is not synced after its informer", name)
	}
	return &replica{name: name, cs: cs, ledger: l, reg: reg, freeze: freeze}
}

// metric returns the value of a counter or gauge with the given labels
// (name=value pairs), 0 when absent.
func metric(t testing.TB, reg *prometheus.Registry, name string, labelPairs ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labelPairs) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// getClaim reads a claim from the API server; nil when absent.
func getClaim(ctx context.Context, t testing.TB, addr string) *cce.IPClaim {
	t.Helper()
	list, err := admin().CceV1alpha1().IPClaims().List(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + cce.ClaimName(netip.MustParseAddr(addr)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		return nil
	}
	return &list.Items[0]
}

// claimsOf lists the claims of a subnet (by label) from the API server.
func claimsOf(ctx context.Context, t testing.TB, subnetID string) []cce.IPClaim {
	t.Helper()
	list, err := admin().CceV1alpha1().IPClaims().List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{cce.LabelSubnetID: subnetID}).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func holderOf(c *cce.IPClaim) string {
	if c == nil {
		return "<no claim>"
	}
	if h, ok := ipclaim.HolderOf(c); ok {
		return h.String()
	}
	return "<free>"
}

// waitCached waits until a replica's cache shows a claim in the state want
// accepts (nil: absent).
func waitCached(ctx context.Context, t testing.TB, r *replica, addr string, want func(*cce.IPClaim) bool) {
	t.Helper()
	a := netip.MustParseAddr(addr)
	for {
		c, _ := r.ledger.Lookup(a)
		if want(c) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replica %s: the cache never showed the expected claim of %s (last: %s)", r.name, addr, describe(c))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func describe(c *cce.IPClaim) string {
	if c == nil {
		return "absent"
	}
	return fmt.Sprintf("holder %s rv %s spec %+v", holderOf(c), c.ResourceVersion, c.Spec)
}
