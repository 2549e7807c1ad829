package ipam_test

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// An ADD takes an idle IP of the node's ENI and commits it with a
// WorkloadEndpoint that names the pod's sandbox, node, ENI and subnet.
func TestFast_Allocate_FromWarmPoolCommitsWEP(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	w.waitIdle(2)
	ref := w.createPod("web-0")
	ep := w.allocate(ref)

	wep := w.wep("web-0")
	if wep == nil {
		t.Fatal("no WorkloadEndpoint after a successful ADD")
	}
	if wep.Spec.IP != ep.IP || wep.Spec.ContainerID != ref.ContainerID || wep.Spec.Node != w.node ||
		wep.Spec.ENIID != ep.ENIID || wep.Spec.InstanceID != w.instance || wep.Spec.Type != cce.WorkloadEndpointTypePod {
		t.Errorf("wep spec %+v does not match the endpoint %+v of sandbox %s", wep.Spec, ep, ref.ContainerID)
	}
	if ep.Node != w.node || ep.ENIID == "" || ep.MAC == "" || ep.SubnetID == "" {
		t.Errorf("endpoint %+v lacks node, ENI, MAC or subnet", ep)
	}
	rec := w.record(ep.IP)
	if rec.State != datastore.StateAssigned || rec.Owner.ContainerID != ref.ContainerID || rec.ENIID != ep.ENIID {
		t.Errorf("datastore record %+v, want assigned to sandbox %s on %s", rec, ref.ContainerID, ep.ENIID)
	}
	if st := w.stats(); st.Assigned != 1 {
		t.Errorf("assigned = %d, want 1", st.Assigned)
	}
	w.verify()
}

// An ADD finding the pool empty wakes the pool worker, which grows the ENI
// through the cloud, and gets one of the new addresses.
func TestFast_Allocate_EmptyPoolGrowsThroughCloud(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.IdleMin, cfg.IdleMax, cfg.BatchAdd = 1, 2, 1
	w := newFastWorld(t, cfg)
	w.waitIdle(1)
	seen := map[string]bool{}
	for _, name := range []string{"a", "b", "c", "d"} {
		ep := w.allocate(w.createPod(name))
		if seen[ep.IP] {
			t.Fatalf("%s got %s, already given to another pod", name, ep.IP)
		}
		seen[ep.IP] = true
	}
	if st := w.stats(); st.Assigned != 4 {
		t.Errorf("assigned = %d, want 4", st.Assigned)
	}
	w.verify()
}

// A repeated ADD of the same sandbox (kubelet retrying) gets the same IP and
// changes nothing.
func TestFast_Allocate_RepeatedADDReturnsSameIP(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	ref := w.createPod("web-0")
	first := w.allocate(ref)
	before := w.wep("web-0").ResourceVersion
	again := w.allocate(ref)
	if again != first {
		t.Fatalf("repeated ADD = %+v, want the first answer %+v", again, first)
	}
	if after := w.wep("web-0").ResourceVersion; after != before {
		t.Errorf("repeated ADD rewrote the wep (resourceVersion %s → %s)", before, after)
	}
	if st := w.stats(); st.Assigned != 1 {
		t.Errorf("assigned = %d, want 1", st.Assigned)
	}
	w.verify()
}

// A new sandbox of the same pod (the old one died) keeps the pod's IP: the
// address moves to the new container ID, in the datastore and the wep.
func TestFast_Allocate_NewSandboxOfSamePodKeepsIP(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	ref := w.createPod("web-0")
	first := w.allocate(ref)
	ref.ContainerID = sandboxID("web-0", 2)
	second := w.allocate(ref)
	if second.IP != first.IP {
		t.Fatalf("new sandbox got %s, want the pod's %s", second.IP, first.IP)
	}
	if wep := w.wep("web-0"); wep.Spec.ContainerID != ref.ContainerID {
		t.Errorf("wep names sandbox %s, want the new %s", wep.Spec.ContainerID, ref.ContainerID)
	}
	if rec := w.record(first.IP); rec.Owner.ContainerID != ref.ContainerID {
		t.Errorf("datastore owner %s, want the new sandbox %s", rec.Owner.ContainerID, ref.ContainerID)
	}
	if st := w.stats(); st.Assigned != 1 {
		t.Errorf("assigned = %d, want 1", st.Assigned)
	}
	w.verify()
}

