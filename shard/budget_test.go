package shard

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cce-ipam/sharded/cloud"
)

// The budget tests drive one replica's budget by hand (observe, then
// adjust) over a fake API server shared with the "other replicas", whose
// objects the tests write directly. Budget: 10/s, burst 5.
const testGlobalRate, testGlobalBurst = 10, 5

type budgetEnv struct {
	t    *testing.T
	ctx  context.Context
	kube *fake.Clientset
	clk  *clocktesting.FakeClock
	c    *Coordinator // replica r0
}

func newBudgetEnv(t *testing.T, followDemand bool) *budgetEnv {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	kube := fake.NewClientset()
	nodeInf := informers.NewSharedInformerFactory(kube, 0).Core().V1().Nodes().Informer()
	cfg := DefaultConfig()
	cfg.Namespace, cfg.BudgetFollowDemand = "ns", followDemand
	c, err := New(cfg, "r0",
		Addresses{GRPC: "127.0.0.1:1", HTTP: "127.0.0.1:2"},
		Deps{Kube: kube, Nodes: noNodes{}, NodeInformer: nodeInf, Clock: clk,
			Budget: rateRecorder{}, GlobalRate: testGlobalRate, GlobalBurst: testGlobalBurst}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &budgetEnv{t: t, ctx: context.Background(), kube: kube, clk: clk, c: c}
	renew(t, c) // r0's lease is valid
	return e
}

// peer creates another replica's Lease and returns its resourceVersion (set
// here: the fake API server keeps what it is given).
func (e *budgetEnv) peer(m string) string {
	e.t.Helper()
	l, err := e.kube.CoordinationV1().Leases("ns").Create(e.ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: ReplicaLeaseName(m), Labels: map[string]string{labelKind: kindReplica}, ResourceVersion: "7"}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.ResourceVersion
}

// sees sets what r0's watch shows of m's Lease: version (or "" for absent),
// unchanged since age ago.
func (e *budgetEnv) sees(m, version string, age time.Duration) {
	e.c.seen[m] = observed{version: version, since: e.clk.Now().Add(-age)}
	e.c.publish()
}

// putShares writes the budget Lease's shares annotation as another replica
// (or a corruption) would.
func (e *budgetEnv) putShares(raw string) {
	e.t.Helper()
	leases := e.kube.CoordinationV1().Leases("ns")
	l, err := leases.Get(e.ctx, budgetLeaseName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: budgetLeaseName, Labels: map[string]string{labelKind: kindBudget}}}
		l.Annotations = map[string]string{annoShares: raw}
		_, err = leases.Create(e.ctx, l, metav1.CreateOptions{})
	} else if err == nil {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[annoShares] = raw
		_, err = leases.Update(e.ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// shares reads the published shares back (as written, unvalidated).
func (e *budgetEnv) shares() map[string]Share {
	e.t.Helper()
	l, err := e.kube.CoordinationV1().Leases("ns").Get(e.ctx, budgetLeaseName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]Share{}
	if err := json.Unmarshal([]byte(l.Annotations[annoShares]), &out); err != nil {
		e.t.Fatalf("published shares %q: %v", l.Annotations[annoShares], err)
	}
	return out
}

// adjust feeds r0 the budget Lease as its watch would show it (lease; nil:
// the API server's current one) and the live set, then runs one adjustment.
func (e *budgetEnv) adjust(lease *coordv1.Lease, live ...string) {
	e.t.Helper()
	if lease == nil {
		l, err := e.kube.CoordinationV1().Leases("ns").Get(e.ctx, budgetLeaseName, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatal(err)
		}
		if err == nil {
			lease = l
		}
	}
	e.c.budget.observe(lease, live, len(live))
	e.c.budget.adjust(e.ctx)
}

func (e *budgetEnv) budgetLease() *coordv1.Lease {
	e.t.Helper()
	l, err := e.kube.CoordinationV1().Leases("ns").Get(e.ctx, budgetLeaseName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

// checkSum fails the test when r0's actual share plus the others'
// published shares exceed the budget (I5).
func (e *budgetEnv) checkSum(when string) {
	e.t.Helper()
	mine := e.c.Budget()
	if !e.c.budget.held() {
		mine = Share{}
	}
	sum := mine.Rate
	for m, s := range e.shares() {
		if m != "r0" {
			sum += s.Rate
		}
	}
	if sum > testGlobalRate+rateEpsilon {
		e.t.Fatalf("%s: r0 holds %v/s and the others' published shares %v: %.2f/s in all, above the budget %d/s",
			when, mine.Rate, e.shares(), sum, testGlobalRate)
	}
}

// (b) A watch that stalled makes a live peer look expired. Its share must
// not be dropped on that view alone: only once a direct read of its Lease
// confirms it (unchanged since we last saw it, or gone in both views).
func TestBudget_StalledWatchKeepsLivePeersShare(t *testing.T) {
	e := newBudgetEnv(t, false)
	rv1 := e.peer("r1")
	// r0's watch stalled on an old version of r1's Lease, seen 10 s ago;
	// r1 has renewed since (its Lease is at rv1).
	e.sees("r1", "stale-version", 10*time.Second)
	// r2 is gone for good: never seen by r0, no Lease.
	e.putShares(`{"r1":{"rate":5,"burst":2,"busy":true},"r2":{"rate":2,"burst":1,"busy":true}}`)
	e.adjust(nil, "r0") // in r0's view it is alone
	got := e.shares()
	if _, ok := got["r1"]; !ok {
		t.Fatalf("r0 dropped live r1's share on a stalled watch's word: shares now %v", got)
	}
	if _, ok := got["r2"]; ok {
		t.Fatalf("r2's share was kept though its Lease is gone in both views: %v", got)
	}
	e.checkSum("after a raise with a stalled watch")
	if s := e.c.Budget(); s.Rate != 5 {
		t.Fatalf("r0's share = %v/s, want the 5/s r1 leaves", s.Rate)
	}

	// Now r1 really expired: its Lease is still the version r0 saw a
	// lease duration ago. Its share goes and r0 takes the whole budget.
	e.sees("r1", rv1, 10*time.Second)
	e.adjust(nil, "r0")
	if got := e.shares(); len(got) != 1 || got["r0"].Rate != testGlobalRate {
		t.Fatalf("shares after r1 expired = %v, want r0 alone at %d/s", got, testGlobalRate)
	}
}

// (c) A replica whose entry vanished from the budget Lease (another replica
// dropped it, the object was reset) must not keep spending its old share:
// others may have taken the room. It drops to zero and asks again.
func TestBudget_OwnShareGoneDropsToZero(t *testing.T) {
	e := newBudgetEnv(t, false)
	rv1 := e.peer("r1")
	e.sees("r1", rv1, 0)
	e.adjust(nil, "r0", "r1")
	if s := e.c.Budget(); s.Rate != 5 || !e.c.budget.held() {
		t.Fatalf("r0's even share = %+v (held %v), want 5/s", s, e.c.budget.held())
	}
	// A watch that has not caught up with r0's own write shows no entry for
	// r0: that alone is no reason to drop it.
	e.adjust(&coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: budgetLeaseName}}, "r0", "r1")
	if s := e.c.Budget(); s.Rate != 5 || !e.c.budget.held() {
		t.Fatalf("r0's share after a lagging watch = %+v (held %v), want it kept at 5/s", s, e.c.budget.held())
	}

	// r1, with a view in which r0 was dead, dropped r0's entry and took it all.
	e.putShares(`{"r1":{"rate":10,"burst":5,"busy":true}}`)
	e.adjust(nil, "r0", "r1")
	e.checkSum("after r0's entry vanished")
	if err := e.c.fence.Gate(); err == nil {
		t.Fatalf("r0's gate is open with its share gone from the budget Lease (share %+v)", e.c.Budget())
	}
	// r1 lowers to its even share: r0 asks again through the normal path.
	e.putShares(`{"r1":{"rate":5,"burst":2,"busy":true}}`)
	e.adjust(nil, "r0", "r1")
	e.checkSum("after r1 lowered")
	if s := e.c.Budget(); s.Rate != 5 || !e.c.budget.held() {
		t.Fatalf("r0's share after r1 lowered = %+v (held %v), want 5/s again", s, e.c.budget.held())
	}
}

// (c) The same, found by a publish: r0's watch still shows its entry, but
// the Lease read for the CAS has none. r0 must not write its share back
// unchecked (here: a lower one, as a third replica joins).
func TestBudget_PublishFindsOwnShareGone(t *testing.T) {
	e := newBudgetEnv(t, false)
	for _, m := range []string{"r1", "r2"} {
		e.sees(m, e.peer(m), 0)
	}
	e.adjust(nil, "r0", "r1")
	stale := e.budgetLease() // shows r0 at 5/s
	e.putShares(`{"r1":{"rate":10,"burst":5,"busy":true}}`)
	e.adjust(stale, "r0", "r1", "r2") // wants 3.33/s: the lower branch publishes
	e.checkSum("after a publish found r0's entry gone")
	if err := e.c.fence.Gate(); err == nil {
		t.Fatalf("r0's gate is open after a publish found its entry gone (share %+v)", e.c.Budget())
	}
}

// (d) Shares read from the Lease are validated: a negative, infinite,
// NaN or absurd entry is never used as a rate (nor summed); a replica whose
// own entry is invalid treats it as gone.
func TestBudget_InvalidSharesAreIgnored(t *testing.T) {
	for _, tc := range []struct {
		name, r1 string
	}{
		{"negative idle rate", `{"rate":-10,"burst":-5}`},
		{"absurd rate", `{"rate":1e300,"burst":1,"busy":true}`},
		{"absurd burst", `{"rate":1,"burst":9000000000000000000,"busy":true}`},
		{"not an object", `"fast"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newBudgetEnv(t, true) // demand-following sums the idle shares
			e.sees("r1", e.peer("r1"), 0)
			e.putShares(`{"r1":` + tc.r1 + `}`)
			e.adjust(nil, "r0", "r1")
			s := e.c.Budget()
			if !e.c.budget.held() || !(s.Rate > 0) || s.Rate > testGlobalRate || s.Burst > testGlobalBurst {
				t.Fatalf("with r1's entry %s, r0's share = %+v (held %v), want a share within the budget", tc.r1, s, e.c.budget.held())
			}
		})
	}
	t.Run("own entry", func(t *testing.T) {
		e := newBudgetEnv(t, false)
		e.sees("r1", e.peer("r1"), 0)
		e.adjust(nil, "r0", "r1")
		e.putShares(`{"r0":{"rate":1e300,"burst":-1},"r1":{"rate":5,"burst":2,"busy":true}}`)
		e.adjust(nil, "r0", "r1")
		if got := e.shares()["r0"]; got.Rate != 5 || got.Burst != 2 {
			t.Fatalf("r0's corrupt entry was left in place: %+v, want it written again as 5/s burst 2", got)
		}
		e.checkSum("after r0's entry was corrupted")
	})
	for _, s := range []Share{{Rate: math.NaN(), Burst: 1}, {Rate: math.Inf(1), Burst: 1}, {Rate: math.Inf(-1)}, {Rate: -1}, {Rate: 1, Burst: -1}} {
		if validShare(s) {
			t.Errorf("validShare(%+v) = true", s)
		}
	}
	for _, s := range []Share{{}, {Busy: true}, {Rate: 3.3, Burst: 2}} {
		if !validShare(s) {
			t.Errorf("validShare(%+v) = false", s)
		}
	}
}

// The others' shares sum to a hair below the budget (float residue): r0's
// headroom is 1.8e-15/s. No limiter can run that slowly (the token bucket
// library panicked on it and took a replica down in the chaos suite): r0
// must treat it as no headroom, not set it.
func TestBudget_FloatResidueIsNoHeadroom(t *testing.T) {
	e := newBudgetEnv(t, false)
	lim, err := cloud.NewLimiter(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	e.c.budget.setter = lim
	e.peer("r1")
	e.peer("r2")
	e.sees("r1", "7", 0)
	e.sees("r2", "7", 0)
	e.putShares(`{"r1":{"rate":3.333333333333333,"burst":2,"busy":true},"r2":{"rate":6.666666666666665,"burst":2,"busy":true}}`)
	e.adjust(nil, "r0", "r1", "r2")
	if s := e.c.Budget(); e.c.budget.held() && s.Rate < cloud.MinRate {
		t.Fatalf("r0 holds a share of %v/s", s.Rate)
	}
	if rate, _ := lim.Rate(); rate != 1 {
		t.Fatalf("r0's limiter was set to %v/s", rate)
	}
	e.checkSum("after the raise")
}

// A rolling update lowers the budget: r0 still runs with the old 100/s, r1
// restarts with 10/s. r0 must lower to r1's budget so that r1 gets a share;
// r1 never holds one while the two sum above its budget. (Before each entry
// carried its replica's budget, r1 found r0 holding 100/s, got no share and
// never became ready.)
func TestBudget_RollingUpdateToASmallerBudget(t *testing.T) {
	e := newBudgetEnv(t, false) // r0 is only used for the clock and fake API server
	old := newBudgetReplica(t, e, "old", 100, 50)
	restarted := newBudgetReplica(t, e, "new", testGlobalRate, testGlobalBurst)
	for _, pair := range [][2]*Coordinator{{old, restarted}, {restarted, old}} {
		l, err := e.kube.CoordinationV1().Leases("ns").Get(e.ctx, ReplicaLeaseName(pair[1].self), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pair[0].seen[pair[1].self] = observed{version: l.ResourceVersion, since: e.clk.Now()}
		pair[0].publish()
	}
	step := func(c *Coordinator, live ...string) {
		t.Helper()
		l, err := e.kube.CoordinationV1().Leases("ns").Get(e.ctx, budgetLeaseName, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if err != nil {
			l = nil
		}
		c.budget.observe(l, live, len(live))
		c.budget.adjust(e.ctx)
	}
	step(old, "old") // alone, with the old budget
	if s := old.Budget(); s.Rate != 100 {
		t.Fatalf("old replica alone holds %+v, want 100/s", s)
	}
	for i := range 6 {
		step(restarted, "old", "new")
		step(old, "old", "new")
		if restarted.budget.held() {
			sum := restarted.Budget().Rate + e.shares()["old"].Rate
			if sum > testGlobalRate+rateEpsilon {
				t.Fatalf("round %d: the restarted replica holds %v/s while the old one publishes %v: %.2f/s, above its budget %d/s",
					i, restarted.Budget(), e.shares()["old"], sum, testGlobalRate)
			}
		}
	}
	if !restarted.budget.held() || restarted.Budget().Rate != testGlobalRate/2 {
		t.Fatalf("the restarted replica holds %+v (held %v), want half of %d/s: shares %v",
			restarted.Budget(), restarted.budget.held(), testGlobalRate, e.shares())
	}
	if s := old.Budget(); s.Rate > testGlobalRate/2+rateEpsilon {
		t.Fatalf("the old replica still holds %+v, want at most half of the smaller budget", s)
	}
	if got := e.shares()["new"]; got.Limit != testGlobalRate || got.LimitBurst != testGlobalBurst {
		t.Errorf("the restarted replica published %+v, want its budget %d/%d in it", got, testGlobalRate, testGlobalBurst)
	}
}

// newBudgetReplica is another replica with its own budget on e's fake API
// server and clock, its replica Lease renewed.
func newBudgetReplica(t *testing.T, e *budgetEnv, name string, rate float64, burst int64) *Coordinator {
	t.Helper()
	nodeInf := informers.NewSharedInformerFactory(e.kube, 0).Core().V1().Nodes().Informer()
	cfg := DefaultConfig()
	cfg.Namespace = "ns"
	c, err := New(cfg, name,
		Addresses{GRPC: "127.0.0.1:1", HTTP: "127.0.0.1:2"},
		Deps{Kube: e.kube, Nodes: noNodes{}, NodeInformer: nodeInf, Clock: e.clk,
			Budget: rateRecorder{}, GlobalRate: rate, GlobalBurst: burst}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	renew(t, c)
	return c
}
