//go:build integration

package ipam_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/shard"
)

// tokenFence is a fence whose clock always says yes, under a token the test
// sets: a replica that does not know it lost its partition.
type tokenFence struct {
	mu  sync.Mutex
	tok ipam.FenceToken
}

func (f *tokenFence) MayAct(string) (time.Time, error) { return time.Time{}, nil }

func (f *tokenFence) FenceToken(string) (ipam.FenceToken, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tok, time.Time{}, nil
}

func (f *tokenFence) set(holder string, epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tok.Holder, f.tok.Epoch = holder, epoch
}

// The wep writes of the release path under the API server's fencing policy:
// an allocation's wep carries the token; once the claim moved, the stale
// replica's release (stamp, then delete) and a new allocation are refused by
// the API server and the wep stays, each refusal counted in
// cce_ipam_fenced_writes_total{by="apiserver"} (the replica's own fence,
// which still says yes, counts none); under the current claim the release
// deletes it.
func TestIPAM_WEPWritesFencedByTheAPIServer(t *testing.T) {
	e := newEnv(t, "fencewep", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 2
		c.IdleMax = 6
		c.PoolCheckPeriod = 200 * time.Millisecond
	}))
	e.stop() // the env's own IPAM runs as admin, without a fence
	node := e.nodes[0]
	p := shard.PartitionOf(271, node)
	ctx := e.ctx
	leases := e.kube.CoordinationV1().Leases(e.ns)
	claim, err := leases.Create(ctx, &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: shard.PartitionLeaseName(p), Labels: map[string]string{"cce.io/shard-object": "partition"}},
		Spec:       coordv1.LeaseSpec{HolderIdentity: ptr.To("r0"), LeaseTransitions: ptr.To(int32(1))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, remove, err := cp.InstallFencingPolicy(ctx, filepath.Join("..", "..", "charts", "cce-ipam"), e.ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)

	fence := &tokenFence{tok: ipam.FenceToken{Partition: p, Holder: "r0", Epoch: 1}}
	reg := prometheus.NewRegistry()
	ip, err := ipam.New(e.cfg, ipam.Deps{Kube: e.kube, CCE: versioned.NewForConfigOrDie(cp.ReplicaConfig), Cloud: e.cloud, Fence: fence},
		slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	fenced := func(by string) float64 { return metricValue(t, reg, "cce_ipam_fenced_writes_total", "by", by) }
	// Both series from the start, at 0 (a series first seen at 1 shows no
	// increase() in Prometheus).
	if r, a := fenced("replica"), fenced("apiserver"); r != 0 || a != 0 {
		t.Fatalf("fenced writes at start: replica %v, apiserver %v; want both series at 0", r, a)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = ip.Run(runCtx) }()
	for n, err := range ip.ServeNodes(runCtx, e.nodes) {
		t.Fatalf("serve %s: %v", n, err)
	}
	pods := e.createPods("p", 2)
	ref := func(p podRef) podip.PodRef {
		return podip.PodRef{Namespace: e.ns, Name: p.name, ContainerID: p.containerID, Node: p.node}
	}
	var ep podip.Endpoint
	for ctx.Err() == nil { // the pool fills first
		if ep, err = ip.Allocate(ctx, ref(pods[0])); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, pods[0].name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Labels[ipam.LabelFencePartition] != strconv.Itoa(p) || w.Labels[ipam.LabelFenceGroup] != strconv.Itoa(p/ipam.FenceGroupSize) ||
		w.Annotations[ipam.AnnoFenceHolder] != "r0" ||
		w.Annotations[ipam.AnnoFenceEpoch] != "1" {
		t.Fatalf("wep of %s carries labels %v annotations %v, want the token of partition %d, r0, epoch 1",
			pods[0].name, w.Labels, w.Annotations, p)
	}

	// The claim moves to r1; this replica's fence still says r0.
	claim.Spec.HolderIdentity, claim.Spec.LeaseTransitions = ptr.To("r1"), ptr.To(int32(2))
	if _, err := leases.Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the policy's informer sees it (milliseconds, see e2e/cluster)
	_, _, err = ip.Release(ctx, ref(pods[0]))
	if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("the stale replica's release: %v, want refused by the fencing policy", err)
	}
	t.Logf("stale release refused: %v", err)
	if got := fenced("apiserver"); got != 1 {
		t.Fatalf("fenced writes by the apiserver after the refused release: %v, want 1", got)
	}
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, pods[0].name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the wep is gone after a refused release: %v", err)
	}
	if _, err := ip.Allocate(ctx, ref(pods[1])); err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("the stale replica's allocation: %v, want refused by the fencing policy", err)
	}
	if a, r := fenced("apiserver"), fenced("replica"); a != 2 || r != 0 {
		t.Fatalf("fenced writes after the refused allocation: apiserver %v, replica %v; want 2 and 0", a, r)
	}

	// Under the current claim the release deletes the wep.
	fence.set("r1", 2)
	if _, ok, err := ip.Release(ctx, ref(pods[0])); err != nil || !ok {
		t.Fatalf("release under the current claim: ok=%v %v", ok, err)
	}
	if got := fenced("apiserver"); got != 2 {
		t.Fatalf("fenced writes by the apiserver after the accepted release: %v, want still 2", got)
	}
	if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, pods[0].name, metav1.GetOptions{}); err == nil {
		t.Fatal("the wep survived its release")
	}
	_ = ep
}