// A failed wep commit rolls the allocation back: the IP returns to the pool
// (nothing names it), and the retried ADD succeeds.
func TestFast_Allocate_FailedCommitRollsBack(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	w.waitIdle(2)
	ref := w.createPod("web-0")
	var refused atomic.Int32
	w.cce.PrependReactor("create", "workloadendpoints", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refused.Add(1) == 1 {
			return true, nil, errors.New("etcd unavailable")
		}
		return false, nil, nil
	})
	idle := w.stats().Idle
	if _, err := w.ipam.Allocate(w.ctx, ref); err == nil {
		t.Fatal("ADD succeeded although its wep could not be created")
	}
	if w.wep("web-0") != nil {
		t.Fatal("a wep exists after the failed commit")
	}
	st := w.stats()
	if st.Assigned != 0 || st.Idle != idle {
		t.Fatalf("after the rollback: assigned %d idle %d, want 0 and %d (the IP back in the pool)", st.Assigned, st.Idle, idle)
	}
	w.verify()
	ep := w.allocate(ref)
	if wep := w.wep("web-0"); wep == nil || wep.Spec.IP != ep.IP {
		t.Fatalf("retried ADD: wep %v, want one naming %s", wep, ep.IP)
	}
}

// An ADD for a pod whose node this IPAM does not serve is refused as
// podip.ErrNotHere (the router sends it to the owner); one whose caller
// names another node than the pod's is refused outright.
func TestFast_Allocate_RefusesUnservedAndWrongNode(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	ref := w.createPod("web-0")
	w.ipam.StopServingNode(w.node)
	_, err := w.ipam.Allocate(w.ctx, ref)
	if !errors.Is(err, ipam.ErrNodeNotServed) || !errors.Is(err, podip.ErrNotHere) {
		t.Fatalf("ADD on an unserved node: %v, want ErrNodeNotServed (a podip.ErrNotHere)", err)
	}
	ref.Node = "another-node"
	_, err = w.ipam.Allocate(w.ctx, ref)
	if !errors.Is(err, ipam.ErrWrongNode) || errors.Is(err, podip.ErrNotHere) {
		t.Fatalf("ADD from the wrong node: %v, want ErrWrongNode (not a podip.ErrNotHere)", err)
	}
	if w.wep("web-0") != nil {
		t.Fatal("a refused ADD wrote a wep")
	}
}

// A DEL deletes the wep first, then frees the IP, which cools before it is
// handed out again.
func TestFast_Release_DeletesWEPThenFreesIP(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	ref := w.createPod("web-0")
	ep := w.allocate(ref)
	got, ok, err := w.release(ref)
	if err != nil || !ok || got.IP != ep.IP {
		t.Fatalf("DEL = %+v, %v, %v; want the pod's %s", got, ok, err, ep.IP)
	}
	if w.wep("web-0") != nil {
		t.Fatal("the wep survived the DEL")
	}
	rec := w.record(ep.IP)
	if rec.State != datastore.StateIdle || !rec.Cooling(w.clock.Now()) {
		t.Fatalf("released IP: %+v, want idle and cooling", rec)
	}
	w.clock.Step(fastConfig().Cooldown)
	if rec := w.record(ep.IP); rec.Cooling(w.clock.Now()) {
		t.Fatalf("released IP still cooling after the cooldown: %+v", rec)
	}
	if _, ok, err := w.ipam.Check(w.ctx, ref); ok || err != nil {
		t.Errorf("CHECK after DEL = %v, %v; want no assignment", ok, err)
	}
	w.verify()
}

// A retried DEL, a DEL of an older sandbox and a DEL of an unknown pod
// succeed and free nothing.
func TestFast_Release_IdempotentAndStaleSandboxIgnored(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	ref := w.createPod("web-0")
	ep := w.allocate(ref)

	stale := ref
	stale.ContainerID = sandboxID("web-0", 0)
	if _, ok, err := w.release(stale); ok || err != nil {
		t.Fatalf("DEL of an older sandbox = %v, %v; want ok=false, no error", ok, err)
	}
	if wep := w.wep("web-0"); wep == nil || wep.Spec.IP != ep.IP {
		t.Fatal("a DEL of an older sandbox touched the current sandbox's wep")
	}
	if got, ok, err := w.ipam.Check(w.ctx, ref); !ok || err != nil || got.IP != ep.IP {
		t.Fatalf("CHECK = %+v, %v, %v; want %s", got, ok, err, ep.IP)
	}
	if _, ok, err := w.release(ref); !ok || err != nil {
		t.Fatalf("DEL = %v, %v", ok, err)
	}
	if _, ok, err := w.release(ref); ok || err != nil {
		t.Fatalf("retried DEL = %v, %v; want ok=false, no error", ok, err)
	}
	unknown := podip.PodRef{
		Namespace:   fastNS,
		Name:        "never-ran",
		ContainerID: "x",
		Node:        w.node,
	}
	if _, ok, err := w.release(unknown); ok || err != nil {
		t.Fatalf("DEL of an unknown pod = %v, %v; want ok=false, no error", ok, err)
	}
	if st := w.stats(); st.Assigned != 0 {
		t.Errorf("assigned = %d, want 0", st.Assigned)
	}
	w.verify()
}

