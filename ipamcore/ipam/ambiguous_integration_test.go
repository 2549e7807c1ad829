//go:build integration

package ipam_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// A trim whose delete BCE applies but answers 500 (every SDK retry too: the
// clientToken makes the retries return the cached outcome, and the armed
// fault fails each of them) has an unclear outcome. The trimmed addresses
// must stay out of the pool until a read of the ENI settles them: no
// AllocateIP may hand out an address bce-sim no longer has on the ENI, and
// once settled the datastore and the cloud agree again.
func TestIPAM_AmbiguousTrimNeverHandsOutDeletedIP(t *testing.T) {
	// A long PoolCheckPeriod: the worker runs on pokes (releases that
	// overfill the pool, allocations that find it empty), so the trim
	// happens once per release and nothing else re-trims in between.
	e := newEnv(t, "am", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 2
		c.BatchAdd = 4
		c.Cooldown = 100 * time.Millisecond
		c.AllocateWait = 10 * time.Second
		c.PoolCheckPeriod = time.Hour
		c.ENISyncPeriod = time.Hour
	}))
	node, inst := e.nodes[0], e.instance[e.nodes[0]]

	first := e.createPods("a", 8)
	if got := e.allocateAll(first, 1); len(got) != len(first) {
		t.Fatalf("%d of %d pods got an IP", len(got), len(first))
	}
	// Trim only considers addresses older than the planner's MinLifetime
	// (5 s): let them age so the releases below trim at once.
	time.Sleep(6 * time.Second)
	before := len(e.cloudIPs()[inst])

	// Every delete is applied, then answered 500.
	if err := e.sim.SetFaults(bcesim.Faults{FailAfterMutation: map[bcesim.Op]int{bcesim.OpBatchDeletePrivateIP: 1000}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range first {
		if _, err := e.release(p); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, "a trim applied in bce-sim", func() bool {
		return len(e.cloudIPs()[inst]) < before
	})
	// Let every release's trim finish.
	time.Sleep(time.Second)

	// Every allocation must get an address bce-sim has on the ENI now.
	second := e.createPods("b", 6)
	for _, p := range second {
		reply, err := e.allocate(p)
		if err != nil {
			t.Fatalf("allocate %s: %v", p.name, err)
		}
		if !e.cloudIPs()[inst][reply.IP] {
			t.Fatalf("AllocateIP handed %s to %s, but bce-sim no longer has it on ENI %s (an applied delete answered 500 put it back in the pool)",
				reply.IP, p.name, reply.ENIID)
		}
	}
	// The test exercised what it means to: a delete answered 5xx.
	if got := e.gauge("cce_ipam_pool_cloud_errors_total", "class", "server"); got < 1 {
		t.Fatalf("no trim failed with a server error (%v): the fault was not hit", got)
	}
	if err := e.sim.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// Settled: no address is left unsettled and the datastore holds
	// exactly the cloud's addresses.
	eventually(t, 30*time.Second, "unsettled addresses settled", func() bool {
		st := e.stats(node)
		return st.Held == 0 && st.Total == len(e.cloudIPs()[inst])
	})
	e.checkNoLeak()
}

// A trim whose delete times out after it was sent has an unclear outcome
// too. Here BCE did not apply it (the latency comes before the call is
// handled and the client has gone by then): the read that settles the
// addresses still lists them, so they return to the pool and nothing leaks.
func TestIPAM_TimedOutTrimSettlesBackIntoPool(t *testing.T) {
	e := newEnv(t, "at", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 2
		c.BatchAdd = 4
		c.Cooldown = 100 * time.Millisecond
		c.AllocateWait = 10 * time.Second
		c.PoolCheckPeriod = time.Hour
		c.ENISyncPeriod = time.Hour
	}))
	node, inst := e.nodes[0], e.instance[e.nodes[0]]
	// A client that gives up on an attempt after 1 s and does not retry.
	e.stop()
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = e.sim.URL()
	bceCfg.AccessKeyID = testAK
	bceCfg.SecretAccessKey = testSK
	bceCfg.Rate = 1e6
	bceCfg.Burst = 1e6
	bceCfg.SDKRetries = -1
	bceCfg.ThrottleBackoff = time.Millisecond
	bceCfg.Timeout = time.Second
	impatient, err := cloud.New(bceCfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(impatient.Close)
	e.cloud = impatient
	e.start()

	pods := e.createPods("a", 6)
	if got := e.allocateAll(pods, 1); len(got) != len(pods) {
		t.Fatalf("%d of %d pods got an IP", len(got), len(pods))
	}
	time.Sleep(6 * time.Second) // past the planner's MinLifetime
	if err := e.sim.SetFaults(bcesim.Faults{LatencyMs: map[bcesim.Op]int{bcesim.OpBatchDeletePrivateIP: 1500}}); err != nil {
		t.Fatal(err)
	}
	before := len(e.cloudIPs()[inst])
	for _, p := range pods {
		if _, err := e.release(p); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 20*time.Second, "a trim that timed out", func() bool {
		return e.gauge("cce_ipam_pool_cloud_errors_total", "class", "transport") >= 1
	})
	// Until a read settles them, the trimmed addresses are held, whatever
	// the pool needs.
	if st := e.stats(node); st.Held == 0 {
		t.Fatalf("after a timed-out trim nothing is held: %+v", st)
	}
	if err := e.sim.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// The later trims (no fault now) bring the pool to IdleMax; the
	// timed-out ones come back idle first, then may be trimmed for real.
	eventually(t, 30*time.Second, "the unclear trim settled", func() bool {
		st := e.stats(node)
		return st.Held == 0 && st.Total == len(e.cloudIPs()[inst])
	})
	if after := len(e.cloudIPs()[inst]); after > before {
		t.Fatalf("cloud has %d addresses, %d before the trims", after, before)
	}
	e.checkNoLeak()
	// Every address of the pool is usable.
	second := e.createPods("b", 4)
	for _, p := range second {
		reply, err := e.allocate(p)
		if err != nil {
			t.Fatalf("allocate %s: %v", p.name, err)
		}
		if !e.cloudIPs()[inst][reply.IP] {
			t.Fatalf("AllocateIP handed %s to %s, which bce-sim does not have", reply.IP, p.name)
		}
	}
}
