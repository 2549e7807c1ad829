//go:build integration

package ipam_test

import (
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// 20 nodes × 30 pods allocate and release through the gRPC service: every pod
// gets a unique IP that bce-sim shows on an ENI of the pod's node, its
// WorkloadEndpoint matches, and after release the pools settle within
// [IdleMin, IdleMax] with nothing leaked.
func TestIPAM_AllocateRelease_20Nodes30Pods(t *testing.T) {
	e := newEnv(t, "ar", 20, testConfig(func(c *ipam.Config) {
		c.IdleMin = 2
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.Cooldown = time.Second
	}))
	pods := e.createPods("p", 30)
	replies := e.allocateAll(pods, 16)
	if len(replies) != len(pods) {
		t.Fatalf("%d of %d pods got an IP", len(replies), len(pods))
	}

	eniOwner := map[string]string{} // ENI → instance, from bce-sim
	ipENI := map[string]string{}    // IP → ENI, from bce-sim
	for _, eni := range e.sim.Dump().ENIs {
		eniOwner[eni.ENIID] = eni.InstanceID
		for _, ip := range eni.PrivateIPSet {
			ipENI[ip.PrivateIPAddress] = eni.ENIID
		}
	}
	seen := map[string]string{}
	for _, p := range pods {
		r := replies[p.name]
		if other, dup := seen[r.IP]; dup {
			t.Fatalf("I3 violated: %s and %s both got %s", other, p.name, r.IP)
		}
		seen[r.IP] = p.name
		if _, err := netip.ParseAddr(r.IP); err != nil {
			t.Fatalf("%s got %q", p.name, r.IP)
		}
		if r.Node != p.node || ipENI[r.IP] != r.ENIID || eniOwner[r.ENIID] != e.instance[p.node] {
			t.Fatalf("%s (node %s, instance %s): reply %v, but bce-sim has %s on ENI %q of instance %q",
				p.name, p.node, e.instance[p.node], r, r.IP, ipENI[r.IP], eniOwner[ipENI[r.IP]])
		}
		wep, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, p.name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("wep of %s: %v", p.name, err)
		}
		if wep.Spec.IP != r.IP || wep.Spec.ENIID != r.ENIID || wep.Spec.Node != p.node || wep.Spec.ContainerID != p.containerID {
			t.Fatalf("wep of %s = %+v, reply %v", p.name, wep.Spec, r)
		}
	}
	for _, n := range e.nodes {
		if st := e.stats(n); st.Assigned != 30 {
			t.Fatalf("node %s: %d assigned, want 30", n, st.Assigned)
		}
	}
	if got := e.gauge("cce_ipam_pool_ips", "state", "assigned"); got != 600 {
		t.Fatalf("cce_ipam_pool_ips{state=assigned} = %v, want 600", got)
	}
	if got := e.gauge("cce_ipam_served_nodes"); got != 20 {
		t.Fatalf("cce_ipam_served_nodes = %v, want 20", got)
	}
	if got := e.gauge("cce_ipam_allocations_total", "result", "ok", "path", "pool"); got != 600 {
		t.Fatalf("cce_ipam_allocations_total{ok,pool} = %v, want 600", got)
	}

	// A repeated ADD of the same sandbox gets the same IP.
	again, err := e.allocate(pods[0])
	if err != nil || again.IP != replies[pods[0].name].IP {
		t.Fatalf("repeated ADD = %v, %v; want %s", again, err, replies[pods[0].name].IP)
	}
	// A DEL with a stale container ID frees nothing.
	stale := pods[0]
	stale.containerID = "0000stale"
	if r, err := e.release(stale); err != nil || !r.IsSuccess || r.GetENIMultiIP() != nil {
		t.Fatalf("stale DEL = %v, %v; want success without payload", r, err)
	}
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, pods[0].name, metav1.GetOptions{}); err != nil {
		t.Fatalf("stale DEL removed the wep: %v", err)
	}

	for _, p := range pods {
		r, err := e.release(p)
		if err != nil || !r.IsSuccess || r.GetENIMultiIP().GetIP() != replies[p.name].IP {
			t.Fatalf("release %s = %v, %v", p.name, r, err)
		}
	}
	// A repeated DEL is a success without payload.
	if r, err := e.release(pods[0]); err != nil || !r.IsSuccess || r.GetENIMultiIP() != nil {
		t.Fatalf("repeated DEL = %v, %v", r, err)
	}
	weps, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil || len(weps.Items) != 0 {
		t.Fatalf("%d weps left after release (err %v)", len(weps.Items), err)
	}
	eventually(t, 30*time.Second, "every pool within [IdleMin, IdleMax]", func() bool {
		for _, n := range e.nodes {
			st := e.stats(n)
			if st.Assigned != 0 || st.Idle < e.cfg.IdleMin || st.Idle > e.cfg.IdleMax {
				return false
			}
		}
		return true
	})
	e.checkNoLeak()
}

