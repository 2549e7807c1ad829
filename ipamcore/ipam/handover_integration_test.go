//go:build integration

package ipam_test

import (
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// grant is one pod's address and when the ADD that got it returned.
type grant struct {
	pod, ip string
	at      time.Time
}

// allocateTimed allocates every pod concurrently and records when each got
// its address.
func (e *env) allocateTimed(pods []podRef) []grant {
	e.t.Helper()
	var (
		mu  sync.Mutex
		out []grant
		wg  sync.WaitGroup
	)
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.allocate(p)
			if err != nil {
				e.t.Errorf("allocate %s: %v", p.name, err)
				return
			}
			mu.Lock()
			out = append(out, grant{pod: p.name, ip: r.IP, at: time.Now()})
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// checkAssignedOnCloud fails if a granted address is not on an ENI of the
// pod's node in bce-sim's own (unlagged) world: a pod holding it would send
// traffic from an address its node does not have, or one another node may
// get (I3).
func (e *env) checkAssignedOnCloud(node string, grants []grant) {
	e.t.Helper()
	onNode := e.cloudIPs()[e.instance[node]]
	for _, g := range grants {
		if !onNode[g.ip] {
			e.t.Errorf("pod %s was given %s, which no ENI of node %s has in the cloud", g.pod, g.ip, node)
		}
	}
}

// secondaryOn returns a secondary address other than except on an ENI of
// node in bce-sim's own world, and that ENI ("" when there is none).
func (e *env) secondaryOn(node, except string) (eniID, addr string) {
	for _, eni := range e.sim.Dump().ENIs {
		if eni.InstanceID != e.instance[node] {
			continue
		}
		for _, ip := range eni.PrivateIPSet {
			if !ip.Primary && ip.PrivateIPAddress != except {
				eniID, addr = eni.ENIID, ip.PrivateIPAddress
			}
		}
	}
	return eniID, addr
}

// Finding 7 of issue #19: an address released just before a hand-over must
// still cool on the new owner. The new owner cannot know when the previous
// one released it, so every unclaimed address cools from the takeover.
func TestIPAM_HandOverKeepsCooling(t *testing.T) {
	e := newEnv(t, "hocool", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 2
		c.IdleMax = 8
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	node := e.nodes[0]
	first := e.createPods("a", 1)[0]
	r, err := e.allocate(first)
	if err != nil {
		t.Fatal(err)
	}
	released := r.IP
	if rr, err := e.release(first); err != nil || !rr.IsSuccess {
		t.Fatalf("release = %v, %v", rr, err)
	}
	releasedAt := time.Now()
	e.restart() // another replica takes the node over at once
	cooldown := 5 * time.Second
	idle := e.stats(node).Total
	grants := e.allocateTimed(e.createPods("b", idle+2))
	for _, g := range grants {
		if g.ip == released && g.at.Sub(releasedAt) < cooldown {
			t.Errorf("pod %s got %s %s after it was released, within the %s cooling period: the hand-over lost its cooling",
				g.pod, g.ip, g.at.Sub(releasedAt).Round(time.Millisecond), cooldown)
		}
	}
	e.checkAssignedOnCloud(node, grants)
}

// Finding 2 of issue #19: the previous owner deletes an idle address from the
// cloud just before the hand-over; the new owner's ENI list lags and still
// shows it. The new owner must not hand it out.
func TestIPAM_TakeoverDoesNotTrustALaggedList(t *testing.T) {
	e := newEnv(t, "holag", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 4
		c.IdleMax = 8
		c.PoolCheckPeriod = 200 * time.Millisecond
		// Short: with the default 5 s, cooling from the takeover kept the
		// lagged address out by itself and the test passed with the
		// unsettled hold removed.
		c.Cooldown = 100 * time.Millisecond
	}))
	node := e.nodes[0]
	eventually(t, 10*time.Second, "the pool filled", func() bool { return e.stats(node).Idle >= 4 })
	const lag = 2 * time.Second
	time.Sleep(lag + 200*time.Millisecond) // so the sim lets the delete below through
	e.stop()                               // the previous owner, fenced
	eniID, gone := e.secondaryOn(node, "")
	if gone == "" {
		t.Fatal("no secondary address on the node's ENI")
	}
	if err := e.sim.SetFaults(bcesim.Faults{ReplicaLagMs: int(lag / time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	// Its last trim, just before it was fenced.
	if err := e.cloud.BatchDeletePrivateIPs(e.ctx, eniID, []string{gone}); err != nil {
		t.Fatalf("delete %s: %v", gone, err)
	}
	e.start()                          // the new owner reads the lagging list
	time.Sleep(200 * time.Millisecond) // past the cooling, well before the settle list (ReadLag, 5 s)
	total := e.stats(node).Total
	grants := e.allocateTimed(e.createPods("b", total))
	for _, g := range grants {
		if g.ip == gone {
			t.Errorf("pod %s was given %s, deleted from the cloud before the takeover (the lagging list still showed it)", g.pod, g.ip)
		}
	}
	e.checkAssignedOnCloud(node, grants)
	if t.Failed() {
		t.Logf("node stats after the allocations: %+v", e.stats(node))
	}
}

// Finding 2 of issue #19, the periodic half: nothing compared single
// addresses of known ENIs with the cloud. An idle address that leaves the
// cloud behind the datastore's back (a delete whose reply was lost, a
// previous owner's trim the takeover's reads missed) must never be handed
// out, and an address the cloud has but the datastore lacks (an add whose
// reply was lost) must be adopted, not leaked.
func TestIPAM_SyncReconcilesEachAddress(t *testing.T) {
	e := newEnv(t, "recon", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 4
		c.IdleMax = 8
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.ENISyncPeriod = 300 * time.Millisecond
	}))
	node := e.nodes[0]
	eventually(t, 15*time.Second, "the pool filled", func() bool { return e.stats(node).Idle >= 4 })
	var eniID, gone string
	for _, eni := range e.sim.Dump().ENIs {
		if eni.InstanceID == e.instance[node] {
			for _, ip := range eni.PrivateIPSet {
				if !ip.Primary {
					eniID, gone = eni.ENIID, ip.PrivateIPAddress
				}
			}
		}
	}
	if err := e.cloud.BatchDeletePrivateIPs(e.ctx, eniID, []string{gone}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the sync to take "+gone+" out of the pool", func() bool {
		st := e.stats(node)
		return st.Held >= 1 || st.Total == len(e.cloudIPs()[e.instance[node]])
	})
	grants := e.allocateTimed(e.createPods("b", e.stats(node).Total))
	for _, g := range grants {
		if g.ip == gone {
			t.Errorf("pod %s was given %s after it left the cloud", g.pod, g.ip)
		}
	}
	e.checkAssignedOnCloud(node, grants)

	added, err := e.cloud.BatchAddPrivateIPs(e.ctx, eniID, cloud.BatchAddRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the sync to adopt "+added[0]+" and forget "+gone, func() bool {
		snapTotal := e.stats(node).Total
		return snapTotal == len(e.cloudIPs()[e.instance[node]])
	})
	e.checkNoLeak()
}

