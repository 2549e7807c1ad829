//go:build integration

package ipclaim_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
	v1alpha1informers "github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipclaim"
)

// keeperFixture is a Keeper on its own informers, a ledger beside it on the
// same clock, and the events it records.
type keeperFixture struct {
	ctx    context.Context
	ns     string
	clk    *clocktesting.FakeClock
	keeper *ipclaim.Keeper
	ledger *replica
	events *record.FakeRecorder
	reg    *prometheus.Registry
	cs     versioned.Interface
	// factory holds the keeper's informers.
	factory externalversions.SharedInformerFactory
}

func newKeeperFixture(t *testing.T) *keeperFixture {
	t.Helper()
	ctx := setup(t)
	ns := testNamespace(t)
	clk := clocktesting.NewFakeClock(time.Now())
	cs := versioned.NewForConfigOrDie(clientConfig())
	factory := externalversions.NewSharedInformerFactory(cs, 0)
	events := record.NewFakeRecorder(100)
	reg := prometheus.NewRegistry()
	k, err := ipclaim.NewKeeper(ipclaim.DefaultConfig(), ipclaim.KeeperDeps{
		CCE: cs, Events: events, Clock: clk,
		Claims:  factory.Cce().V1alpha1().IPClaims(),
		Weps:    factory.Cce().V1alpha1().WorkloadEndpoints(),
		Spreads: factory.Cce().V1alpha1().PodSubnetTopologySpreads(),
	}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() {
		close(stop)
		factory.Shutdown()
	})
	factory.WaitForCacheSync(ctx.Done())
	return &keeperFixture{ctx: ctx, ns: ns, clk: clk, keeper: k, events: events, reg: reg, cs: cs, factory: factory,
		ledger: newReplica(ctx, t, "ledger", ipclaim.DefaultConfig(), clk)}
}

// synced waits until the keeper's caches satisfy ok.
func (f *keeperFixture) synced(t *testing.T, ok func(v1alpha1informers.Interface) bool) {
	t.Helper()
	waitFor(f.ctx, t, "the keeper's caches to catch up", func() bool { return ok(f.factory.Cce().V1alpha1()) })
}

// sync waits until the keeper's caches hold the weps, PSTS and claims of
// the test (by count), then runs one pass.
func (f *keeperFixture) sync(t *testing.T, weps, claims int) ipclaim.Report {
	t.Helper()
	f.synced(t, func(c v1alpha1informers.Interface) bool {
		w, _ := c.WorkloadEndpoints().Lister().WorkloadEndpoints(f.ns).List(labels.Everything())
		list, _ := c.IPClaims().Lister().List(labels.Everything())
		return len(w) == weps && len(list) == claims
	})
	r, err := f.keeper.Sync(f.ctx)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return r
}