// Restarting the IPAM rebuilds its state from the cloud and the weps, and
// allocations across the restart never hand out an IP twice.
func TestIPAM_RestartRebuildsAndNeverDuplicates(t *testing.T) {
	e := newEnv(t, "rs", 3, testConfig(func(c *ipam.Config) {
		c.IdleMin = 2
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	before := e.createPods("a", 8)
	first := e.allocateAll(before, 8)
	if len(first) != len(before) {
		t.Fatalf("%d of %d pods got an IP", len(first), len(before))
	}
	e.restart()
	for _, n := range e.nodes {
		if st := e.stats(n); st.Assigned != 8 {
			t.Fatalf("after restart node %s has %d assigned, want the 8 committed", n, st.Assigned)
		}
	}
	after := e.createPods("b", 8)
	second := e.allocateAll(after, 8)
	seen := map[string]string{}
	for name, r := range first {
		seen[r.IP] = name
	}
	for name, r := range second {
		if other, dup := seen[r.IP]; dup {
			t.Fatalf("I3 violated across restart: %s and %s both hold %s", other, name, r.IP)
		}
		seen[r.IP] = name
	}
	// The first pods' IPs are still theirs after the restart.
	if r, err := e.allocate(before[0]); err != nil || r.IP != first[before[0].name].IP {
		t.Fatalf("repeated ADD after restart = %v, %v; want %s", r, err, first[before[0].name].IP)
	}
	for _, p := range append(before, after...) {
		if r, err := e.release(p); err != nil || !r.IsSuccess {
			t.Fatalf("release %s = %v, %v", p.name, r, err)
		}
	}
	eventually(t, 30*time.Second, "pools settled", func() bool {
		for _, n := range e.nodes {
			// Held: a trim between its cloud delete and forgetting the
			// address (the datastore counts one the cloud no longer has).
			if st := e.stats(n); st.Assigned != 0 || st.Idle > e.cfg.IdleMax || st.Held != 0 {
				return false
			}
		}
		return true
	})
	e.checkNoLeak()
}

// A pod whose node is not served gets a clear, retryable error and no IP.
func TestIPAM_UnservedNodeRefused(t *testing.T) {
	e := newEnv(t, "un", 2, ipam.DefaultConfig())
	e.ipam.StopServingNode(e.nodes[1])
	if _, err := e.ipam.Stats(e.nodes[1]); err == nil {
		t.Fatal("stopped node still has datastore state")
	}
	if _, err := e.ipam.Stats(e.nodes[0]); err != nil {
		t.Fatalf("stopping one node dropped another's state: %v", err)
	}
	eventually(t, 30*time.Second, "the other node's pool keeps working", func() bool {
		return e.stats(e.nodes[0]).Total > 0
	})
	pods := e.createPods("x", 1)
	reply, err := e.cni.AllocateIP(e.ctx, &rpc.AllocateIPRequest{
		K8SPodName: pods[1].name, K8SPodNamespace: e.ns, K8SPodInfraContainerID: pods[1].containerID,
	})
	if err != nil || reply.IsSuccess || !strings.Contains(reply.ErrMsg, "not served") {
		t.Fatalf("allocate on an unserved node = %v, %v", reply, err)
	}
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, pods[1].name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a wep was written for a pod on an unserved node (err %v)", err)
	}
}

// A DEL racing an ADD of the same pod: they are serialised, and whatever the
// order, the pod ends with either its IP and wep (ADD last) or neither (DEL
// last) — never a wep without an assigned IP or an assigned IP without wep.
func TestIPAM_DelRacingAdd(t *testing.T) {
	e := newEnv(t, "race", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 4
		c.IdleMax = 8
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	pods := e.createPods("r", 12)
	for _, p := range pods {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = e.cni.AllocateIP(e.ctx, &rpc.AllocateIPRequest{K8SPodName: p.name, K8SPodNamespace: e.ns, K8SPodInfraContainerID: p.containerID})
		}()
		if _, err := e.release(p); err != nil {
			t.Fatal(err)
		}
		<-done
	}
	weps, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := e.stats(e.nodes[0]); st.Assigned != len(weps.Items) {
		t.Fatalf("%d assigned IPs but %d weps after racing ADD/DEL", st.Assigned, len(weps.Items))
	}
	e.checkNoLeak()
}

// A pod bound a moment ago is not yet in its node's watch (which sees only
// bound pods): the ADD must read the binding from the API server instead of
// failing. Half the calls name the node, as the plugin does, half do not.
func TestIPAM_AllocateRightAfterBinding(t *testing.T) {
	e := newEnv(t, "bind", 1, testConfig(func(c *ipam.Config) {
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	for k := range 20 {
		name := "late-" + strconv.Itoa(k)
		if _, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := e.kube.CoreV1().Pods(e.ns).Bind(e.ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Target: corev1.ObjectReference{Kind: "Node", Name: e.nodes[0]},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		req := &rpc.AllocateIPRequest{K8SPodName: name, K8SPodNamespace: e.ns, K8SPodInfraContainerID: "c" + strconv.Itoa(k)}
		if k%2 == 0 {
			req.K8SNodeName = e.nodes[0]
		}
		reply, err := e.cni.AllocateIP(e.ctx, req)
		if err != nil || !reply.IsSuccess {
			t.Fatalf("ADD right after binding: %v %v", reply, err)
		}
	}
}

// An ADD whose caller names another node than the pod's gets a clear error
// and takes nothing: an IP of the other node's ENI would be useless to it.
func TestIPAM_WrongNodeRefused(t *testing.T) {
	e := newEnv(t, "wrongnode", 2, testConfig(func(c *ipam.Config) {
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	p := e.createPods("w", 1)[0] // on nodes[0]
	before := e.stats(p.node)
	reply, err := e.cni.AllocateIP(e.ctx, &rpc.AllocateIPRequest{
		K8SPodName: p.name, K8SPodNamespace: e.ns, K8SPodInfraContainerID: p.containerID, K8SNodeName: e.nodes[1],
	})
	if err != nil {
		t.Fatal(err)
	}
	if reply.IsSuccess || !strings.Contains(reply.ErrMsg, "bound to node "+p.node) {
		t.Fatalf("ADD naming the wrong node: success=%v %q, want a refusal naming %s", reply.IsSuccess, reply.ErrMsg, p.node)
	}
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, p.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("refused ADD left a WorkloadEndpoint (err %v)", err)
	}
	for _, n := range e.nodes {
		if st := e.stats(n); st.Assigned != 0 {
			t.Fatalf("refused ADD assigned an IP on %s: %+v (before %+v)", n, st, before)
		}
	}
	if _, err := e.allocate(p); err != nil {
		t.Fatalf("ADD naming the right node: %v", err)
	}
}

// Serving a node starts its pod watch; stopping it must end it, or a
// replica whose nodes come and go would leak goroutines and connections.
func TestIPAM_StopServingEndsWatches(t *testing.T) {
	e := newEnv(t, "watchstop", 1, testConfig(func(c *ipam.Config) {
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	p := e.createPods("ws", 1)[0]
	eventually(t, 10*time.Second, "pod in its node's watch", func() bool {
		_, ok := e.ipam.PodFromCache(p.node, e.ns, p.name)
		return ok
	})
	base := runtime.NumGoroutine()
	const cycles = 10
	for range cycles {
		e.ipam.StopServingNode(p.node)
		if _, ok := e.ipam.PodFromCache(p.node, e.ns, p.name); ok {
			t.Fatal("an unserved node still answers from its watch")
		}
		if err := e.ipam.ServeNode(e.ctx, p.node); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "pod in the new watch", func() bool {
			_, ok := e.ipam.PodFromCache(p.node, e.ns, p.name)
			return ok
		})
	}
	// A node's watch takes at least two goroutines (the reflector and its
	// stream decoder): a leak of ten cycles' worth is well above this.
	eventually(t, 10*time.Second, "goroutines back to the level of one served node", func() bool {
		return runtime.NumGoroutine() <= base+8
	})
}

// A takeover of many nodes reads the weps in one bulk read instead of one
// per node: every node must get back exactly its own pods' claims, so that
// nothing they hold is handed out again.
func TestIPAM_BulkRebuildRestoresEveryNode(t *testing.T) {
	const nodes = 40 // above the bulk threshold
	e := newEnv(t, "bulk", nodes, testConfig(func(c *ipam.Config) {
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	pods := e.createPods("b", 2)
	held := e.allocateAll(pods, 8)
	e.restart() // a fresh IPAM serving all 40 nodes in one ServeNodes
	for _, n := range e.nodes {
		if st := e.stats(n); st.Assigned != 2 {
			t.Fatalf("node %s restored with %d assigned IPs, want its 2 pods'", n, st.Assigned)
		}
	}
	// New pods get addresses no old pod holds.
	taken := map[string]string{}
	for name, r := range held {
		taken[r.IP] = name
	}
	for name, r := range e.allocateAll(e.createPods("c", 1), 8) {
		if old, dup := taken[r.IP]; dup {
			t.Fatalf("%s got %s, still held by %s", name, r.IP, old)
		}
	}
}
