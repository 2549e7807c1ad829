//go:build integration

package ipam_test

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// serveCNI puts a gRPC CNI server in front of ip and returns a client of it.
func serveCNI(t *testing.T, ip *ipam.IPAM) rpc.CNIBackendClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.RegisterCNIBackendServer(gs, cni.NewServer(cni.DefaultConfig(), ip, nil, nil))
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return rpc.NewCNIBackendClient(conn)
}

// allocateVia allocates through one replica's CNI server, retrying "busy"
// answers as kubelet would.
func (e *env) allocateVia(c rpc.CNIBackendClient, p podRef) (*rpc.ENIMultiIPReply, error) {
	saved := e.cni
	e.cni = c
	defer func() { e.cni = saved }()
	return e.allocate(p)
}

func (e *env) releaseVia(c rpc.CNIBackendClient, p podRef) (*rpc.ReleaseIPReply, error) {
	return c.ReleaseIP(e.ctx, &rpc.ReleaseIPRequest{
		K8SPodName: p.name, K8SPodNamespace: e.ns, K8SPodInfraContainerID: p.containerID, K8SNodeName: p.node,
	})
}

// Finding 1 of issue #19: a fixed-IP StatefulSet pod recreated on a node that
// another replica serves. The new node's owner must not take the address off
// the old node's ENI behind the old owner's back: the old owner would keep it
// recorded, hand it back to the pod when it returns (an address on another
// node's ENI), and later to a stranger.
func TestIPAM_FixedIPMovesAcrossReplicas(t *testing.T) {
	e, a, b := twoReplicas(t, "fxmove", 500*time.Millisecond)
	nodeA, nodeB := e.nodes[0], e.nodes[1]
	ca, cb := serveCNI(t, a), serveCNI(t, b)

	sts := e.createStatefulSet("mv", 1)
	p := e.createStsPod(sts, 0, nodeA, "", "c-a1")
	r, err := e.allocateVia(ca, p)
	if err != nil {
		t.Fatal(err)
	}
	fixed := r.IP

	// To node B (another replica) ...
	if rr, err := e.releaseVia(ca, p); err != nil || !rr.IsSuccess {
		t.Fatalf("DEL on A = %v, %v", rr, err)
	}
	e.deletePod(p.name)
	p = e.createStsPod(sts, 0, nodeB, "", "c-b1")
	if r, err = e.allocateVia(cb, p); err != nil || r.IP != fixed {
		t.Fatalf("on B got %v, %v; want the fixed %s", r, err, fixed)
	}
	// ... and back to node A.
	if rr, err := e.releaseVia(cb, p); err != nil || !rr.IsSuccess {
		t.Fatalf("DEL on B = %v, %v", rr, err)
	}
	e.deletePod(p.name)
	p = e.createStsPod(sts, 0, nodeA, "", "c-a2")
	r, err = e.allocateVia(ca, p)
	if err != nil {
		t.Fatal(err)
	}
	if r.IP != fixed {
		t.Errorf("back on A got %s, want the fixed %s", r.IP, fixed)
	}
	onA, onB := e.cloudIPs()[e.instance[nodeA]], e.cloudIPs()[e.instance[nodeB]]
	if !onA[r.IP] {
		t.Errorf("the pod back on A holds %s, which no ENI of A has in the cloud (on B's: %v)", r.IP, onB[r.IP])
	}
	// B must not keep the address either: its pool would hand it to a
	// stranger on B while the pod on A uses it.
	strangers := e.createPods("stranger", 8)
	for _, s := range strangers {
		if s.node != nodeB {
			continue
		}
		got, err := e.allocateVia(cb, s)
		if err != nil {
			t.Fatal(err)
		}
		if got.IP == fixed {
			t.Fatalf("stranger %s on B got %s, the fixed IP of the pod on A (I3)", s.name, got.IP)
		}
	}
	// The strangers' ADDs start refills on B: compare once they settle.
	e.checkNoLeakOwned(func(node string) *ipam.IPAM {
		if node == nodeB {
			return b
		}
		return a
	})
}

// twoReplicas is an env of two nodes served by two IPAMs, node 0 by a and
// node 1 by b, each moving fixed IPs through the other (runMovers). A zero
// sync keeps the config's ENI sync period.
func twoReplicas(t *testing.T, prefix string, sync time.Duration) (*env, *ipam.IPAM, *ipam.IPAM) {
	t.Helper()
	e := newEnv(t, prefix, 2, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
		if sync > 0 {
			c.ENISyncPeriod = sync
		}
	}))
	e.stop() // the env's own IPAM: the two replicas replace it
	a, b := runMovers(t, e)
	if err := a.ServeNode(e.ctx, e.nodes[0]); err != nil {
		t.Fatal(err)
	}
	if err := b.ServeNode(e.ctx, e.nodes[1]); err != nil {
		t.Fatal(err)
	}
	return e, a, b
}

