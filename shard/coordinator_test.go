package shard

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

type noNodes struct{}

func (noNodes) ServeNodes(context.Context, []string) map[string]error { return nil }
func (noNodes) StopServingNode(string)                                {}

// newTestCoordinator is a Coordinator over a fake clientset and clock, for
// narrow tests of its fencing rules (the process-level tests use a real API
// server).
func newTestCoordinator(t *testing.T) (*Coordinator, *clocktesting.FakeClock) {
	t.Helper()
	return newTestCoordinatorWith(t, func(*Config) {})
}

// newTestCoordinatorWith is newTestCoordinator with a config of the test's.
func newTestCoordinatorWith(t *testing.T, configure func(*Config)) (*Coordinator, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	kube := fake.NewClientset()
	nodeInf := informers.NewSharedInformerFactory(kube, 0).Core().V1().Nodes().Informer()
	cfg := DefaultConfig()
	cfg.Namespace = "ns"
	cfg.ColdStartSettle = 0 // the tests that want the hold ask for it
	configure(&cfg)
	c, err := New(cfg, "r0", Addresses{GRPC: "127.0.0.1:1", HTTP: "127.0.0.1:2"},
		Deps{Kube: kube, Nodes: noNodes{}, NodeInformer: nodeInf, Clock: clk}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

// renew writes the replica Lease and applies the renewal as the loop would.
func renew(t *testing.T, c *Coordinator) {
	t.Helper()
	renewed := c.writeLease(context.Background())
	if renewed == nil {
		t.Fatal("renewing the replica lease failed")
	}
	renewed()
}

// serveByHand moves partition p to Serving as won claims do, and publishes.
func serveByHand(t *testing.T, c *Coordinator, p int) {
	t.Helper()
	if err := c.own.set(p, Claiming); err != nil {
		t.Fatal(err)
	}
	if err := c.own.set(p, Serving); err != nil {
		t.Fatal(err)
	}
	c.publish()
}

// After a pause longer than the renew deadline, a successful renewal must not
// make the old claims servable again: every partition is fenced first and
// must be won again by CAS (a watch that has not caught up may still show
// the claims as ours).
func TestCoordinator_LapsedLeaseFencesBeforeRenewalCounts(t *testing.T) {
	c, clk := newTestCoordinator(t)
	ctx := context.Background()
	const node = "node-a"
	p := PartitionOf(c.cfg.Ring.Partitions, node)

	renew(t, c) // creates the replica Lease; valid for RenewDeadline
	serveByHand(t, c, p)
	if _, err := c.MayAct(node); err != nil {
		t.Fatalf("serving with a fresh lease: %v", err)
	}

	clk.Step(c.cfg.LeaseDuration + time.Second) // paused past the lease
	if _, err := c.MayAct(node); err == nil {
		t.Fatal("MayAct allowed a write after the lease lapsed")
	}
	renewed := c.writeLease(ctx) // the first renewal after SIGCONT succeeds
	if renewed == nil {
		t.Fatal("the renewal failed")
	}
	if _, err := c.MayAct(node); err == nil {
		t.Fatal("a renewal after a lapse re-armed the old claim before it was fenced")
	}
	// The loop applies the renewal: the partition is fenced, the lease valid.
	renewed()
	if st := c.own.State(p); st != Unowned {
		t.Fatalf("partition state after the relapse = %s, want unowned", st)
	}
	if !c.LeaseValid() {
		t.Fatal("the lease is not valid after the renewal was applied")
	}
	if _, err := c.MayAct(node); err == nil {
		t.Fatal("MayAct allowed a write on a claim that must be won again")
	}
	if err := c.fence.Gate(); err != nil {
		t.Fatalf("gate with no budget configured: %v", err)
	}
}

// A renewal that is not late extends the lease and fences nothing.
func TestCoordinator_TimelyRenewalKeepsServing(t *testing.T) {
	c, clk := newTestCoordinator(t)
	const node = "node-b"
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	renew(t, c)
	serveByHand(t, c, p)
	for range 10 {
		clk.Step(c.cfg.RenewPeriod)
		renew(t, c)
		if st := c.own.State(p); st != Serving {
			t.Fatalf("a timely renewal fenced the partition (state %s)", st)
		}
	}
	if _, err := c.MayAct(node); err != nil {
		t.Fatalf("timely renewals: %v", err)
	}
}

// A claim that still names this replica after a fenced stop, for a partition
// the ring now gives to another replica, is released (else nobody could
// take it while this replica's lease stays fresh: the node would have no
// owner for good). Found by the chaos suite.
func TestCoordinator_ReleasesOrphanedClaims(t *testing.T) {
	c, _ := newTestCoordinator(t)
	ctx := context.Background()
	renew(t, c)
	ring, err := NewRing(c.cfg.Ring, []string{"r0", "r1"})
	if err != nil {
		t.Fatal(err)
	}
	owners := ring.Table().Owners
	theirs, ours := -1, -1
	for p, o := range owners {
		if o == "r1" && theirs < 0 {
			theirs = p
		}
		if o == "r0" && ours < 0 {
			ours = p
		}
	}
	leases := c.kube.CoordinationV1().Leases("ns")
	claims := make([]Claim, c.cfg.Ring.Partitions)
	for _, p := range []int{theirs, ours} {
		l, err := leases.Create(ctx, &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: PartitionLeaseName(p), Labels: map[string]string{labelKind: kindPartition}},
			Spec:       coordv1.LeaseSpec{HolderIdentity: ptr.To("r0")},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claims[p] = Claim{Holder: "r0", Version: l.ResourceVersion}
	}
	c.ring, c.live = ring, []string{"r0", "r1"}
	acts, err := c.own.Step(c.view(c.clock.Now(), c.live, claims, nil))
	if err != nil {
		t.Fatal(err)
	}
	c.publish()
	for _, a := range acts {
		c.startAction(ctx, a, claims[a.Partition])
	}
	deadline := time.After(10 * time.Second)
	for c.inFlight.io > 0 {
		select {
		case f := <-c.results:
			f()
		case <-deadline:
			t.Fatal("the releases and claims did not finish")
		}
	}
	if c.own.Releasing() {
		t.Fatal("the orphan release finished but the Ownership still counts it in flight")
	}
	got, err := leases.Get(ctx, PartitionLeaseName(theirs), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(got.Spec.HolderIdentity, ""); h != "" {
		t.Fatalf("orphaned claim of partition %d still held by %q", theirs, h)
	}
	mine, err := leases.Get(ctx, PartitionLeaseName(ours), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(mine.Spec.HolderIdentity, ""); h != "r0" {
		t.Fatalf("a claim the ring still gives us was released (holder %q): it is reclaimed, not dropped", h)
	}
}

// The driver shows the Ownership the holds: no budget share, and the
// fencing policy required but missing.
func TestCoordinator_ViewCarriesTheHolds(t *testing.T) {
	c, _ := newTestCoordinator(t)
	renew(t, c)
	claims := make([]Claim, c.cfg.Ring.Partitions)
	if v := c.view(c.clock.Now(), []string{"r0"}, claims, nil); !v.BudgetHeld || v.PolicyHold != "" {
		t.Fatalf("without a budget to split or a policy required: held %v, policy hold %q", v.BudgetHeld, v.PolicyHold)
	}
	c.budget.setter = rateRecorder{}
	if v := c.view(c.clock.Now(), []string{"r0"}, claims, nil); v.BudgetHeld {
		t.Fatal("the view says a share is held before one was granted")
	}
	c.budget.set(Share{Rate: 5, Burst: 2}, true)
	if v := c.view(c.clock.Now(), []string{"r0"}, claims, nil); !v.BudgetHeld {
		t.Fatal("the view says no share is held with a granted share")
	}
}

// refusePartitionCreates makes the fake API server refuse claim creates, so
// 271 new objects do not overflow the fake watcher's 100-event channel
// (which panics the informer); tests count the claims started instead.
func refusePartitionCreates(c *Coordinator) {
	c.kube.(*fake.Clientset).PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.CreateAction).GetObject().(*coordv1.Lease)
		if strings.HasPrefix(l.Name, partitionPrefix) {
			return true, nil, errors.New("test: partition claims are not stored")
		}
		return false, nil, nil
	})
}

type rateRecorder struct{}

func (rateRecorder) SetRate(float64, int64) error { return nil }

// The hold reaches the ownership: a held step starts no claim, and the first
// step after the settle claims every partition the ring gives us.
func TestCoordinator_HeldStepClaimsNothing(t *testing.T) {
	c, clk := newTestCoordinatorWith(t, func(cfg *Config) { cfg.ColdStartSettle = 2 * time.Second })
	// The claims are counted when they start.
	refusePartitionCreates(c)
	ctx := context.Background()
	renew(t, c)
	stop := make(chan struct{})
	defer close(stop)
	c.leaseInformers.Start(stop)
	c.leaseInformers.WaitForCacheSync(stop)
	if err := c.step(ctx); err != nil {
		t.Fatal(err)
	}
	inFlight := c.inFlight.claims
	if inFlight != 0 {
		t.Fatalf("a held step started %d claims", inFlight)
	}
	clk.Step(2100 * time.Millisecond)
	renew(t, c)
	if err := c.step(ctx); err != nil {
		t.Fatal(err)
	}
	inFlight = c.inFlight.claims
	if inFlight != c.cfg.Ring.Partitions {
		t.Fatalf("after the settle the step started %d claims, want all %d", inFlight, c.cfg.Ring.Partitions)
	}
}

// recordingNodes reports every ServeNodes batch.
type recordingNodes struct{ batches chan []string }

func (r recordingNodes) ServeNodes(_ context.Context, names []string) map[string]error {
	r.batches <- names
	return nil
}
func (recordingNodes) StopServingNode(string) {}

// Nodes already won wait while claims are still in flight, so that claims
// won together are served in one batch (one ENI list, one wep read); the
// wait is bounded by claimSettle.
func TestCoordinator_BatchWaitsForClaimsInFlight(t *testing.T) {
	c, clk := newTestCoordinator(t)
	rec := recordingNodes{batches: make(chan []string, 1)}
	c.nodes = rec
	const node = "node-a"
	if err := c.nodeInformer.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: corev1.NodeSpec{ProviderID: "cce://i-a"}}); err != nil {
		t.Fatal(err)
	}
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	ctx := context.Background()
	if err := c.own.set(p, Claiming); err != nil {
		t.Fatal(err)
	}
	if err := c.own.set(p, Serving); err != nil {
		t.Fatal(err)
	}
	// Another partition's claim has been in flight for 2 s: past the old
	// 1 s cut, within claimSettle.
	c.inFlight.claims, c.inFlight.claimsSince = 1, clk.Now()
	clk.Step(2 * time.Second)
	c.reconcileNodes(ctx, clk.Now(), c.servedNodes())
	select {
	case b := <-rec.batches:
		t.Fatalf("served %v while a claim was in flight for 2 s, want the batch to wait for it", b)
	case <-time.After(200 * time.Millisecond):
	}
	clk.Step(claimSettle)
	c.reconcileNodes(ctx, clk.Now(), c.servedNodes())
	select {
	case b := <-rec.batches:
		if len(b) != 1 || b[0] != node {
			t.Fatalf("served %v, want [%s]", b, node)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("nothing served %v after the claims went in flight, want the wait bounded", 2*time.Second+claimSettle)
	}
}

