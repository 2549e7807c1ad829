//go:build integration

package sharding_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
)

var env *suite.Env

func TestMain(m *testing.M) { os.Exit(suite.Main(m, &env, false)) }

// cniCounts sums the CNI calls a replica received from CNI plugins (hop
// entry) and those it forwarded to the node's owner.
func cniCounts(ctx context.Context, t *testing.T, r *fleet.Replica) (requests, forwarded float64) {
	t.Helper()
	ss, err := r.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	requests, _ = ss.Sum("cce_ipam_cni_requests_total", map[string]string{"hop": "entry"})
	forwarded, _ = ss.Sum("cce_ipam_shard_forwarded_requests_total", map[string]string{"result": "ok"})
	return requests, forwarded
}

func TestSharding(t *testing.T) {
	if !env.Local() {
		t.Fatal("the sharding suite starts and stops replica processes: run it locally (make e2e), not against kind")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	f := env.Fleet(t, fleet.Options{
		Name:     "shard",
		Replicas: 3,
		Nodes:    12,
	})
	own := suite.WaitSharded(ctx, t, f)
	t.Logf("3 replicas: %s", own)
	ns := suite.Namespace(t, f.Kube)
	chk, err := f.Checker(invariants.Config{
		Namespaces:  []string{ns},
		OrphanGrace: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	checkNow := func(t *testing.T, when string) {
		vs, err := chk.Check(ctx)
		if err != nil {
			t.Fatalf("invariant check %s: %v", when, err)
		}
		// Orphans may be fine mid-flight; the rest never is.
		for _, v := range vs {
			if v.Kind != invariants.KindOrphanWEP {
				t.Errorf("%s: %s", when, v)
			}
		}
	}

	t.Run("CallsThroughEveryReplica", func(t *testing.T) {
		suite.CreateDeployment(ctx, t, f, ns, "web", 40)
		suite.IPs(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 40))
		var totalForwarded float64
		for _, r := range f.Live() {
			req, fwd := cniCounts(ctx, t, r)
			totalForwarded += fwd
			t.Logf("replica %d: %v CNI requests in, %v forwarded to the owner", r.Index(), req, fwd)
			if req == 0 {
				t.Errorf("replica %d received no CNI call", r.Index())
			}
		}
		if totalForwarded == 0 {
			t.Error("no call was forwarded, though each entered a random replica and 3 replicas own the nodes")
		}
		checkNow(t, "after 40 pods")
	})

	t.Run("ReplicaAdded", func(t *testing.T) {
		r, err := f.AddReplica(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.RestartKubelet(); err != nil {
			t.Fatal(err)
		}
		own := suite.WaitSharded(ctx, t, f)
		t.Logf("4 replicas: %s", own)
		// The ring alone balances partitions: with 12 nodes in 271 the new
		// replica's quarter held none in ~3 % of member sets, until the
		// table was balanced by the published node counts.
		if own.Owned[r.Index()] == 0 {
			t.Errorf("the new replica %d serves no node of 12", r.Index())
		}
		st, err := r.ShardStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		even, found := st.Partitions/4, false
		for _, m := range st.Members {
			if m.Name == st.Self {
				found = true
				t.Logf("the new replica %d holds %d of %d partitions (%d nodes)", r.Index(), m.HeldPartitions, st.Partitions, m.Nodes)
				if m.HeldPartitions < even/2 {
					t.Errorf("the new replica %d holds %d of %d partitions, under half an even share (%d)", r.Index(),
						m.HeldPartitions, st.Partitions, even)
				}
			}
		}
		if !found {
			t.Errorf("the new replica %d does not list itself (%s) among the members", r.Index(), st.Self)
		}
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "web", 60)
		suite.IPs(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 60))
		checkNow(t, "after a replica joined")
	})

	t.Run("ReplicaRemoved", func(t *testing.T) {
		gone := f.Replica(1)
		start := time.Now()
		if err := gone.Remove(); err != nil {
			t.Fatal(err)
		}
		t.Logf("replica 1 left gracefully in %s", time.Since(start).Round(time.Millisecond))
		if err := f.RestartKubelet(); err != nil {
			t.Fatal(err)
		}
		t.Logf("3 replicas again: %s", suite.WaitSharded(ctx, t, f))
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "web", 30)
		suite.IPs(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 30))
		suite.WaitWEPs(ctx, t, f.CCE, ns, 30)
		checkNow(t, "after a replica left")
	})

	t.Run("RollingRestartUnderLoad", func(t *testing.T) {
		churn := &suite.Churn{
			Namespace: ns,
			Min:       20,
			Max:       60,
			Period:    300 * time.Millisecond,
		}
		before := f.Kubelet().Stats()
		suite.StartChurn(t, f, churn, 6)
		for _, r := range f.Live() {
			start := time.Now()
			if err := r.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			own := suite.WaitSharded(ctx, t, f)
			t.Logf("replica %d restarted and ring settled in %s: %s", r.Index(), time.Since(start).Round(time.Millisecond), own)
			checkNow(t, "during the rolling restart")
		}
		stats := churn.Stop()
		pods := suite.WaitSettled(ctx, t, f, ns)
		suite.IPs(t, pods)
		after := f.Kubelet().Stats()
		t.Logf("rolling restart under churn: %s; kubelet-sim %d allocations, %d failed (retried), allocate p99 %s",
			stats, after.Allocations-before.Allocations, after.AllocationErrors-before.AllocationErrors, after.AllocateLatency.P99)
		if stats.Created == 0 || stats.Deleted == 0 {
			t.Errorf("the churn did nothing: %s", stats)
		}
	})

	o := f.Options()
	end, err := f.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 30 * time.Second,
		Pool: &invariants.PoolBounds{
			Min: o.IdleMin,
			Max: o.IdleMax,
		}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if vs, err := end.WaitClean(wctx, 2*time.Second); err != nil {
		t.Fatalf("invariants at the end: %v\n%s", err, vs)
	}
	st, err := f.SimStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bce-sim: %d calls, %d throttled, busiest second %d calls", st.All.Calls, st.All.Throttled, st.All.MaxPerSecond())
}