func (f *keeperFixture) wep(t *testing.T, name, ip, typ, fix string) {
	t.Helper()
	w := &cce.WorkloadEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Labels: map[string]string{cce.LabelSubnetID: "sbn-k"}},
		Spec: cce.WorkloadEndpointSpec{
			IP: ip, Type: typ, EnableFixIP: fix, Node: "node-1", ENIID: "eni-1", SubnetID: "sbn-k",
			SubnetTopologyReference: "psts-k", UpdateAt: metav1.Now(),
		},
	}
	if _, err := f.cs.CceV1alpha1().WorkloadEndpoints(f.ns).Create(f.ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (f *keeperFixture) psts(t *testing.T, name string, subnets ...string) {
	t.Helper()
	p := &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec:       cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{}},
	}
	for _, s := range subnets {
		p.Spec.Subnets[s] = cce.SubnetAllocation{IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed}}
	}
	if _, err := f.cs.CceV1alpha1().PodSubnetTopologySpreads(f.ns).Create(f.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (f *keeperFixture) reserve(t *testing.T, subnet, addr, holder string) {
	t.Helper()
	if err := f.ledger.ledger.Reserve(f.ctx, subnet, netip.MustParseAddr(addr), ipclaim.Holder{Namespace: f.ns, Name: holder},
		ipclaim.Attachment{}); err != nil {
		t.Fatal(err)
	}
}

func (f *keeperFixture) free(t *testing.T, addr, holder string) {
	t.Helper()
	if err := f.ledger.ledger.Free(f.ctx, netip.MustParseAddr(addr), ipclaim.Holder{Namespace: f.ns, Name: holder}); err != nil {
		t.Fatal(err)
	}
}

func (f *keeperFixture) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-f.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A held claim whose holder has no wep naming its address is freed, once
// the orphan grace has passed since its last Reserve; one whose wep names
// it is not; a Reserve by the holder restarts the grace.
func TestKeeper_FreesOrphansAfterTheGrace(t *testing.T) {
	f := newKeeperFixture(t)
	f.psts(t, "psts-k", "sbn-k")
	f.reserve(t, "sbn-k", "10.80.0.5", "crashed")  // no wep: an ADD that never committed
	f.reserve(t, "sbn-k", "10.80.0.6", "running")  // its wep names it
	f.reserve(t, "sbn-k", "10.80.0.7", "renamed")  // its wep names another address
	f.reserve(t, "sbn-k", "10.80.0.9", "retrying") // no wep, but reserved again later
	f.wep(t, "running", "10.80.0.6", cce.WorkloadEndpointTypePod, "false")
	f.wep(t, "renamed", "10.80.0.8", cce.WorkloadEndpointTypePod, "false")

	if r := f.sync(t, 2, 4); r.OrphansFreed != 0 {
		t.Fatalf("within the grace: %+v", r)
	}
	f.clk.Step(time.Minute + time.Second)
	f.reserve(t, "sbn-k", "10.80.0.9", "retrying") // past half the grace: refreshes reservedAt
	f.clk.Step(time.Minute)
	r := f.sync(t, 2, 4)
	if r.OrphansFreed != 2 {
		t.Errorf("past the grace: %+v, want 2 orphans freed", r)
	}
	for addr, want := range map[string]string{
		"10.80.0.5": "<free>", "10.80.0.6": f.ns + "/running", "10.80.0.7": "<free>", "10.80.0.9": f.ns + "/retrying",
	} {
		c := getClaim(f.ctx, t, addr)
		if got := holderOf(c); got != want {
			t.Errorf("%s: %s, want %s", addr, got, want)
		}
		if want == "<free>" && (c.Spec.ReleasedAt == nil || c.Spec.ReleasedAt.Before(&metav1.Time{Time: f.clk.Now().Add(-time.Second)})) {
			t.Errorf("%s freed without a current releasedAt: %s", addr, describe(c))
		}
	}
	f.synced(t, func(c v1alpha1informers.Interface) bool {
		l, _ := c.IPClaims().Lister().Get("10.80.0.5")
		return l != nil && l.Spec.Holder == nil
	})
	if r := f.sync(t, 2, 4); r.OrphansFreed != 0 {
		t.Errorf("a second pass: %+v", r)
	}
	if got := metric(t, f.reg, "cce_ipam_ipclaim_orphans_freed_total"); got != 2 {
		t.Errorf("orphans_freed_total = %v, want 2", got)
	}
}

// Kept PSTS weps (Fixed, Custom with reuse) get the claim of their address:
// created, or a free (even blocked) one taken over; one held by another pod
// is reported on the wep, once, and left alone; other weps get none.
func TestKeeper_AdoptsKeptWeps(t *testing.T) {
	f := newKeeperFixture(t)
	f.psts(t, "psts-k", "sbn-k")
	f.reserve(t, "sbn-k", "10.81.0.8", "other")
	f.reserve(t, "sbn-k", "10.81.0.9", "picker")
	if err := f.ledger.ledger.Block(f.ctx, netip.MustParseAddr("10.81.0.9"), ipclaim.Holder{Namespace: f.ns, Name: "picker"}); err != nil {
		t.Fatal(err)
	}
	f.wep(t, "web-0", "10.81.0.5", cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue)
	f.wep(t, "app-x", "10.81.0.6", cce.WorkloadEndpointTypeReuseIPPod, cce.EnableFixIPTrue)
	f.wep(t, "manual", "10.81.0.7", cce.WorkloadEndpointTypePod, "false")
	f.wep(t, "web-1", "10.81.0.8", cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue)
	f.wep(t, "web-2", "10.81.0.9", cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue)
	f.wep(t, "web-3", "not-an-address", cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue)

	r := f.sync(t, 6, 2)
	if r.Adopted != 3 || r.Conflicts != 1 {
		t.Fatalf("first pass: %+v, want 3 adopted and 1 conflict", r)
	}
	for addr, want := range map[string]string{
		"10.81.0.5": f.ns + "/web-0", "10.81.0.6": f.ns + "/app-x", "10.81.0.7": "<no claim>",
		"10.81.0.8": f.ns + "/other", "10.81.0.9": f.ns + "/web-2",
	} {
		if got := holderOf(getClaim(f.ctx, t, addr)); got != want {
			t.Errorf("%s: %s, want %s", addr, got, want)
		}
	}
	c := getClaim(f.ctx, t, "10.81.0.5")
	if c.Spec.SubnetID != "sbn-k" || c.Labels[cce.LabelSubnetID] != "sbn-k" || c.Spec.Node != "node-1" || c.Spec.ENIID != "eni-1" ||
		c.Spec.PSTS != "psts-k" || c.Spec.ReservedAt == nil {
		t.Errorf("adopted claim: %s", describe(c))
	}
	events := f.drainEvents()
	if len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+ipclaim.ReasonConflict) || !strings.Contains(events[0], "10.81.0.8") ||
		!strings.Contains(events[0], f.ns+"/other") {
		t.Fatalf("events %q, want one conflict warning about 10.81.0.8 held by %s/other", events, f.ns)
	}

	r = f.sync(t, 6, 4)
	if r.Adopted != 0 || r.Conflicts != 1 {
		t.Errorf("second pass: %+v, want nothing adopted, the conflict still counted", r)
	}
	if events := f.drainEvents(); len(events) != 0 {
		t.Errorf("the conflict was reported again: %q", events)
	}
	if got := metric(t, f.reg, "cce_ipam_ipclaim_conflicts"); got != 1 {
		t.Errorf("conflicts gauge = %v, want 1", got)
	}
	if got := metric(t, f.reg, "cce_ipam_ipclaim_adopted_total"); got != 3 {
		t.Errorf("adopted_total = %v, want 3", got)
	}
	// An adopted address is the wep's pod's: nobody else may reserve it.
	if err := f.ledger.ledger.Reserve(f.ctx, "sbn-k", netip.MustParseAddr("10.81.0.5"), ipclaim.Holder{Namespace: f.ns, Name: "x"},
		ipclaim.Attachment{}); err == nil {
		t.Error("another pod reserved an adopted address")
	}
}