// runMovers runs two IPAMs of the env's config, as two replicas would; each
// reaches the other's nodes through a FixedIPMover, as the shard router
// forwards the call to the old node's owner (the router's forwarding itself
// is tested in shard and cmd/cce-ipam).
func runMovers(t *testing.T, e *env) (*ipam.IPAM, *ipam.IPAM) {
	t.Helper()
	var toA, toB peerMover
	a, _ := runIPAMWith(t, e, ipam.Deps{Kube: e.kube, CCE: e.cce, Cloud: e.cloud, FixedIPMover: &toB})
	b, _ := runIPAMWith(t, e, ipam.Deps{Kube: e.kube, CCE: e.cce, Cloud: e.cloud, FixedIPMover: &toA})
	toA.peer.Store(a)
	toB.peer.Store(b)
	return a, b
}

type peerMover struct{ peer atomic.Pointer[ipam.IPAM] }

func (m *peerMover) FreeMovedIP(ctx context.Context, node, namespace, name string, addr netip.Addr, eniID string) error {
	return m.peer.Load().FreeMovedIP(ctx, node, namespace, name, addr, eniID)
}

// runIPAMWith runs an IPAM of the env's config with deps until the test
// ends; ctx ends with it.
func runIPAMWith(t *testing.T, e *env, deps ipam.Deps) (*ipam.IPAM, context.Context) {
	t.Helper()
	ip, err := ipam.New(e.cfg, deps, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- ip.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("ipam Run: %v", err)
		}
	})
	return ip, ctx
}

// A fixed IP whose re-add on the new node fails for a passing reason (BCE
// throttling or a 5xx storm) stays the pod's: the ADD fails with a retryable
// error and the next one re-adds it, rather than giving the pod a new IP
// (found by the chaos suite: a 429 at the re-add cost a pod its address).
func TestIPAM_FixedIPSurvivesATransientReAddFailure(t *testing.T) {
	e := newEnv(t, "fxretry", 2, testConfig(func(c *ipam.Config) {
		c.IdleMin = 2
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	sts := e.createStatefulSet("rt", 1)
	p := e.createStsPod(sts, 0, e.nodes[0], "", "c-1")
	r, err := e.allocate(p)
	if err != nil {
		t.Fatal(err)
	}
	fixed := r.IP
	if rr, err := e.release(p); err != nil || !rr.IsSuccess {
		t.Fatalf("DEL = %v, %v", rr, err)
	}
	e.deletePod(p.name)
	eventually(t, 15*time.Second, "an idle address on the new node", func() bool { return e.stats(e.nodes[1]).Idle >= 1 })
	p = e.createStsPod(sts, 0, e.nodes[1], "", "c-2")
	if err := e.sim.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpBatchAddPrivateIP: 1}}); err != nil {
		t.Fatal(err)
	}
	got, err := e.allocateTries(p, 0)
	if err == nil && got.IP != fixed {
		t.Fatalf("during a 5xx storm the pod got a new IP %s instead of its fixed %s", got.IP, fixed)
	}
	if err := e.sim.SetFaults(bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	if got, err = e.allocate(p); err != nil || got.IP != fixed {
		t.Fatalf("after the storm got %v, %v; want the fixed %s", got, err, fixed)
	}
	if !e.cloudIPs()[e.instance[e.nodes[1]]][fixed] {
		t.Fatalf("bce-sim does not show %s on the new node", fixed)
	}
	e.checkNoLeak()
}

// A fixed-IP StatefulSet pod whose old node was deleted (a scale-down) is
// recreated on a node of another replica. Nobody serves the deleted node,
// but its address is still on the node's ENI in the cloud: the holder of the
// old node's partition must free it there, or the pod could never start
// again (every ADD would fail asking a replica that does not serve the node).
func TestIPAM_FixedIPMovesOffADeletedNode(t *testing.T) {
	e, a, b := twoReplicas(t, "fxgone", 0)
	nodeA, nodeB := e.nodes[0], e.nodes[1]
	ca, cb := serveCNI(t, a), serveCNI(t, b)

	sts := e.createStatefulSet("gone", 1)
	p := e.createStsPod(sts, 0, nodeA, "", "c-a1")
	r, err := e.allocateVia(ca, p)
	if err != nil {
		t.Fatal(err)
	}
	fixed := r.IP
	if rr, err := e.releaseVia(ca, p); err != nil || !rr.IsSuccess {
		t.Fatalf("DEL on A = %v, %v", rr, err)
	}
	e.deletePod(p.name)
	// Node A is deleted: its owner stops serving it, as the shard layer
	// does when the Node goes.
	if err := e.kube.CoreV1().Nodes().Delete(e.ctx, nodeA, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.StopServingNode(nodeA)
	if !e.cloudIPs()[e.instance[nodeA]][fixed] {
		t.Fatalf("precondition: the fixed %s should still be on the deleted node's ENI", fixed)
	}

	p = e.createStsPod(sts, 0, nodeB, "", "c-b1")
	if r, err = e.allocateVia(cb, p); err != nil || r.IP != fixed {
		t.Fatalf("on B got %v, %v; want the fixed %s", r, err, fixed)
	}
	if e.cloudIPs()[e.instance[nodeA]][fixed] {
		t.Errorf("the fixed %s is still on the deleted node's ENI", fixed)
	}
	if !e.cloudIPs()[e.instance[nodeB]][fixed] {
		t.Errorf("the fixed %s is not on node B's ENI in the cloud", fixed)
	}
}