// Finding 4 of issue #19, its second half: a "ghost" wep (a write that
// should never have landed, e.g. a fenced replica's late create) names an
// address the pool holds idle. GC must hold the address out of the pool
// while the wep names it, say so, and give it back once the wep is gone.
func TestIPAM_GhostWEPHoldsItsAddress(t *testing.T) {
	e := newEnv(t, "ghost", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 4
		c.IdleMax = 8
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	node := e.nodes[0]
	eventually(t, 15*time.Second, "the pool filled and settled", func() bool { return e.stats(node).Idle >= 4 })
	real := e.createPods("real", 1)[0]
	r, err := e.allocate(real)
	if err != nil {
		t.Fatal(err)
	}
	// Pick among addresses the datastore has recorded: a grow may be in
	// flight (in the cloud, not yet in the datastore).
	eventually(t, 15*time.Second, "the pool settled", func() bool {
		return e.stats(node).Total == len(e.cloudIPs()[e.instance[node]])
	})
	var ghostIP string
	for ip := range e.cloudIPs()[e.instance[node]] {
		if ip != r.IP {
			ghostIP = ip
			break
		}
	}
	tmpl, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, real.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A live pod whose ADD a replica that lost the node committed late.
	ghostPod := e.createPods("ghost", 1)[0]
	ghost := tmpl.DeepCopy()
	ghost.ObjectMeta = metav1.ObjectMeta{Name: ghostPod.name, Namespace: e.ns}
	ghost.Spec.IP, ghost.Spec.ContainerID = ghostIP, "ghost-sandbox"
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Create(e.ctx, ghost, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// GC looks only at nodes whose pod watch has synced.
	eventually(t, 10*time.Second, "the ghost's pod in its node's watch", func() bool {
		_, ok := e.ipam.PodFromCache(node, e.ns, ghostPod.name)
		return ok
	})
	e.ipam.CollectGarbage(e.ctx)
	grants := e.allocateTimed(e.createPods("b", e.stats(node).Idle+1))
	for _, g := range grants {
		if g.ip == ghostIP {
			t.Errorf("pod %s was given %s, which the ghost wep names", g.pod, g.ip)
		}
	}
	if got := e.gauge("cce_ipam_ghost_weps_total", "kind", "idle_held"); got != 1 {
		t.Errorf("cce_ipam_ghost_weps_total{kind=idle_held} = %v, want 1", got)
	}
	if err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Delete(e.ctx, ghostPod.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.ipam.CollectGarbage(e.ctx)
	if st := e.stats(node); st.Held != 0 {
		t.Errorf("after the ghost wep went, %d addresses are still held", st.Held)
	}
}
