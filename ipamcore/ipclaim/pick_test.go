package ipclaim

import (
	"context"
	"errors"
	"math/big"
	"net/netip"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/fake"
	"github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

func rng(first, last string) psts.Range {
	return psts.Range{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
}

// Every order visits every address of the ranges exactly once, whatever its
// start and stride (a stride that shares a factor with the size is moved to
// the next coprime one).
func TestWalk_OrderVisitsEveryAddressOnce(t *testing.T) {
	ranges := []psts.Range{rng("10.0.0.2", "10.0.0.9"), rng("10.0.0.20", "10.0.0.20"), rng("10.0.1.0", "10.0.1.2")}
	w, err := newWalk(ranges)
	if err != nil {
		t.Fatal(err)
	}
	if w.total.Int64() != 12 {
		t.Fatalf("total %s, want 12", w.total)
	}
	for start := int64(0); start < 14; start++ {
		for stride := int64(0); stride < 14; stride++ {
			seen := map[netip.Addr]bool{}
			o := w.order(big.NewInt(start), big.NewInt(stride))
			for {
				a, ok := o.next()
				if !ok {
					break
				}
				if seen[a] || !w.contains(a) {
					t.Fatalf("start %d stride %d: %s twice or outside the ranges", start, stride, a)
				}
				seen[a] = true
			}
			if len(seen) != 12 {
				t.Fatalf("start %d stride %d: %d addresses visited, want 12", start, stride, len(seen))
			}
		}
	}
	// Stride 1 from 0 is the ranges in order.
	o := w.order(big.NewInt(0), big.NewInt(1))
	var got []string
	for a, ok := o.next(); ok; a, ok = o.next() {
		got = append(got, a.String())
	}
	if got[0] != "10.0.0.2" || got[7] != "10.0.0.9" || got[8] != "10.0.0.20" || got[11] != "10.0.1.2" {
		t.Errorf("stride 1: %v", got)
	}
}

func TestWalk_ShuffledStaysInsideHugeIPv6Ranges(t *testing.T) {
	w, err := newWalk([]psts.Range{rng("fd00::", "fd00::ffff:ffff:ffff:ffff")})
	if err != nil {
		t.Fatal(err)
	}
	o := w.shuffled()
	seen := map[netip.Addr]bool{}
	for range 1000 {
		a, ok := o.next()
		if !ok || !w.contains(a) || seen[a] {
			t.Fatalf("%s (ok %v): outside the range or twice", a, ok)
		}
		seen[a] = true
	}
}

func TestNewWalk_RejectsBadRanges(t *testing.T) {
	for name, ranges := range map[string][]psts.Range{
		"reversed":     {rng("10.0.0.9", "10.0.0.2")},
		"two families": {rng("10.0.0.2", "10.0.0.9"), rng("fd00::1", "fd00::2")},
		"mixed ends":   {rng("10.0.0.2", "fd00::2")},
		"zero address": {{}},
		"IPv4-mapped":  {rng("::ffff:10.0.0.2", "::ffff:10.0.0.9")},
		"with a zone":  {rng("fe80::1%eth0", "fe80::2%eth0")},
	} {
		if _, err := newWalk(ranges); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if w, err := newWalk(nil); err != nil || w.total.Sign() != 0 {
		t.Errorf("no ranges: %v, total %v", err, w.total)
	}
}

// pickFixture is a ledger on a fake clientset whose claims are in the cache.
type pickFixture struct {
	ctx    context.Context
	cs     *fake.Clientset
	ledger *Ledger
	clk    *clocktesting.FakePassiveClock
}

func newPickFixture(t *testing.T, cfg Config, claims ...*cce.IPClaim) *pickFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	var objs []runtime.Object
	for _, c := range claims {
		objs = append(objs, c)
	}
	cs := fake.NewSimpleClientset(objs...)
	factory := externalversions.NewSharedInformerFactory(cs, 0)
	clk := clocktesting.NewFakePassiveClock(t0)
	l := New(cfg, cs, factory.Cce().V1alpha1().IPClaims(), clk, nil, nil)
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() {
		close(stop)
		factory.Shutdown()
	})
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", typ)
		}
	}
	cs.ClearActions()
	return &pickFixture{ctx: ctx, cs: cs, ledger: l, clk: clk}
}

