//go:build integration

package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
)

// The fleet as a test uses it: its own control plane, bce-sim and a replica
// as processes, pods getting IPs through the kubelet simulator; a SIGKILLed
// replica and a restarted API server are served again; a SIGSTOPped replica
// comes back; the invariant checker is clean at the end.
func TestFleet_OwnControlPlane_SurvivesKillAndAPIServerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	f := fleet.Start(t, fleet.Options{
		Name:  "ft",
		Nodes: 2,
	})
	if f.Cluster == nil || len(f.Nodes()) != 2 || len(f.CNIAddrs()) != 1 {
		t.Fatalf("fleet: cluster %v, nodes %v, CNI %v", f.Cluster != nil, f.Nodes(), f.CNIAddrs())
	}
	t.Logf("logs in %s", f.Dir)
	ns := createNamespace(ctx, t, f.Kube)

	createPods(ctx, t, f.Kube, ns, "a", 4)
	waitRunning(ctx, t, f.Kube, ns, 4)
	r := f.Replica(0)
	if v, err := r.Metric(ctx, "cce_ipam_allocations_total", map[string]string{"result": "ok"}); err != nil || v < 4 {
		t.Fatalf("allocations_total{result=ok} = %v, %v; want >= 4", v, err)
	}
	st, err := f.SimStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ops[bcesim.OpCreateENI].Calls < 2 {
		t.Fatalf("bce-sim saw %d CreateENI calls, want one per node", st.Ops[bcesim.OpCreateENI].Calls)
	}
	t.Logf("bce-sim: %d calls, %d throttled, busiest second %d", st.All.Calls, st.All.Throttled, st.All.MaxPerSecond())

	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if r.Running() || r.Ready() {
		t.Fatal("killed replica still running")
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	createPods(ctx, t, f.Kube, ns, "b", 2)
	waitRunning(ctx, t, f.Kube, ns, 6)

	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if r.Ready() {
		t.Fatal("SIGSTOPped replica answered /readyz")
	}
	if err := r.Cont(); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := f.RestartAPIServer(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver restarted in %s", time.Since(start).Round(time.Millisecond))
	createPods(ctx, t, f.Kube, ns, "c", 2)
	waitRunning(ctx, t, f.Kube, ns, 8)

	if err := f.SetFaults(ctx, bcesim.Faults{ErrorRate: map[bcesim.Op]float64{"*": 0.5}}); err != nil {
		t.Fatal(err)
	}
	if err := f.SetFaults(ctx, bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	chk, err := f.Checker(invariants.Config{
		Namespaces:  []string{ns},
		OrphanGrace: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if vs, err := chk.WaitClean(wctx, time.Second); err != nil {
		t.Fatalf("invariants: %v\n%s", err, vs)
	}
	ks := f.Kubelet().Stats()
	t.Logf("kubelet-sim: %d allocations (%d errors), allocate p50 %s p99 %s", ks.Allocations, ks.AllocationErrors,
		ks.AllocateLatency.P50, ks.AllocateLatency.P99)
}

func createNamespace(ctx context.Context, t *testing.T, kube kubernetes.Interface) string {
	t.Helper()
	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fleet-"}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func createPods(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, prefix string, n int) {
	t.Helper()
	for i := range n {
		zero := int64(0)
		_, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name:  "c",
				Image: "pause",
			}},
				TerminationGracePeriodSeconds: &zero},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func waitRunning(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns string, n int) {
	t.Helper()
	var running int
	for {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			running = 0
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
					running++
				}
			}
			if running == n {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d pods Running: %v", running, n, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// members scrapes cce_ipam_shard_members of every running replica.
func members(ctx context.Context, f *fleet.Fleet) map[int]float64 {
	out := map[int]float64{}
	for _, r := range f.Live() {
		if v, err := r.Metric(ctx, "cce_ipam_shard_members", nil); err == nil {
			out[r.Index()] = v
		}
	}
	return out
}

func waitMembers(ctx context.Context, t *testing.T, f *fleet.Fleet, want map[int]float64) {
	t.Helper()
	for {
		got := members(ctx, f)
		same := len(got) == len(want)
		for i, w := range want {
			same = same && got[i] == w
		}
		if same {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("members per replica %v, want %v: %v", got, want, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Replicas in network namespaces on a bridge: they find each other, serve
// pods, and a partitioned replica loses its peers (and they it) while the
// kubelet simulator, kube-apiserver and bce-sim still reach it; healing
// brings the ring back.
func TestFleet_NetNS_PartitionAndHeal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	f := fleet.Start(t, fleet.Options{
		Name:     "nsp",
		Replicas: 3,
		Nodes:    4,
		NetNS:    true,
	})
	r0 := f.Replica(0)
	t.Logf("replica 0 runs in %s at %s", r0.NetNS(), r0.GRPCAddr())
	if r0.NetNS() == "" || strings.HasPrefix(r0.GRPCAddr(), "127.") {
		t.Fatalf("replica 0 is not in a network namespace: %q %s", r0.NetNS(), r0.GRPCAddr())
	}
	waitMembers(ctx, t, f, map[int]float64{0: 3, 1: 3, 2: 3})
	ns := createNamespace(ctx, t, f.Kube)
	createPods(ctx, t, f.Kube, ns, "a", 6)
	waitRunning(ctx, t, f.Kube, ns, 6)

	if err := f.Partition(r0); err != nil {
		t.Fatal(err)
	}
	if !f.Partitioned(r0) {
		t.Fatal("Partitioned(r0) = false after Partition")
	}
	start := time.Now()
	waitMembers(ctx, t, f, map[int]float64{0: 1, 1: 2, 2: 2})
	t.Logf("partition seen by every replica after %s", time.Since(start).Round(time.Millisecond))
	if !r0.Ready() {
		t.Log("replica 0 reports not ready while cut off")
	}
	createPods(ctx, t, f.Kube, ns, "b", 4)
	waitRunning(ctx, t, f.Kube, ns, 10)

	if err := f.Heal(r0); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	waitMembers(ctx, t, f, map[int]float64{0: 3, 1: 3, 2: 3})
	t.Logf("ring healed after %s", time.Since(start).Round(time.Millisecond))
	chk, err := f.Checker(invariants.Config{
		Namespaces:  []string{ns},
		OrphanGrace: 20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if vs, err := chk.WaitClean(wctx, time.Second); err != nil {
		t.Fatalf("invariants: %v\n%s", err, vs)
	}
}
