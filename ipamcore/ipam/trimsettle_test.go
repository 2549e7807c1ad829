package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	ccefake "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/fake"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// Only failures that certainly changed nothing put trimmed IPs back in the
// pool.
func TestDeleteNotApplied(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&cloud.Error{Class: cloud.ClassRateLimit}, true},
		{&cloud.Error{Class: cloud.ClassInvalidRequest}, true},
		{&cloud.Error{Class: cloud.ClassAuth}, true},
		{&cloud.Error{Class: cloud.ClassQuotaExceeded}, true},
		{fmt.Errorf("%w: %w", &cloud.Error{Class: cloud.ClassCanceled}, cloud.ErrWouldWait), true},
		{&cloud.Error{Class: cloud.ClassServer}, false},
		{&cloud.Error{Class: cloud.ClassTransport}, false},
		{&cloud.Error{Class: cloud.ClassCanceled}, false},
		{&cloud.Error{Class: cloud.ClassUnknown}, false},
		{&cloud.Error{Class: cloud.ClassENINotFound}, false},
		{context.DeadlineExceeded, false},
		{errors.New("connection reset by peer"), false},
	} {
		if got := deleteNotApplied(c.err); got != c.want {
			t.Errorf("deleteNotApplied(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

type countingCloud struct {
	cloud.Provider
	gets int
}

func (c *countingCloud) GetENI(context.Context, string) (*cloud.ENI, error) {
	c.gets++
	return nil, errors.New("unexpected")
}

type refuseAll struct{}

func (refuseAll) MayAct(string) (time.Time, error) { return time.Time{}, errors.New("lease at risk") }

// While the fence refuses the node, due settling reads are postponed, not
// left due: the pool worker's settle timer would otherwise fire at once,
// for ever.
func TestSettleTrimsPostponedWhileFenced(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	cl := &countingCloud{}
	cfg := DefaultConfig()
	cfg.ClusterID, cfg.VPCID = "c", "vpc-1"
	i, err := New(cfg, Deps{Kube: fake.NewClientset(), CCE: ccefake.NewSimpleClientset(),
		Cloud: cl, Clock: clk, Fence: refuseAll{}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const node = "n1"
	addr := netip.MustParseAddr("10.0.0.5")
	if err := i.store.AddNode(node); err != nil {
		t.Fatal(err)
	}
	if err := i.store.AddENI(node, datastore.ENI{ID: "eni-1", SubnetID: "sbn-1", PrimaryIP: netip.MustParseAddr("10.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	if err := i.store.AddIPs(node, "eni-1", []netip.Addr{addr}, clk.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := i.store.Hold(node, []netip.Addr{addr}, datastore.HoldReleasing); err != nil {
		t.Fatal(err)
	}
	if err := i.store.Unsettle(node, addr); err != nil {
		t.Fatal(err)
	}
	n := newNode(node, "i-1", pool.DefaultCapacity())
	u := settleReads{}
	u.owe(addr, "eni-1", clk.Now())
	i.settleTrims(context.Background(), n, u)
	if cl.gets != 0 {
		t.Fatalf("%d GetENI calls while fenced", cl.gets)
	}
	due, ok := u.next()
	if !ok || !due.After(clk.Now()) {
		t.Fatalf("next settle at %v (ok %v), want after now %v", due, ok, clk.Now())
	}
	if info, err := i.store.LookupIP(addr); err != nil || !unsettled(info) {
		t.Fatalf("address %v (err %v), want still held unsettled", info, err)
	}
}

// The pool planner does not count the addresses of the worker's own unclear
// trims as idle (the datastore's HoldUnsettled alone would): they were
// trimmed as surplus and are most likely gone, so the pool grows for
// waiting pods instead of waiting for the settling read.
func TestPoolStateUncountsOwnUnclearTrims(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.ClusterID, cfg.VPCID = "c", "vpc-1"
	i, err := New(cfg, Deps{Kube: fake.NewClientset(), CCE: ccefake.NewSimpleClientset(),
		Cloud: &countingCloud{}, Clock: clk}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const node = "n1"
	trimmed, other := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6")
	if err := i.store.AddNode(node); err != nil {
		t.Fatal(err)
	}
	if err := i.store.AddENI(node, datastore.ENI{ID: "eni-1", SubnetID: "sbn-1", PrimaryIP: netip.MustParseAddr("10.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	if err := i.store.AddIPs(node, "eni-1", []netip.Addr{trimmed, other}, clk.Now()); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{trimmed, other} {
		if _, err := i.store.Hold(node, []netip.Addr{a}, datastore.HoldUnsettled); err != nil {
			t.Fatal(err)
		}
	}
	n := newNode(node, "i-1", pool.DefaultCapacity())
	reads := settleReads{}
	if st, _ := i.poolState(n, reads); st.Idle() != 2 {
		t.Fatalf("idle = %d with no owed reads, want 2 (unsettled counts as idle)", st.Idle())
	}
	reads.owe(trimmed, "eni-1", clk.Now().Add(cfg.ReadLag))
	if st, _ := i.poolState(n, reads); st.Idle() != 1 {
		t.Fatalf("idle = %d with the trim's read owed, want 1", st.Idle())
	}
}
