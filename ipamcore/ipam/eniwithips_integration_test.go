//go:build integration

package ipam_test

import (
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// burstEnv is one node with 16 GB (16 addresses per ENI: 15 for pods) whose
// one ENI is full: 13 pods and 2 idle.
func burstEnv(t *testing.T, prefix string, w world, change func(*ipam.Config)) (*env, string) {
	t.Helper()
	w.annotateMaxIPs, w.ipPool, w.memoryGB = true, true, 16
	e := newEnvIn(t, prefix, 1, testConfig(func(c *ipam.Config) {
		c.IdleMin, c.IdleMax = 2, 6
		c.PoolCheckPeriod = time.Second
		c.Cooldown = time.Millisecond
		c.ENISyncPeriod = time.Hour // no adoption or creation ahead of demand behind the test's back
		if change != nil {
			change(c)
		}
	}), w)
	node := e.nodes[0]
	e.markNode(node, nil, nil, true)
	e.allocateAll(e.createPodsOn("fill", node, 13), 4)
	eventually(t, 30*time.Second, "a full ENI", func() bool {
		st := e.stats(node)
		return st.Total == 15 && st.Idle == 2
	})
	if n := len(e.instanceENIs(node)); n != 1 {
		t.Fatalf("node has %d ENIs before the burst, want 1", n)
	}
	return e, node
}

func (e *env) simCalls(op bcesim.Op) int64 { return e.sim.Stats().Ops[op].Calls }

// A burst that outgrows the node's ENIs waits for a new one; it is created
// holding the addresses those pods need, so none waits for batch adds on it
// after its attach (each a call at the replica's share of the per-operation
// limit). With --eni-create-with-ips=false the ENI brings its primary only,
// as the reference's, and the same burst needs two batch adds.
func TestIPAM_NewENIHoldsTheWaitingAddresses(t *testing.T) {
	for _, tc := range []struct {
		name          string
		withIPs       bool
		maxBatchAdds  int64 // during the burst
		minBatchAdds  int64
		minNewENIAddr int // addresses of the new ENI right after the burst, the primary included
	}{
		{name: "with-ips", withIPs: true, maxBatchAdds: 1, minNewENIAddr: 13},
		{name: "primary-only", withIPs: false, maxBatchAdds: 100, minBatchAdds: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, node := burstEnv(t, "ewi-"+tc.name[:1], world{}, func(c *ipam.Config) { c.ENICreateWithIPs = tc.withIPs })
			adds, creates := e.simCalls(bcesim.OpBatchAddPrivateIP), e.simCalls(bcesim.OpCreateENI)
			// 14 pods: 2 idle addresses, then 12 that only a new ENI can hold.
			e.burstAllocate(e.createPodsOn("burst", node, 14))
			adds, creates = e.simCalls(bcesim.OpBatchAddPrivateIP)-adds, e.simCalls(bcesim.OpCreateENI)-creates
			if creates != 1 {
				t.Fatalf("%d CreateENI calls for the burst, want 1", creates)
			}
			if adds > tc.maxBatchAdds || adds < tc.minBatchAdds {
				t.Fatalf("%d batch adds during the burst, want %d to %d", adds, tc.minBatchAdds, tc.maxBatchAdds)
			}
			enis := e.instanceENIs(node)
			if len(enis) != 2 {
				t.Fatalf("node has %d ENIs after the burst, want 2", len(enis))
			}
			if n := max(len(enis[0].PrivateIPSet), len(enis[1].PrivateIPSet)); tc.withIPs && n < tc.minNewENIAddr {
				t.Fatalf("the ENIs hold %d and %d addresses, want one with at least %d", len(enis[0].PrivateIPSet),
					len(enis[1].PrivateIPSet), tc.minNewENIAddr)
			}
			eventually(t, 30*time.Second, "the pool back at its minimum", func() bool { return e.stats(node).Idle >= 2 })
			e.checkNoLeak()
		})
	}
}

// A cloud that takes only the primary address at creation answers such a
// create as a bad request: the ENI is created again with its primary only
// (the pods get their addresses by batch adds, later), and no later ENI asks
// for addresses again.
func TestIPAM_NewENIFallsBackToPrimaryOnly(t *testing.T) {
	e, node := burstEnv(t, "ewp", world{primaryOnlyCreate: true}, nil)
	creates := e.simCalls(bcesim.OpCreateENI)
	e.burstAllocate(e.createPodsOn("burst", node, 14))
	if got := e.simCalls(bcesim.OpCreateENI) - creates; got != 2 {
		t.Fatalf("%d CreateENI calls for the first new ENI, want 2 (refused with addresses, then the primary only)", got)
	}
	if n := len(e.instanceENIs(node)); n != 2 {
		t.Fatalf("node has %d ENIs, want 2", n)
	}
	// Outgrow the two ENIs (30 addresses for pods) by 3.
	eventually(t, 30*time.Second, "the pool back at its minimum", func() bool { return e.stats(node).Idle >= 2 })
	st := e.stats(node)
	creates = e.simCalls(bcesim.OpCreateENI)
	e.burstAllocate(e.createPodsOn("more", node, st.Idle+30-st.Total+3))
	if got := e.simCalls(bcesim.OpCreateENI) - creates; got != 1 {
		t.Fatalf("%d CreateENI calls for the third ENI, want 1 (primary only, the refusal remembered)", got)
	}
	e.checkNoLeak()
}
