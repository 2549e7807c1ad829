//go:build integration

package ipam_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// A subnet that runs dry: the pods that fit get IPs, the others get a clear
// error naming the cause, and no IP leaks (cloud IPs = datastore, every
// assigned IP has its wep).
func TestIPAM_SubnetExhausted(t *testing.T) {
	// 10.3.0.0/28: 16 addresses, 4 reserved by the cloud (network, gateway,
	// broadcast, …) and 2 ENI primaries: about 9–10 for pods.
	e := newEnvIn(t, "sx", 2, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 4
		c.BatchAdd = 4
		c.AllocateWait = 2 * time.Second
		c.PoolCheckPeriod = 200 * time.Millisecond
	}), world{subnetCIDR: "10.3.0.0/28", annotateMaxIPs: true})
	// The Subnet resource, as the (leader's) Subnet controller keeps it:
	// the cloud's "no more IP" must be declared on it.
	const subnetID = "sbn-sx"
	subnets := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace)
	if _, err := subnets.Create(e.ctx, &cce.Subnet{ObjectMeta: metav1.ObjectMeta{Name: subnetID},
		Spec:   cce.SubnetSpec{ID: subnetID, CIDR: "10.3.0.0/28"},
		Status: cce.SubnetStatus{Enable: true, AvailableIPNum: 10}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = subnets.Delete(context.Background(), subnetID, metav1.DeleteOptions{}) })
	pods := e.createPods("p", 8)
	ok, failed := 0, 0
	var lastErr error
	for _, p := range pods {
		if _, err := e.allocateTries(p, 0); err != nil {
			failed++
			lastErr = err
			continue
		}
		ok++
	}
	if failed == 0 || ok == 0 {
		t.Fatalf("%d allocations ok, %d failed; want both (the subnet holds about 10)", ok, failed)
	}
	// The cloud's own error, or, once the Subnet is marked, the ENI planner's
	// refusal naming it.
	if msg := lastErr.Error(); !strings.Contains(msg, "subnet_has_no_more_ip") && !strings.Contains(msg, "no more") &&
		!strings.Contains(msg, subnetID+" exhausted") {
		t.Fatalf("failure %q does not name the exhausted subnet", lastErr)
	}
	weps, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil || len(weps.Items) != ok {
		t.Fatalf("%d weps for %d successful allocations (err %v)", len(weps.Items), ok, err)
	}
	// The pods that got no IP carry an Event saying why.
	eventually(t, 10*time.Second, "AllocateIPFailed events on the failed pods", func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=AllocateIPFailed"})
		if err != nil || len(evs.Items) == 0 {
			return false
		}
		return strings.Contains(evs.Items[0].Message, "no more") || strings.Contains(evs.Items[0].Message, "subnet_has_no_more_ip")
	})
	assigned := 0
	for _, n := range e.nodes {
		assigned += e.stats(n).Assigned
	}
	if assigned != ok {
		t.Fatalf("datastore has %d assigned for %d allocations", assigned, ok)
	}
	// The cloud's refusal is declared on the Subnet, with a Warning on it.
	eventually(t, 10*time.Second, "the Subnet marked hasNoMoreIP with a SubnetExhausted Warning", func() bool {
		sn, err := subnets.Get(e.ctx, subnetID, metav1.GetOptions{})
		if err != nil || !sn.Status.HasNoMoreIP {
			return false
		}
		evs, err := e.kube.CoreV1().Events(cce.SubnetNamespace).List(e.ctx, metav1.ListOptions{
			FieldSelector: "reason=SubnetExhausted,involvedObject.name=" + subnetID})
		return err == nil && len(evs.Items) > 0 && evs.Items[0].Type == corev1.EventTypeWarning
	})
	e.checkNoLeak()
}

// An instance whose memory caps its ENI at 8 addresses, with no annotation
// telling the IPAM the cap, and allowed only one ENI: the cloud's
// VmMemoryCanNotAttachMoreIp stops the pool (with backoff, not a storm), pods
// beyond the cap get a clear error, and nothing leaks.
func TestIPAM_VMMemoryCap(t *testing.T) {
	e := newEnvIn(t, "vm", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 4
		c.BatchAdd = 4
		c.AllocateWait = 2 * time.Second
		c.PoolCheckPeriod = 200 * time.Millisecond
	}), world{memoryGB: 4, maxENIs: 1})
	capIPs := bcesim.MaxIPsPerENI(4) - 1 // minus the primary
	pods := e.createPods("p", capIPs+3)
	ok := 0
	var lastErr error
	for _, p := range pods {
		if _, err := e.allocateTries(p, 0); err != nil {
			lastErr = err
			continue
		}
		ok++
	}
	if ok != capIPs {
		t.Fatalf("%d pods got an IP, want the %d that fit on the ENI", ok, capIPs)
	}
	if lastErr == nil || !strings.Contains(lastErr.Error(), "vm_memory") {
		t.Fatalf("failure %v does not name the memory cap", lastErr)
	}
	// Backoff: the cloud was not stormed while pods kept asking.
	adds := e.sim.Stats().Ops[bcesim.OpBatchAddPrivateIP].Calls
	if adds > 20 {
		t.Fatalf("%d BatchAddPrivateIP calls for %d pods: the full ENI was not backed off", adds, len(pods))
	}
	e.checkNoLeak()
}