// A replica with a claim in flight is not ready: every other replica may
// already see the claim as ours, and a rolling update that trusted "ready"
// would stop the next replica before this one serves its share.
func TestCoordinator_NotReadyWhileClaiming(t *testing.T) {
	c, clk := newTestCoordinator(t)
	ctx := context.Background()
	renew(t, c)
	c.stepped = true
	c.reconcileNodes(ctx, clk.Now(), nil)
	if c.readyReason != "" {
		t.Fatalf("not ready with nothing to serve: %s", c.readyReason)
	}
	if err := c.own.set(7, Claiming); err != nil {
		t.Fatal(err)
	}
	c.reconcileNodes(ctx, clk.Now(), nil)
	if c.readyReason == "" {
		t.Fatal("ready while the claim of partition 7 is in flight")
	}
	if err := c.own.set(7, Serving); err != nil {
		t.Fatal(err)
	}
	c.reconcileNodes(ctx, clk.Now(), nil)
	if c.readyReason != "" {
		t.Fatalf("not ready once partition 7 (no nodes) is served: %s", c.readyReason)
	}
}

// Every replica serves the same nodes: those ipam.ServesNode accepts, read
// from the Node objects alone (a BBC node with a cce:// providerID is not
// served; an unlabelled one is).
func TestCoordinator_ServedNodesAreBCCNodes(t *testing.T) {
	c, _ := newTestCoordinator(t)
	for name, typ := range map[string]string{"bcc": "BCC", "gpu": "GPU", "dcc": "DCC", "bbc": "BBC", "old": ""} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: "cce://i-" + name}}
		if typ != "" {
			n.Labels = map[string]string{ipam.LabelInstanceTypeBeta: typ}
		}
		if err := c.nodeInformer.GetStore().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	got := c.servedNodes()
	slices.Sort(got)
	if want := []string{"bcc", "dcc", "gpu", "old"}; !slices.Equal(got, want) {
		t.Fatalf("served nodes %v, want %v", got, want)
	}
}
