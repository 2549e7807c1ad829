//go:build integration

package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
)

var env *suite.Env

// The fleet starts its own control plane: only then can kube-apiserver be
// restarted.
func TestMain(m *testing.M) { os.Exit(suite.Main(m, &env, true)) }

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

func envSeed(t *testing.T) uint64 {
	v := os.Getenv("E2E_CHAOS_SEED")
	if v == "" {
		return 1
	}
	s, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("E2E_CHAOS_SEED=%q: %v", v, err)
	}
	return s
}

// faultLog counts injected faults by kind.
type faultLog struct {
	mu     sync.Mutex
	counts map[string]int
}

func (l *faultLog) add(t *testing.T, kind, detail string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.counts[kind]++
	t.Logf("chaos: %s %s", kind, detail)
}

func (l *faultLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	kinds := make([]string, 0, len(l.counts))
	total := 0
	for k, n := range l.counts {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d faults (%s)", total, strings.Join(kinds, " "))
}

func TestChaos(t *testing.T) {
	if !env.Local() {
		t.Fatal("the chaos suite kills and pauses processes: run it locally (make e2e-chaos), not against kind")
	}
	duration := envDuration(t, "E2E_CHAOS_DURATION", 45*time.Second)
	seed := envSeed(t)
	t.Logf("chaos: seed %d (E2E_CHAOS_SEED), duration %s (E2E_CHAOS_DURATION)", seed, duration)
	rng := rand.New(rand.NewPCG(seed, seed+7))

	ctx, cancel := context.WithTimeout(context.Background(), duration+10*time.Minute)
	defer cancel()
	// NetNS: every replica in its own network namespace, so one can be cut
	// off from its peers.
	f := env.Fleet(t, fleet.Options{Name: "chaos", Replicas: 3, Nodes: 8, NetNS: true})
	if !f.Sharded() {
		t.Fatal("cce-ipam has no sharding flags; the chaos suite needs issue #5")
	}
	suite.WaitSharded(ctx, t, f)
	ns := suite.Namespace(t, f.Kube)
	limits, err := f.SimRateLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The checker runs throughout. Orphans get a long grace (releases are
	// retried through faults); every other finding is a violation. It
	// pauses while bce-sim serves lagging reads, which would show the
	// checker itself a stale cloud.
	chk, err := f.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var (
		vmu        sync.Mutex
		violations invariants.Violations
		checks     int
		checkErrs  int
		lagUntil   time.Time
	)
	checkCtx, stopChecks := context.WithCancel(ctx)
	var checkWG sync.WaitGroup
	checkWG.Go(func() {
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-time.After(3 * time.Second):
			}
			vmu.Lock()
			lagging := time.Now().Before(lagUntil)
			vmu.Unlock()
			if lagging {
				continue
			}
			vs, err := chk.Check(checkCtx)
			vmu.Lock()
			checks++
			if err != nil {
				checkErrs++ // e.g. kube-apiserver restarting
			}
			for _, v := range vs {
				t.Errorf("violation during chaos: %s", v)
				violations = append(violations, v)
			}
			vmu.Unlock()
		}
	})

	churn := &suite.Churn{Namespace: ns, Min: 30, Max: 90, Period: 250 * time.Millisecond}
	suite.StartChurn(t, f, churn, seed)

	var faults faultLog
	replicas := f.Live()
	pick := func() *fleet.Replica { return replicas[rng.IntN(len(replicas))] }
	hold := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	end := time.Now().Add(duration)
	lastAPIRestart := time.Now()
	for time.Now().Before(end) && ctx.Err() == nil {
		switch k := rng.IntN(8); {
		case k == 0 || k == 1:
			r := pick()
			down := hold(time.Second, 8*time.Second)
			faults.add(t, "kill", fmt.Sprintf("replica %d (SIGKILL), down %s", r.Index(), down))
			if err := r.Kill(); err != nil {
				t.Fatal(err)
			}
			sleep(down)
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
		case k == 2:
			r := pick()
			paused := hold(time.Second, 12*time.Second) // past the 6s lease sometimes
			faults.add(t, "pause", fmt.Sprintf("replica %d (SIGSTOP) for %s", r.Index(), paused))
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
			sleep(paused)
			if err := r.Cont(); err != nil {
				t.Fatal(err)
			}
		case k == 3:
			var fl bcesim.Faults
			var what string
			switch rng.IntN(3) {
			case 0:
				rate := 0.1 + 0.3*rng.Float64()
				fl.ErrorRate, what = map[bcesim.Op]float64{"*": rate}, fmt.Sprintf("5xx on %.0f%% of calls", 100*rate)
			case 1:
				ms := 200 + rng.IntN(1800)
				fl.LatencyMs, what = map[bcesim.Op]int{"*": ms}, fmt.Sprintf("%dms latency", ms)
			case 2:
				fl.ReplicaLagMs, what = 1000+rng.IntN(2000), "replica lag"
				vmu.Lock()
				lagUntil = time.Now().Add(time.Minute) // until cleared + lag
				vmu.Unlock()
			}
			d := hold(3*time.Second, 10*time.Second)
			faults.add(t, "bce-sim", fmt.Sprintf("%s for %s", what, d))
			if err := f.SetFaults(ctx, fl); err != nil {
				t.Fatal(err)
			}
			sleep(d)
			if err := f.SetFaults(ctx, bcesim.Faults{}); err != nil {
				t.Fatal(err)
			}
			vmu.Lock()
			if fl.ReplicaLagMs > 0 {
				lagUntil = time.Now().Add(time.Duration(fl.ReplicaLagMs)*time.Millisecond + 2*time.Second)
			}
			vmu.Unlock()
		case k == 4:
			d := hold(3*time.Second, 10*time.Second)
			low := map[bcesim.Op]bcesim.RateLimit{}
			for _, op := range []bcesim.Op{bcesim.OpBatchAddPrivateIP, bcesim.OpBatchDeletePrivateIP, bcesim.OpCreateENI,
				bcesim.OpAttachENI, bcesim.OpListENIs} {
				low[op] = bcesim.RateLimit{QPS: 0.5, Burst: 1}
			}
			faults.add(t, "429", fmt.Sprintf("mutations and lists at 0.5/s for %s", d))
			if err := f.SetSimRateLimits(ctx, low); err != nil {
				t.Fatal(err)
			}
			sleep(d)
			restore := map[bcesim.Op]bcesim.RateLimit{}
			for op := range low {
				restore[op] = limits[op] // zero (no limit) when there was none
			}
			if err := f.SetSimRateLimits(ctx, restore); err != nil {
				t.Fatal(err)
			}
		case k == 5 && time.Since(lastAPIRestart) > 20*time.Second:
			down := hold(500*time.Millisecond, 3*time.Second)
			faults.add(t, "apiserver", fmt.Sprintf("restart, down %s", down))
			if err := f.RestartAPIServer(ctx, down); err != nil {
				t.Fatal(err)
			}
			lastAPIRestart = time.Now()
		case k == 6:
			r := pick()
			d := hold(2*time.Second, 15*time.Second) // past the lease duration sometimes
			faults.add(t, "partition", fmt.Sprintf("replica %d cut off from its peers for %s", r.Index(), d))
			if err := f.Partition(r); err != nil {
				t.Fatal(err)
			}
			sleep(d)
			if err := f.Heal(r); err != nil {
				t.Fatal(err)
			}
		default:
			sleep(hold(500*time.Millisecond, 3*time.Second)) // a quiet spell
		}
	}

	// Heal and let it settle.
	for _, r := range replicas {
		if f.Partitioned(r) {
			if err := f.Heal(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.SetFaults(ctx, bcesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	for _, r := range replicas {
		if !r.Running() {
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The result is printed however the settling ends.
	settleStart := time.Now()
	var (
		pods  []corev1.Pod
		final invariants.Violations
	)
	defer func() {
		stopChecks()
		checkWG.Wait()
		stats := churn.Stop()
		ks := f.Kubelet().Stats()
		st, _ := f.SimStats(context.Background())
		vmu.Lock()
		defer vmu.Unlock()
		t.Logf("CHAOS RESULT seed=%d duration=%s: pods churned: %s; %d pods Running at the end; injected %s; "+
			"checks during chaos: %d (%d could not read); violations during chaos: %d, at the end: %d; settled: %v after %s; "+
			"kubelet-sim: %d allocations, %d failed and retried, allocate p50 %s p99 %s; bce-sim: %d calls, %d throttled",
			seed, duration, stats, len(pods), faults.String(), checks, checkErrs, len(violations), len(final),
			!t.Failed(), time.Since(settleStart).Round(time.Second), ks.Allocations, ks.AllocationErrors, ks.AllocateLatency.P50,
			ks.AllocateLatency.P99, st.All.Calls, st.All.Throttled)
	}()
	// Every node must have an owner again within a few lease periods; three
	// minutes is generous on a loaded machine.
	sctx, scancel := context.WithTimeout(ctx, 3*time.Minute)
	defer scancel()
	suite.WaitSharded(sctx, t, f)
	stats := churn.Stop()
	pods = suite.WaitSettled(sctx, t, f, ns)
	suite.IPs(t, pods)
	stopChecks()
	checkWG.Wait()
	o := f.Options()
	endChk, err := f.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 30 * time.Second,
		Pool: &invariants.PoolBounds{Min: o.IdleMin, Max: o.IdleMax}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer wcancel()
	final, err = endChk.WaitClean(wctx, 2*time.Second)
	if err != nil {
		t.Errorf("invariants after chaos did not settle: %v\n%s", err, final)
	}
	if err := f.SimCheck(ctx); err != nil {
		t.Errorf("bce-sim world check: %v", err)
	}
	if stats.Created == 0 || stats.Deleted == 0 || len(faults.counts) == 0 {
		t.Errorf("chaos did nothing: %s, %s", stats, faults.String())
	}
}