// GC releases the IP of a pod deleted without a DEL (its wep stays behind).
func TestFast_GC_WEPOfDeletedPodIsReleased(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	keep := w.createPod("keep")
	kept := w.allocate(keep)
	gone := w.createPod("gone")
	ep := w.allocate(gone)
	w.deletePod("gone")

	w.ipam.CollectGarbage(w.ctx)
	if w.wep("gone") != nil {
		t.Fatal("GC left the wep of a deleted pod")
	}
	if rec := w.record(ep.IP); rec.State != datastore.StateIdle {
		t.Fatalf("IP of the deleted pod: %+v, want idle", rec)
	}
	if wep := w.wep("keep"); wep == nil || w.record(kept.IP).State != datastore.StateAssigned {
		t.Fatal("GC touched a running pod's IP")
	}
	w.verify()
}

// An assigned IP that no wep names and no running pod uses (an ADD that
// died between the datastore and the commit) is deleted from the cloud only
// after LeakGrace, seen on two passes.
func TestFast_GC_LeakedIPReclaimedAfterGrace(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	ref := w.createPod("web-0")
	ep := w.allocate(ref)
	if err := w.cce.CceV1alpha1().WorkloadEndpoints(fastNS).Delete(w.ctx, "web-0", deleteNow); err != nil {
		t.Fatal(err)
	}

	w.ipam.CollectGarbage(w.ctx) // first seen: a suspect
	w.clock.Step(fastConfig().LeakGrace / 2)
	w.ipam.CollectGarbage(w.ctx)
	if rec := w.record(ep.IP); rec.State != datastore.StateAssigned {
		t.Fatalf("IP reclaimed within its grace: %+v", rec)
	}
	eniID := w.record(ep.IP).ENIID
	w.clock.Step(fastConfig().LeakGrace / 2)
	w.ipam.CollectGarbage(w.ctx)
	if rec, err := w.ipam.StoreForTest().LookupIP(netipOf(ep.IP)); err == nil {
		t.Fatalf("IP without a wep after the grace: %+v, want deleted", rec)
	}
	if w.cloudHas(eniID, ep.IP) {
		t.Fatalf("leaked %s still on %s in the cloud", ep.IP, eniID)
	}
	w.verify()
}

// The fixed IP of a deleted StatefulSet goes back to the cloud, and its wep
// goes; a DEL of a fixed pod before that keeps the reservation.
func TestFast_GC_FixedIPOfDeletedStatefulSetReturnedToCloud(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	ref := w.createStsPod("db", 0, 1)
	ep := w.allocate(ref)
	if wep := w.wep("db-0"); wep == nil || !wep.IsFixedStatefulSet() {
		t.Fatalf("wep of a fixed-IP pod: %+v, want a fixed StatefulSet wep", wep)
	}
	if _, ok, err := w.release(ref); !ok || err != nil {
		t.Fatalf("DEL of the fixed pod = %v, %v", ok, err)
	}
	if w.wep("db-0") == nil || w.record(ep.IP).State != datastore.StateAssigned {
		t.Fatal("a DEL gave up the fixed IP; it must stay reserved for the pod's next sandbox")
	}
	w.deletePod("db-0")
	if err := w.kube.AppsV1().StatefulSets(fastNS).Delete(w.ctx, "db", deleteNow); err != nil {
		t.Fatal(err)
	}
	w.waitFor("the StatefulSet informer to see the delete", func() bool {
		return !w.ipam.StatefulSetCachedForTest(fastNS, "db")
	})

	w.ipam.CollectGarbage(w.ctx)
	if w.wep("db-0") != nil {
		t.Fatal("GC left the wep of a deleted StatefulSet's fixed IP")
	}
	if _, err := w.ipam.StoreForTest().LookupIP(netipOf(ep.IP)); !errors.Is(err, datastore.ErrUnknownIP) {
		t.Fatalf("the fixed IP is still recorded (%v); it belongs to the cloud again", err)
	}
	if w.cloudHas(ep.ENIID, ep.IP) {
		t.Fatalf("%s is still on %s in the cloud", ep.IP, ep.ENIID)
	}
	w.verify()
}