// requests are the ledger's own requests since the fixture began: the
// informer's list and watch are left out (its watch may start just after
// the cache synced, when the fixture has already cleared the actions).
func (f *pickFixture) requests() []k8stesting.Action {
	var out []k8stesting.Action
	for _, a := range f.cs.Actions() {
		if v := a.GetVerb(); v != "list" && v != "watch" {
			out = append(out, a)
		}
	}
	return out
}

// actionName is the claim a request was about.
func actionName(a k8stesting.Action) string {
	switch a := a.(type) {
	case k8stesting.CreateAction: // and UpdateAction: the same methods
		return a.GetObject().(*cce.IPClaim).Name
	case k8stesting.GetAction:
		return a.GetName()
	}
	return ""
}

// writes counts the claim creates and updates made since the fixture began.
func (f *pickFixture) writes() (creates, updates int) {
	for _, a := range f.cs.Actions() {
		switch a.GetVerb() {
		case "create":
			creates++
		case "update":
			updates++
		}
	}
	return creates, updates
}

func heldBy10(addr string, h Holder) *cce.IPClaim {
	return newClaim("sbn-x", netip.MustParseAddr(addr), h, Attachment{}, t0.Add(-time.Hour))
}

// Pick tries only what its cache shows takeable and usable: held, cooling,
// blocked and corrupt claims and unusable addresses cost no request; the
// one free claim past its cooling is taken over.
func TestLedger_Pick_SkipsWhatTheCacheShowsTaken(t *testing.T) {
	other := Holder{"ns", "other"}
	cooling := claimOf("10.0.0.3")
	cooling.Spec.ReleasedAt = mt(t0.Add(-2 * time.Second))
	blocked := claimOf("10.0.0.4")
	blocked.Spec.ReleasedAt = mt(t0.Add(-time.Hour))
	blocked.Spec.NotBefore = mt(t0.Add(time.Minute))
	corrupt := claimOf("10.0.0.5")
	corrupt.Spec.IP = "10.0.0.99"
	cooled := claimOf("10.0.0.7")
	cooled.Spec.ReleasedAt = mt(t0.Add(-6 * time.Second))
	f := newPickFixture(t, DefaultConfig(),
		heldBy10("10.0.0.2", other), cooling, blocked, corrupt, heldBy10("10.0.0.6", other), cooled)
	unusable := netip.MustParseAddr("10.0.0.8")
	usable := func(a netip.Addr) bool { return a != unusable }
	h := Holder{"ns", "web-0"}

	for range 5 { // whatever the random order
		addr, err := f.ledger.Pick(f.ctx, "sbn-x", []psts.Range{rng("10.0.0.2", "10.0.0.8")}, usable, h, Attachment{Node: "n1"})
		if err != nil || addr.String() != "10.0.0.7" {
			t.Fatalf("Pick = %s, %v; want the cooled 10.0.0.7", addr, err)
		}
	}
	for _, a := range f.requests() {
		if name := actionName(a); name != "10.0.0.7" {
			t.Errorf("a request for %s (%s), which the cache showed taken", name, a.GetVerb())
		}
	}
	c, err := f.cs.CceV1alpha1().IPClaims().Get(f.ctx, "10.0.0.7", metav1GetOptions)
	if err != nil || c.Spec.Holder == nil || *c.Spec.Holder != (cce.IPClaimHolder{Namespace: "ns", Name: "web-0"}) ||
		c.Spec.ReleasedAt != nil || c.Spec.Node != "n1" {
		t.Fatalf("claim after the takeover: %+v, %v", c, err)
	}

	// Nothing else: exhausted, without a request.
	f.cs.ClearActions()
	_, err = f.ledger.Pick(f.ctx, "sbn-x", []psts.Range{rng("10.0.0.2", "10.0.0.6"), rng("10.0.0.8", "10.0.0.8")}, usable,
		Holder{"ns", "web-1"}, Attachment{})
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("Pick from taken addresses = %v, want ErrExhausted", err)
	}
	if len(f.requests()) != 0 {
		t.Errorf("an exhausted pick made requests: %v", f.requests())
	}
}