// Free claims of subnets no PSTS lists are deleted once past their cooling
// and block; held ones, and those of listed subnets, stay.
func TestKeeper_SweepsSubnetsNoPSTSLists(t *testing.T) {
	f := newKeeperFixture(t)
	f.psts(t, "psts-k", "sbn-listed")
	f.reserve(t, "sbn-listed", "10.82.0.5", "a")
	f.free(t, "10.82.0.5", "a")
	f.reserve(t, "sbn-gone", "10.82.1.5", "b")
	f.free(t, "10.82.1.5", "b")
	f.reserve(t, "sbn-gone", "10.82.1.6", "c") // held
	f.reserve(t, "sbn-gone", "10.82.1.7", "d")
	if err := f.ledger.ledger.Block(f.ctx, netip.MustParseAddr("10.82.1.7"), ipclaim.Holder{Namespace: f.ns, Name: "d"}); err != nil {
		t.Fatal(err)
	}
	if r := f.sync(t, 0, 4); r.Swept != 0 {
		t.Fatalf("while cooling: %+v", r)
	}
	f.clk.Step(6 * time.Second)
	f.reserve(t, "sbn-gone", "10.82.1.8", "e")
	f.free(t, "10.82.1.8", "e") // cooling
	if r := f.sync(t, 0, 5); r.Swept != 1 {
		t.Fatalf("past the cooling: %+v, want 1 swept", r)
	}
	for addr, want := range map[string]bool{"10.82.0.5": true, "10.82.1.5": false, "10.82.1.6": true, "10.82.1.7": true, "10.82.1.8": true} {
		if got := getClaim(f.ctx, t, addr) != nil; got != want {
			t.Errorf("%s exists: %v, want %v", addr, got, want)
		}
	}
	f.clk.Step(time.Minute)
	if r := f.sync(t, 0, 4); r.Swept != 2 {
		t.Fatalf("past the block: %+v, want 2 swept", r)
	}
	// The PSTS goes: its subnet's free claims go too.
	if err := f.cs.CceV1alpha1().PodSubnetTopologySpreads(f.ns).Delete(f.ctx, "psts-k", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.synced(t, func(c v1alpha1informers.Interface) bool {
		l, _ := c.PodSubnetTopologySpreads().Lister().List(labels.Everything())
		return len(l) == 0
	})
	if r := f.sync(t, 0, 2); r.Swept != 1 {
		t.Fatalf("after the PSTS was deleted: %+v, want 1 swept", r)
	}
	if c := getClaim(f.ctx, t, "10.82.1.6"); holderOf(c) != f.ns+"/c" {
		t.Errorf("the held claim: %s", describe(c))
	}
}

// Corrupt claims are reported once each (log, event, gauge), never freed,
// adopted over or swept, and never panic the keeper.
func TestKeeper_ReportsCorruptClaims(t *testing.T) {
	f := newKeeperFixture(t)
	for _, c := range corruptClaims() {
		if _, err := f.cs.CceV1alpha1().IPClaims().Create(f.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A kept wep naming a corrupt claim's address: not adopted over.
	f.wep(t, "web-0", "10.5.0.5", cce.WorkloadEndpointTypeStatefulSet, cce.EnableFixIPTrue)
	f.clk.Step(time.Hour) // past every grace, cooling and block
	r := f.sync(t, 1, 3)
	if r.Corrupt != 3 || r.Swept != 0 || r.OrphansFreed != 0 || r.Adopted != 0 {
		t.Fatalf("pass: %+v, want 3 corrupt and nothing else", r)
	}
	events := f.drainEvents()
	if len(events) != 3 {
		t.Fatalf("events %q, want 3", events)
	}
	for _, e := range events {
		if !strings.HasPrefix(e, "Warning "+ipclaim.ReasonCorrupt) {
			t.Errorf("event %q", e)
		}
	}
	if r := f.sync(t, 1, 3); r.Corrupt != 3 {
		t.Errorf("second pass: %+v", r)
	}
	if events := f.drainEvents(); len(events) != 0 {
		t.Errorf("reported again: %q", events)
	}
	if got := metric(t, f.reg, "cce_ipam_ipclaim_corrupt"); got != 3 {
		t.Errorf("corrupt gauge = %v, want 3", got)
	}
	for _, want := range corruptClaims() {
		got, err := f.cs.CceV1alpha1().IPClaims().Get(f.ctx, want.Name, metav1.GetOptions{})
		if err != nil || got.Spec.IP != want.Spec.IP || holderOf(got) != holderOf(want) {
			t.Errorf("corrupt claim %s changed: %v, %v", want.Name, describe(got), err)
		}
	}
}

// Run: a pass at start, then events trigger passes (the period here is an
// hour); Warning events reach the API server; Run returns when ctx ends.
func TestKeeper_Run_PassesOnEventsAndRecordsWarnings(t *testing.T) {
	ctx := setup(t)
	ns := testNamespace(t)
	cs := versioned.NewForConfigOrDie(clientConfig())
	kube := kubernetes.NewForConfigOrDie(clientConfig())
	factory := externalversions.NewSharedInformerFactory(cs, 0)
	cfg := ipclaim.DefaultConfig()
	cfg.KeeperPeriod = time.Hour
	reg := prometheus.NewRegistry()
	k, err := ipclaim.NewKeeper(cfg, ipclaim.KeeperDeps{
		CCE: cs, Kube: kube, Clock: clock.RealClock{},
		Claims:  factory.Cce().V1alpha1().IPClaims(),
		Weps:    factory.Cce().V1alpha1().WorkloadEndpoints(),
		Spreads: factory.Cce().V1alpha1().PodSubnetTopologySpreads(),
	}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	factory.Start(runCtx.Done())
	go func() {
		defer close(stopped)
		if err := k.Run(runCtx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		stop()
		<-stopped
		factory.Shutdown()
	})
	waitFor(ctx, t, "the first pass", func() bool { return metric(t, reg, "cce_ipam_ipclaim_keeper_passes_total", "result", "ok") >= 1 })

	other := replicaLedger(ctx, t)
	if err := other.Reserve(ctx, "sbn-r", netip.MustParseAddr("10.83.0.6"), ipclaim.Holder{Namespace: ns, Name: "someone"},
		ipclaim.Attachment{}); err != nil {
		t.Fatal(err)
	}
	for name, ip := range map[string]string{"web-0": "10.83.0.5", "web-1": "10.83.0.6"} {
		w := &cce.WorkloadEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: cce.WorkloadEndpointSpec{IP: ip, Type: cce.WorkloadEndpointTypeStatefulSet, EnableFixIP: cce.EnableFixIPTrue,
				SubnetID: "sbn-r", SubnetTopologyReference: "psts-r", UpdateAt: metav1.Now()},
		}
		if _, err := cs.CceV1alpha1().WorkloadEndpoints(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(ctx, t, "the adoption of web-0's address", func() bool { return holderOf(getClaim(ctx, t, "10.83.0.5")) == ns+"/web-0" })
	waitFor(ctx, t, "a conflict event on web-1", func() bool {
		list, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=web-1"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == ipclaim.ReasonConflict && e.InvolvedObject.Kind == "WorkloadEndpoint" {
				return true
			}
		}
		return false
	})
	if got := holderOf(getClaim(ctx, t, "10.83.0.6")); got != ns+"/someone" {
		t.Errorf("the conflicting claim: %s", got)
	}
	stop()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func replicaLedger(ctx context.Context, t *testing.T) *ipclaim.Ledger {
	t.Helper()
	return newReplica(ctx, t, "other", ipclaim.DefaultConfig(), nil).ledger
}

func waitFor(ctx context.Context, t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-deadline:
			t.Fatalf("%s did not happen within 30s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// testNamespace is a namespace of its own for the test, whose weps and
// PSTS are deleted when it ends: this control plane has no namespace
// controller, so a deleted namespace keeps its objects, and the next
// test's keeper would see them.
func testNamespace(t *testing.T) string {
	t.Helper()
	ns := cp.Namespace(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cs := admin().CceV1alpha1()
		if err := cs.WorkloadEndpoints(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("delete the weps of %s: %v", ns, err)
		}
		if err := cs.PodSubnetTopologySpreads(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("delete the PSTS of %s: %v", ns, err)
		}
	})
	return ns
}