// An ADD that finds the pool empty while the cloud refuses to grow it fails
// after AllocateWait with ErrPoolExhausted (kubelet retries) and leaves
// nothing assigned. (Whether the message names the cloud's error depends on
// whether the worker's failed grow ended before the wait did.)
func TestFast_Allocate_PoolExhaustedAfterAllocateWait(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	w.waitIdle(2)
	failAdds := bcesim.Faults{ErrorRate: map[bcesim.Op]float64{
		bcesim.OpBatchAddPrivateIP: 1,
		bcesim.OpCreateENI:         1,
	}}
	if err := w.sim.SetFaults(failAdds); err != nil {
		t.Fatal(err)
	}
	w.allocate(w.createPod("a"))
	w.allocate(w.createPod("b"))

	ref := w.createPod("c")
	done := make(chan error, 1)
	go func() {
		_, err := w.ipam.Allocate(w.ctx, ref)
		done <- err
	}()
	// The ADD waits on the fake clock: step it past AllocateWait until the
	// wait (started at some point in the loop) has run out.
	var err error
	w.waitFor("the ADD to give up", func() bool {
		select {
		case err = <-done:
			return true
		default:
			w.clock.Step(fastConfig().AllocateWait)
			return false
		}
	})
	if !errors.Is(err, ipam.ErrPoolExhausted) || errors.Is(err, podip.ErrNotHere) {
		t.Fatalf("ADD on an exhausted pool: %v, want ErrPoolExhausted", err)
	}
	if w.wep("c") != nil {
		t.Fatal("a failed ADD wrote a wep")
	}
	if st := w.stats(); st.Assigned != 2 {
		t.Errorf("assigned = %d, want the 2 earlier pods only", st.Assigned)
	}
	w.verify()
}

// A trim whose BatchDelete has an unclear outcome (a 500 from BCE) keeps the
// addresses out of the pool, held unsettled in the datastore, until the pool
// worker's GetENI ReadLag later settles them by the datastore's rule: gone
// from the ENI (the delete was applied before the 500), they are forgotten;
// still listed (the 500 came before BCE acted), they return to the pool.
func TestFast_Trim_UnclearDeleteSettledByReadingTheENI(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		fault   bcesim.Faults
		applied bool
	}{
		{
			name:    "applied",
			fault:   bcesim.Faults{FailAfterMutation: map[bcesim.Op]int{bcesim.OpBatchDeletePrivateIP: 1000}},
			applied: true,
		},
		{
			name:    "not applied",
			fault:   bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpBatchDeletePrivateIP: 1}},
			applied: false,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testUnclearTrim(t, c.fault, c.applied)
		})
	}
}

func testUnclearTrim(t *testing.T, fault bcesim.Faults, applied bool) {
	cfg := fastConfig()
	cfg.PoolCheckPeriod = 10 * time.Second // the trim runs on the test's clock step
	w := newFastWorld(t, cfg)
	var refs []podip.PodRef
	for k := range 6 {
		ref := w.createPod(fmt.Sprintf("p%d", k))
		w.allocate(ref)
		refs = append(refs, ref)
	}
	eniID := w.allocate(w.createPod("stays")).ENIID
	for _, ref := range refs {
		if _, ok, err := w.release(ref); !ok || err != nil {
			t.Fatalf("DEL %s = %v, %v", ref.Name, ok, err)
		}
	}
	if err := w.sim.SetFaults(fault); err != nil {
		t.Fatal(err)
	}
	// Past the cooldown and the planner's MinLifetime, and onto the pool
	// worker's tick: it trims the idle addresses above IdleMax.
	w.clock.Step(cfg.PoolCheckPeriod)
	var trimmed []netip.Addr
	w.waitFor("an unclear trim", func() bool {
		trimmed = w.heldAs(datastore.HoldUnsettled)
		return len(trimmed) > 0 && len(w.heldAs(datastore.HoldReleasing)) == 0
	})
	if err := w.sim.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	for _, a := range trimmed {
		if w.cloudHas(eniID, a.String()) == applied {
			t.Fatalf("%s: on the ENI %v after a delete that was applied=%v", a, !applied, applied)
		}
	}
	// Not before the read lag: nothing is settled yet.
	w.clock.Step(cfg.ReadLag - time.Second)
	time.Sleep(20 * time.Millisecond)
	if got := w.heldAs(datastore.HoldUnsettled); len(got) != len(trimmed) {
		t.Fatalf("%d of %d unsettled addresses settled before ReadLag", len(trimmed)-len(got), len(trimmed))
	}
	w.clock.Step(time.Second)
	w.waitFor("the settling read", func() bool { return len(w.heldAs(datastore.HoldUnsettled)) == 0 })
	for _, a := range trimmed {
		info, err := w.ipam.StoreForTest().LookupIP(a)
		switch {
		case applied && !errors.Is(err, datastore.ErrUnknownIP):
			t.Errorf("%s, deleted in the cloud: record %+v (err %v), want forgotten", a, info, err)
		case !applied && (err != nil || info.State != datastore.StateIdle):
			t.Errorf("%s, still on the ENI: record %+v (err %v), want idle", a, info, err)
		}
	}
	// The datastore and the cloud agree again (once any trim the settled
	// surplus started has finished).
	w.waitFor("the datastore to match the ENI", func() bool {
		return len(w.heldAs(datastore.HoldReleasing)) == 0 && w.stats().Total == w.cloudCount(eniID)
	})
	w.verify()
}