// A throttled cloud (429 RateLimit on adds): allocations still succeed,
// only slower, and nothing leaks.
func TestIPAM_RateLimitedCloud(t *testing.T) {
	e := newEnv(t, "rl", 2, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.IdleMax = 6
		c.BatchAdd = 2
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	if err := e.sim.SetRateLimits(map[bcesim.Op]bcesim.RateLimit{bcesim.OpBatchAddPrivateIP: {QPS: 2, Burst: 1}}); err != nil {
		t.Fatal(err)
	}
	pods := e.createPods("p", 10)
	replies := e.allocateAll(pods, 4)
	if len(replies) != len(pods) {
		t.Fatalf("%d of %d pods got an IP under rate limiting", len(replies), len(pods))
	}
	if throttled := e.sim.Stats().Ops[bcesim.OpBatchAddPrivateIP].Throttled; throttled == 0 {
		t.Fatal("bce-sim never throttled: the test did not exercise rate limiting")
	}
	e.checkNoLeak()
}

// A node without any ENI gets one created and attached from its IPPool's
// subnet and security groups; when its ENI is full (memory cap) a second one
// is created; every pod gets an IP and nothing leaks.
func TestIPAM_CreatesENIsWhenNeeded(t *testing.T) {
	e := newEnvIn(t, "ce", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 2
		c.IdleMax = 6
		c.BatchAdd = 4
		c.AllocateWait = 30 * time.Second
		c.PoolCheckPeriod = 200 * time.Millisecond
		c.SubnetSelection = ipam.SubnetLeastENI
	}),
		world{memoryGB: 4, annotateMaxIPs: true, noENI: true, ipPool: true, secondSubnet: true})
	perENI := bcesim.MaxIPsPerENI(4) - 1
	pods := e.createPods("p", perENI+3)
	replies := e.allocateAll(pods, 2)
	if len(replies) != len(pods) {
		t.Fatalf("%d of %d pods got an IP", len(replies), len(pods))
	}
	enis := map[string]bool{}
	subnets := map[string]bool{}
	for _, r := range replies {
		enis[r.ENIID] = true
		subnets[r.SubnetID] = true
	}
	if len(subnets) != 2 {
		t.Fatalf("LeastENI put the node's ENIs in %d subnet(s), want one per subnet of its IPPool", len(subnets))
	}
	if len(enis) != 2 {
		t.Fatalf("pods are on %d ENIs, want 2 (one created for the empty node, one when it filled)", len(enis))
	}
	for id := range enis {
		var found bool
		for _, eni := range e.sim.Dump().ENIs {
			if eni.ENIID == id {
				found = eni.InstanceID == e.instance[e.nodes[0]] && eni.Status == "inuse" && strings.HasPrefix(eni.Name, testCluster+"/")
			}
		}
		if !found {
			t.Fatalf("ENI %s is not an in-use ENI of the node's instance named after the cluster", id)
		}
	}
	// Events are written asynchronously.
	eventually(t, 10*time.Second, "CreateNewENI event on the node", func() bool {
		evs, err := e.kube.CoreV1().Events(metav1.NamespaceDefault).List(e.ctx, metav1.ListOptions{FieldSelector: "reason=CreateNewENI"})
		if err != nil {
			return false
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == e.nodes[0] {
				return true
			}
		}
		return false
	})
	// The ENI sync writes the node's IPPool status.
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		t.Fatal(err)
	}
	pool, err := e.cce.CceV1alpha1().IPPools(cce.IPPoolNamespace).Get(e.ctx, cce.IPPoolName(e.nodes[0]), metav1.GetOptions{})
	if err != nil || len(pool.Status.ENI.ENIs) != 2 {
		t.Fatalf("IPPool status has %d ENIs (err %v), want 2", len(pool.Status.ENI.ENIs), err)
	}
	e.checkNoLeak()
}