// A pick that loses every race (the cache shows nothing, the API server
// says every address is held) gives up after PickAttempts requests.
func TestLedger_Pick_BoundsLostRaces(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PickAttempts = 4
	f := newPickFixture(t, cfg)
	f.cs.PrependReactor("create", "ipclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		c := a.(k8stesting.CreateAction).GetObject().(*cce.IPClaim)
		return true, nil, apierrors.NewAlreadyExists(cce.Resource("ipclaims"), c.Name)
	})
	f.cs.PrependReactor("get", "ipclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.GetAction).GetName()
		addr, _ := cce.AddrOfClaimName(name)
		return true, heldBy10(addr.String(), Holder{"ns", "someone"}), nil
	})
	_, err := f.ledger.Pick(f.ctx, "sbn-x", []psts.Range{rng("10.0.0.0", "10.0.3.255")}, nil, Holder{"ns", "web-0"}, Attachment{})
	if !errors.Is(err, ErrTaken) {
		t.Fatalf("Pick = %v, want ErrTaken", err)
	}
	if creates, _ := f.writes(); creates != 4 {
		t.Errorf("%d creates, want 4 (PickAttempts)", creates)
	}
	// The addresses it lost are remembered: the next pick tries others.
	f.cs.ClearActions()
	_, _ = f.ledger.Pick(f.ctx, "sbn-x", []psts.Range{rng("10.0.0.0", "10.0.0.3")}, nil, Holder{"ns", "web-0"}, Attachment{})
	tried := map[string]bool{}
	for _, a := range f.cs.Actions() {
		if c, ok := a.(k8stesting.CreateAction); ok {
			tried[c.GetObject().(*cce.IPClaim).Name] = true
		}
	}
	if len(tried) > 4 {
		t.Errorf("tried %v", tried)
	}
}

// A pod that already holds a claim in the ranges (a retried ADD) gets it
// back, not a second one.
func TestLedger_Pick_ReturnsTheHoldersOwnClaimFirst(t *testing.T) {
	h := Holder{"ns", "web-0"}
	own := newClaim("sbn-x", netip.MustParseAddr("10.0.0.9"), h, Attachment{Node: "n1"}, t0)
	elsewhere := newClaim("sbn-y", netip.MustParseAddr("10.1.0.9"), h, Attachment{Node: "n1"}, t0)
	f := newPickFixture(t, DefaultConfig(), own, elsewhere)
	for range 5 {
		addr, err := f.ledger.Pick(f.ctx, "sbn-x", []psts.Range{rng("10.0.0.2", "10.0.0.254")}, nil, h, Attachment{Node: "n1"})
		if err != nil || addr.String() != "10.0.0.9" {
			t.Fatalf("Pick = %s, %v; want the pod's 10.0.0.9", addr, err)
		}
	}
	// Per pick one live read (the cache cannot say "still yours"), no
	// write, no Create (the cache shows that the claim exists).
	if creates, updates := f.writes(); creates != 0 || updates != 0 || len(f.requests()) != 5 {
		t.Errorf("%d creates, %d updates, %d requests; want 0, 0 and 5 reads", creates, updates, len(f.requests()))
	}
	// Outside the ranges, or unusable now: a new address.
	addr, err := f.ledger.Pick(f.ctx, "sbn-x", []psts.Range{rng("10.0.0.2", "10.0.0.254")},
		func(a netip.Addr) bool { return a.String() != "10.0.0.9" }, h, Attachment{Node: "n1"})
	if err != nil || addr.String() == "10.0.0.9" {
		t.Fatalf("Pick with the old address unusable = %s, %v", addr, err)
	}
}

func TestLedger_Pick_RejectsBadRanges(t *testing.T) {
	f := newPickFixture(t, DefaultConfig())
	_, err := f.ledger.Pick(f.ctx, "sbn-x", []psts.Range{rng("10.0.0.9", "10.0.0.2")}, nil, Holder{"ns", "a"}, Attachment{})
	if err == nil || errors.Is(err, ErrExhausted) || errors.Is(err, ErrTaken) {
		t.Fatalf("Pick from a reversed range = %v", err)
	}
	if _, err := f.ledger.Pick(f.ctx, "sbn-x", nil, nil, Holder{"ns", "a"}, Attachment{}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Pick from no ranges = %v, want ErrExhausted", err)
	}
}

var metav1GetOptions = metav1.GetOptions{}
