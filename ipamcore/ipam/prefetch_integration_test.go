//go:build integration

package ipam_test

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// A takeover may start from an ENI list read ahead of it (PrefetchENIs: the
// shard layer reads it when the holder's Lease goes stale), taken before the
// previous owner's last cloud writes. The takeover then lists nothing
// itself, and still hands out neither the address the previous owner trimmed
// after the read (the list still shows it) nor the one it added and
// committed to a wep after the read (the list lacks it).
func TestIPAM_TakeoverFromAListReadAhead(t *testing.T) {
	e := newEnv(t, "hoahead", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 4
		c.IdleMax = 8
		c.PoolCheckPeriod = 200 * time.Millisecond
		// Short, so that cooling (every unclaimed address cools from the
		// takeover) does not hide an address handed out too early; the
		// settle list comes ReadLag (5 s) after the takeover.
		c.Cooldown = 100 * time.Millisecond
	}))
	node := e.nodes[0]
	eventually(t, 15*time.Second, "the pool filled", func() bool { return e.stats(node).Idle >= 4 })
	real := e.createPods("real", 1)[0]
	r, err := e.allocate(real)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the pool settled", func() bool {
		return e.stats(node).Total == len(e.cloudIPs()[e.instance[node]])
	})
	tmpl, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, real.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.stop() // the previous owner is fenced; its last writes are made below, after the read ahead
	lists := func() int64 { return e.sim.Stats().Ops[bcesim.OpListENIs].Calls }

	var gone, late string
	var listsBeforeServe int64
	e.startWith(func(ctx context.Context, ip *ipam.IPAM) {
		ip.PrefetchENIs(ctx, []string{node}, time.Minute)
		var eniID string
		eniID, gone = e.secondaryOn(node, r.IP)
		if gone == "" {
			t.Fatal("no idle secondary address on the node's ENI")
		}
		// The previous owner's trim of an idle address, and its last ADD: a
		// new address and the wep that commits it to a live pod.
		if err := e.cloud.BatchDeletePrivateIPs(ctx, eniID, []string{gone}); err != nil {
			t.Fatalf("delete %s: %v", gone, err)
		}
		added, err := e.cloud.BatchAddPrivateIPs(ctx, eniID, cloud.BatchAddRequest{Count: 1})
		if err != nil || len(added) != 1 {
			t.Fatalf("add an address: %v, %v", added, err)
		}
		late = added[0]
		latePod := e.createPods("late", 1)[0]
		w := tmpl.DeepCopy()
		w.ObjectMeta = metav1.ObjectMeta{Name: latePod.name, Namespace: e.ns}
		w.Spec.IP, w.Spec.ContainerID = late, "late-sandbox"
		if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		listsBeforeServe = lists()
	})
	if n := lists() - listsBeforeServe; n != 0 {
		t.Errorf("the takeover listed ENIs %d times though a list read ahead covered its node", n)
	}
	if got := metricValue(t, e.reg, "cce_ipam_eni_prefetches_total"); got != 1 {
		t.Errorf("cce_ipam_eni_prefetches_total = %v, want 1", got)
	}
	time.Sleep(200 * time.Millisecond) // past the cooling, well before the settle list
	grants := e.allocateTimed(e.createPods("b", e.stats(node).Total+2))
	for _, g := range grants {
		switch g.ip {
		case gone:
			t.Errorf("pod %s was given %s, trimmed from the cloud after the list read ahead (which still showed it)", g.pod, g.ip)
		case late:
			t.Errorf("pod %s was given %s, which a wep written after the list read ahead names", g.pod, g.ip)
		case r.IP:
			t.Errorf("pod %s was given %s, which pod %s holds", g.pod, g.ip, real.name)
		}
	}
	e.checkAssignedOnCloud(node, grants)
}

// A list read ahead serves only within its validity: a takeover after it
// lists for itself.
func TestIPAM_ListReadAheadExpires(t *testing.T) {
	e := newEnv(t, "hoexpire", 1, testConfig(func(c *ipam.Config) {}))
	node := e.nodes[0]
	// The node has addresses before the hand-over (under load the first
	// owner's pool may not have grown yet), so that serving it with none
	// below means the takeover lost them.
	eventually(t, 15*time.Second, "the pool filled", func() bool { return e.stats(node).Total > 0 })
	e.stop()
	lists := func() int64 { return e.sim.Stats().Ops[bcesim.OpListENIs].Calls }
	var before int64
	e.startWith(func(ctx context.Context, ip *ipam.IPAM) {
		ip.PrefetchENIs(ctx, []string{node}, time.Millisecond)
		time.Sleep(10 * time.Millisecond)
		before = lists()
	})
	if n := lists() - before; n < 1 {
		t.Errorf("the takeover listed ENIs %d times after the list read ahead expired, want its own list", n)
	}
	if e.stats(node).Total == 0 {
		t.Error("the node was served with no address")
	}
}

// A takeover batch that the list read ahead covers only in part (the
// balance moved a live survivor's node along with the dead replica's)
// serves the covered nodes first, without waiting for the list the other
// needs.
func TestIPAM_CoveredNodesDoNotWaitForTheList(t *testing.T) {
	e := newEnv(t, "hosplit", 2, testConfig(func(c *ipam.Config) {}))
	covered := e.nodes[0]
	e.stop()
	const listLatency = 2 * time.Second
	var coveredAt time.Time
	var seen chan struct{}
	e.startWith(func(ctx context.Context, ip *ipam.IPAM) {
		ip.PrefetchENIs(ctx, []string{covered}, time.Minute)
		if err := e.sim.SetFaults(bcesim.Faults{LatencyMs: map[bcesim.Op]int{bcesim.OpListENIs: int(listLatency / time.Millisecond)}}); err != nil {
			t.Fatal(err)
		}
		seen = make(chan struct{})
		go func() {
			defer close(seen)
			for ctx.Err() == nil {
				if slices.Contains(ip.ServedNodes(), covered) {
					coveredAt = time.Now()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	})
	servedAll := time.Now()
	<-seen
	if err := e.sim.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	if coveredAt.IsZero() {
		t.Fatal("the covered node was never served")
	}
	if early := servedAll.Sub(coveredAt); early < listLatency/2 {
		t.Errorf("the covered node was served %v before the batch's end, want about the other node's list (%v) earlier",
			early.Round(time.Millisecond), listLatency)
	}
	if !slices.Contains(e.ipam.ServedNodes(), e.nodes[1]) {
		t.Errorf("the node the read ahead did not cover is not served")
	}
}
