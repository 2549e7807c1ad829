//go:build integration

package ipam_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// Issue #19 finding 3: GC's cloud calls are in-flight work of their node. A
// GC pass frees a fixed IP whose StatefulSet is gone; its DeletePrivateIP is
// held at bce-sim when the node is handed over. Once StopServingNode has
// returned, nothing more may change the node's addresses in the cloud (the
// next owner rebuilds from them): the drain either waited for the delete or
// cut it off, and bce-sim's world stays as it was at the return.
func TestIPAM_HandOverWaitsForGCCloudDelete(t *testing.T) {
	e := newEnv(t, "fgc", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.GCPeriod = time.Hour
		c.ENISyncPeriod = time.Hour
	}))
	node, inst := e.nodes[0], e.instance[e.nodes[0]]
	// A fixed-IP pod of a StatefulSet that no longer exists: GC frees its
	// address in the cloud.
	gone := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "gone", UID: "uid-gone"}}
	p := e.createStsPod(gone, 0, node, "", "c0")
	r, err := e.allocate(p)
	if err != nil {
		t.Fatal(err)
	}
	if !e.cloudIPs()[inst][r.IP] {
		t.Fatalf("bce-sim does not have the fixed IP %s on the node", r.IP)
	}
	const hold = 3 * time.Second
	latency := map[bcesim.Op]int{bcesim.OpDeletePrivateIP: int(hold / time.Millisecond)}
	if err := e.sim.SetFaults(bcesim.Faults{LatencyMs: latency}); err != nil {
		t.Fatal(err)
	}
	calls := func() int64 { return e.sim.Stats().Ops[bcesim.OpDeletePrivateIP].Calls }
	before := calls()
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		e.ipam.CollectGarbage(e.ctx)
	}()
	eventually(t, 10*time.Second, "GC's delete of the fixed IP held at bce-sim", func() bool { return calls() > before })
	sent := time.Now()

	e.ipam.StopServingNode(node)
	atReturn := e.cloudIPs()[inst]
	t.Logf("StopServingNode returned %s after the delete reached bce-sim; fixed IP %s on the node then: %v",
		time.Since(sent).Round(time.Millisecond), r.IP, atReturn[r.IP])
	time.Sleep(time.Until(sent.Add(hold + time.Second)))
	select {
	case <-gcDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the GC pass did not end")
	}
	if after := e.cloudIPs()[inst]; !maps.Equal(atReturn, after) {
		t.Fatalf("bce-sim changed the node's addresses after StopServingNode returned (fixed IP %s there at the return: %v, later: %v): "+
			"GC's delete landed after the hand-over", r.IP, atReturn[r.IP], after[r.IP])
	}
}

// The ENI sync's work for a node is in-flight work of the node too: its
// delete of the node's leaked (unattached) ENI, held at bce-sim when the node
// is handed over, must not land after StopServingNode returned.
func TestIPAM_HandOverWaitsForLeakedENIDelete(t *testing.T) {
	e := newEnv(t, "feni", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.GCPeriod = time.Hour
		c.ENISyncPeriod = time.Hour
		c.LeakedENIAge = time.Millisecond
	}))
	node, inst := e.nodes[0], e.instance[e.nodes[0]]
	var subnet, sg string
	for _, v := range e.sim.Dump().ENIs {
		if v.InstanceID == inst {
			subnet, sg = v.SubnetID, v.SecurityGroupIDs[0]
		}
	}
	// Created for the node and never attached: its creator crashed.
	leaked, err := e.cloud.CreateENI(e.ctx, cloud.CreateENIRequest{Name: testCluster + "/" + inst + "/" + node + "/leaked",
		SubnetID: subnet, SecurityGroupIDs: []string{sg}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // older than LeakedENIAge at BCE's one-second resolution
	const hold = 3 * time.Second
	if err := e.sim.SetFaults(bcesim.Faults{LatencyMs: map[bcesim.Op]int{bcesim.OpDeleteENI: int(hold / time.Millisecond)}}); err != nil {
		t.Fatal(err)
	}
	calls := func() int64 { return e.sim.Stats().Ops[bcesim.OpDeleteENI].Calls }
	before := calls()
	syncDone := make(chan error, 1)
	go func() { syncDone <- e.ipam.SyncENIs(e.ctx) }()
	eventually(t, 10*time.Second, "the sync's delete of the leaked ENI held at bce-sim", func() bool { return calls() > before })
	sent := time.Now()

	e.ipam.StopServingNode(node)
	exists := func() bool {
		for _, v := range e.sim.Dump().ENIs {
			if v.ENIID == leaked {
				return true
			}
		}
		return false
	}
	atReturn := exists()
	t.Logf("StopServingNode returned %s after the delete reached bce-sim; leaked ENI there then: %v",
		time.Since(sent).Round(time.Millisecond), atReturn)
	time.Sleep(time.Until(sent.Add(hold + time.Second)))
	select {
	case err := <-syncDone:
		t.Logf("the ENI sync ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the ENI sync did not end")
	}
	if later := exists(); later != atReturn {
		t.Fatalf("bce-sim deleted the node's leaked ENI %s after StopServingNode returned (there at the return: %v, later: %v)",
			leaked, atReturn, later)
	}
}

// flipFence permits every node until refuse says otherwise.
type flipFence struct{ refuse func() bool }

func (f flipFence) MayAct(string) (time.Time, error) {
	if f.refuse() {
		return time.Time{}, errors.New("the node's partition moved away")
	}
	return time.Now().Add(time.Minute), nil
}

// The pool worker's cloud calls carry the node's permission: a grow
// answered 5xx whose node permission ended before the retry is not retried
// (the client would retry it SDKRetries = 3 times), and nothing more is
// sent for the node.
func TestIPAM_PoolCallNotRetriedAfterFenceEnds(t *testing.T) {
	e := newEnv(t, "fpool", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 4
		c.IdleMax = 8
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.GCPeriod = time.Hour
		c.ENISyncPeriod = time.Hour
	}))
	e.stop() // a fresh IPAM with a fence instead
	// A grow the first IPAM's stop cut off may still reach bce-sim: let it
	// land before counting.
	time.Sleep(500 * time.Millisecond)
	if err := e.sim.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpBatchAddPrivateIP: 1}}); err != nil {
		t.Fatal(err)
	}
	adds := func() int64 { return e.sim.Stats().Ops[bcesim.OpBatchAddPrivateIP].Calls }
	before := adds()
	fence := flipFence{refuse: func() bool { return adds() > before }} // ends once a grow reached BCE
	cfg := e.cfg
	cfg.IdleMin, cfg.IdleMax = 12, 16 // more than the first IPAM left: the worker grows at once
	ip, err := ipam.New(cfg, ipam.Deps{Kube: e.kube, CCE: e.cce, Cloud: e.cloud, Fence: fence},
		slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	go func() { _ = ip.Run(ctx) }()
	for n, err := range ip.ServeNodes(ctx, e.nodes) {
		t.Fatalf("serve %s: %v", n, err)
	}
	eventually(t, 10*time.Second, "a grow at bce-sim", func() bool { return adds() > before })
	time.Sleep(2 * time.Second) // the worker's retries and later rounds, if any
	if n := adds() - before; n != 1 {
		t.Fatalf("the node's fence ended after the first grow reached BCE (answered 500), yet BCE saw %d BatchAddPrivateIP requests", n)
	}
}