// An ENI of the cluster left unattached (its creator crashed between create
// and attach) is deleted by the ENI sync once it is old enough; attached ENIs
// and other clusters' ENIs are left alone.
func TestIPAM_SyncDeletesLeakedENIs(t *testing.T) {
	e := newEnv(t, "le", 1, testConfig(func(c *ipam.Config) {
		c.LeakedENIAge = time.Second
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	inst, node := e.instance[e.nodes[0]], e.nodes[0]
	sg := "g-le"
	leaked, err := e.cloud.CreateENI(e.ctx, cloud.CreateENIRequest{
		Name:             testCluster + "/" + inst + "/" + node + "/abcdef",
		SubnetID:         "sbn-le",
		SecurityGroupIDs: []string{sg},
	})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := e.cloud.CreateENI(e.ctx, cloud.CreateENIRequest{
		Name:             "other-cluster/" + inst + "/" + node + "/abcdef",
		SubnetID:         "sbn-le",
		SecurityGroupIDs: []string{sg},
	})
	if err != nil {
		t.Fatal(err)
	}
	// An ENI of a node that was deleted: no shard serves it; the leader
	// (a single IPAM leads) sweeps it.
	orphan, err := e.cloud.CreateENI(e.ctx, cloud.CreateENIRequest{
		Name:             testCluster + "/" + inst + "/le-deleted-node/abcdef",
		SubnetID:         "sbn-le",
		SecurityGroupIDs: []string{sg},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cloud.GetENI(e.ctx, leaked); err != nil {
		t.Fatalf("a fresh unattached ENI was deleted before LeakedENIAge: %v", err)
	}
	eventually(t, 20*time.Second, "leaked ENI deleted", func() bool {
		if err := e.ipam.SyncENIs(e.ctx); err != nil {
			t.Fatal(err)
		}
		_, err := e.cloud.GetENI(e.ctx, leaked)
		_, err2 := e.cloud.GetENI(e.ctx, orphan)
		return errors.Is(err, cloud.ErrENINotFound) && errors.Is(err2, cloud.ErrENINotFound)
	})
	if _, err := e.cloud.GetENI(e.ctx, foreign); err != nil {
		t.Fatalf("another cluster's ENI was deleted: %v", err)
	}
	if st := e.stats(node); len(st.ENIs) != 1 {
		t.Fatalf("the attached ENI was dropped: %d ENIs", len(st.ENIs))
	}
}

// An ENI that vanishes from the cloud's list is dropped only when two syncs
// in a row miss it: one list may predate an ENI created meanwhile.
func TestIPAM_SyncDropsVanishedENIAfterTwoMisses(t *testing.T) {
	e := newEnv(t, "vn", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.PoolCheckPeriod = time.Hour
	}))
	node := e.nodes[0]
	enis := e.stats(node).ENIs
	if len(enis) != 1 {
		t.Fatalf("node has %d ENIs, want 1", len(enis))
	}
	if err := e.cloud.DetachENI(e.ctx, enis[0].ID, e.instance[node]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "ENI detached in the cloud", func() bool {
		got, err := e.cloud.GetENI(e.ctx, enis[0].ID)
		return err == nil && got.Status == cloud.ENIStatusAvailable
	})
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(e.stats(node).ENIs); n != 1 {
		t.Fatalf("one missed sync dropped the ENI (%d left)", n)
	}
	if err := e.ipam.SyncENIs(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(e.stats(node).ENIs); n != 0 {
		t.Fatalf("two missed syncs kept the vanished ENI (%d left)", n)
	}
}

// runOwnIPAM runs an IPAM of its own over the env's cluster with the given
// cloud, stopped when the test ends.
func runOwnIPAM(t *testing.T, e *env, c cloud.Provider) (*ipam.IPAM, context.Context) {
	t.Helper()
	return runIPAMWith(t, e, ipam.Deps{Kube: e.kube, CCE: e.cce, Cloud: c})
}

// listRecorder is the real cloud client, remembering which instances the
// ENIs of each ListENIs answer were attached to.
type listRecorder struct {
	cloud.Provider
	mu    sync.Mutex
	lists [][]string
}

func (r *listRecorder) ListENIs(ctx context.Context, opts cloud.ListENIsOptions) ([]cloud.ENI, error) {
	enis, err := r.Provider.ListENIs(ctx, opts)
	var got []string
	for _, e := range enis {
		got = append(got, e.InstanceID)
	}
	r.mu.Lock()
	r.lists = append(r.lists, got)
	r.mu.Unlock()
	return enis, err
}

func (r *listRecorder) last() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lists[len(r.lists)-1]
}

// A replica serving one node of three keeps only that node's ENIs from the
// VPC-wide lists (takeover and sync), so its memory follows its share; the
// other nodes' ENIs are not adopted, and the served node's new ENI is.
func TestIPAM_ListsKeepOnlyServedNodesENIs(t *testing.T) {
	e := newEnv(t, "sh", 3, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.PoolCheckPeriod = time.Hour
	}))
	e.stop() // the env's IPAM serves every node; this test runs its own
	rec := &listRecorder{Provider: e.cloud}
	ip, ctx := runOwnIPAM(t, e, rec)
	mine := e.nodes[0]
	if err := ip.ServeNode(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(); !slices.Equal(got, []string{e.instance[mine]}) {
		t.Fatalf("takeover list kept ENIs of instances %v, want only %s's", got, e.instance[mine])
	}

	// A second ENI attached to the served node out of band is adopted; one
	// attached to an unserved node's instance is not even kept.
	extra, err := e.cloud.CreateENI(ctx, cloud.CreateENIRequest{
		Name:             testCluster + "/" + e.instance[mine] + "/" + mine + "/extra0",
		SubnetID:         "sbn-sh",
		SecurityGroupIDs: []string{"g-sh"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cloud.AttachENI(ctx, extra, e.instance[mine]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "extra ENI in use", func() bool {
		got, err := e.cloud.GetENI(ctx, extra)
		return err == nil && got.Status == cloud.ENIStatusInUse
	})
	if err := ip.SyncENIs(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(); !slices.Equal(got, []string{e.instance[mine], e.instance[mine]}) {
		t.Fatalf("sync list kept ENIs of instances %v, want only %s's two", got, e.instance[mine])
	}
	if st, err := ip.Stats(mine); err != nil || len(st.ENIs) != 2 {
		t.Fatalf("served node has %d ENIs after the sync (%v), want 2", len(st.ENIs), err)
	}
}

// takeoverHolder is the real cloud client; it holds the takeover of
// instance `hold` for a while after its ENI list returned, and records the
// lists that went through (not those the client refused) meanwhile and after.
type takeoverHolder struct {
	cloud.Provider
	hold          string
	held, release chan struct{}
	listEnd       atomic.Int64 // unix ns: when the takeover's list returned
	holding       atomic.Bool
	during        atomic.Int32
	resumedAt     atomic.Int64 // unix ns of the first list for it after the hold
}

func (h *takeoverHolder) ListENIs(ctx context.Context, opts cloud.ListENIsOptions) ([]cloud.ENI, error) {
	began := time.Now().UnixNano()
	enis, err := h.Provider.ListENIs(ctx, opts)
	switch {
	case opts.Instances[h.hold] && len(opts.Instances) == 1 && h.listEnd.Load() == 0:
		// The takeover's list (the later settling list is like the sync's).
		h.listEnd.Store(time.Now().UnixNano())
		h.holding.Store(true)
		close(h.held)
		<-h.release
		h.holding.Store(false)
	case err != nil:
	case h.holding.Load() && began > h.listEnd.Load(): // not one in flight when the takeover began
		h.during.Add(1)
	case opts.Instances[h.hold]:
		h.resumedAt.CompareAndSwap(0, time.Now().UnixNano())
	}
	return enis, err
}

// A takeover's ENI list is Urgent and the periodic sync's NoWait: for 5 s
// after the takeover listed (another replica's takeover may still be
// retrying for the cluster's next ListENIs token), the same replica's
// periodic sync makes no list; then it resumes. (That it also makes none
// while the list is in flight is cloud's TestNoWait_YieldsToAnUrgentCallOfTheOperation.)
func TestIPAM_PeriodicSyncYieldsToATakeover(t *testing.T) {
	e := newEnv(t, "sy", 2, testConfig(func(c *ipam.Config) {
		c.IdleMin = 1
		c.PoolCheckPeriod = time.Hour
		c.ENISyncPeriod = 100 * time.Millisecond
	}))
	e.stop() // the env's IPAM serves every node; this test runs its own
	first, second := e.nodes[0], e.nodes[1]
	h := &takeoverHolder{Provider: e.cloud, hold: e.instance[second], held: make(chan struct{}), release: make(chan struct{})}
	ip, ctx := runOwnIPAM(t, e, h)
	if err := ip.ServeNode(ctx, first); err != nil { // the syncs now have a node to list for
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- ip.ServeNode(ctx, second) }()
	select {
	case <-h.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the takeover never listed ENIs")
	}
	time.Sleep(3 * time.Second) // ~30 sync periods, and the sync's retries after a skip (1-2 s)
	close(h.release)
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if n := h.during.Load(); n != 0 {
		t.Fatalf("%d periodic lists went through in the 3 s after the takeover's list, want none", n)
	}
	eventually(t, 20*time.Second, "the periodic sync listing again, for both nodes", func() bool { return h.resumedAt.Load() != 0 })
	if quiet := time.Unix(0, h.resumedAt.Load()).Sub(time.Unix(0, h.listEnd.Load())); quiet < 4500*time.Millisecond {
		t.Fatalf("the periodic sync listed again %v after the takeover's list, want it to keep quiet for 5 s", quiet)
	}
}
