//go:build integration

package chaos_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
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

func (l *faultLog) count(kind string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[kind]
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

// Chaos-profile settings the faults depend on.
const (
	// maxInjectedLag bounds bce-sim's replica lag (ReplicaLagMs); the
	// replicas' --cloud-read-lag must not be shorter.
	maxInjectedLag = 3 * time.Second
	cloudReadLag   = 5 * time.Second
	// gcPeriod is short so that GC passes run while a replica drains.
	gcPeriod = 2 * time.Second
	// fixedReplicas is the size of the fixed-IP StatefulSet.
	fixedReplicas = 4
)

// The fault kinds aimed at the hand-over paths; every run, the short one
// too, injects each at least once.
var newKinds = []string{"lag-handover", "5xx-storm", "sts-move", "gc-drain", "psts-move"}

func TestChaos(t *testing.T) {
	if !env.Local() {
		t.Fatal("the chaos suite kills and pauses processes: run it locally (make e2e-chaos), not against kind")
	}
	duration := envDuration(t, "E2E_CHAOS_DURATION", 45*time.Second)
	seed := envSeed(t)
	t.Logf("chaos: seed %d (E2E_CHAOS_SEED), duration %s (E2E_CHAOS_DURATION)", seed, duration)
	rng := rand.New(rand.NewPCG(seed, seed+7))
	if maxInjectedLag > cloudReadLag {
		t.Fatalf("bce-sim lag up to %s needs --cloud-read-lag >= that, have %s", maxInjectedLag, cloudReadLag)
	}

	ctx, cancel := context.WithTimeout(context.Background(), duration+10*time.Minute)
	defer cancel()
	// NetNS: every replica in its own network namespace, so one can be cut
	// off from its peers.
	// E2E_CHAOS_DIR keeps the logs (replicas, bce-sim, kubelet-sim with
	// every CNI ADD and DEL) after the test; E2E_CHAOS_LOG_LEVEL=debug
	// makes the replicas log every CNI call they serve.
	f := env.Fleet(t, fleet.Options{Name: "chaos", Replicas: 3, Nodes: 8, NetNS: true, KubeletDebug: true,
		Dir: os.Getenv("E2E_CHAOS_DIR"), LogLevel: os.Getenv("E2E_CHAOS_LOG_LEVEL"),
		ReplicaArgs: []string{"--gc-period", gcPeriod.String(), "--cloud-read-lag", cloudReadLag.String()}})
	// I5 is counted at bce-sim in HTTP requests, throttled and 5xx-answered
	// ones included, for every second from here on (the nodes are
	// registered: from now on only the replicas call the BCE API). bce-sim
	// keeps 600 seconds of counters: they are read well within that.
	chaosStart := time.Now()
	suite.WaitSharded(ctx, t, f)
	ns := suite.Namespace(t, f.Kube)
	limits, err := f.SimRateLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o := f.Options()

	// The fixed-IP StatefulSet, placed by the test.
	fixed := newFixedSet(f, ns, fixedReplicas, seed)
	fixed.create(ctx, t)
	binderCtx, stopBinder := context.WithCancel(ctx)
	var binderWG sync.WaitGroup
	binderWG.Go(func() { fixed.run(binderCtx, t) })
	defer func() { stopBinder(); binderWG.Wait() }()
	suite.WaitPods(ctx, t, f.Kube, ns, fixed.selector(), fixedReplicas)
	// The PSTS workloads: a Fixed StatefulSet and custom-reuse pods placed
	// by the test too, and Elastic pods churned below.
	pw := startPSTS(ctx, t, f, ns, seed)
	binderWG.Go(func() { pw.fixed.run(binderCtx, t) })
	binderWG.Go(func() { pw.reuse.run(binderCtx, t) })
	suite.WaitPods(ctx, t, f.Kube, ns, pw.fixed.selector(), pstsFixedReplicas)
	suite.WaitPods(ctx, t, f.Kube, ns, pw.reuse.selector(), pstsReusePods)

	budget := int64(math.Ceil(o.BCERate)) + int64(o.BCEBurst)
	calls := &invariants.CallLog{}
	readCalls := func(ctx context.Context) error {
		st, err := f.SimStats(ctx)
		if err == nil {
			calls.Add(time.Now(), st.All.PerSecond)
		}
		return err
	}

	// The checker runs throughout, lagging reads included: it reads
	// bce-sim's true world (WorldView), never a lagged API read. Orphans
	// get a long grace (releases are retried through faults), and so do
	// ghosts (a fixed IP between its old and its new node), and so do
	// exclusive-subnet addresses without their claim (I7: a release in
	// flight, an ADD cut off after its cloud add whose claim the leader's
	// orphan GC frees before the node's GC removes the address); every
	// other finding is a violation.
	chk, err := f.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 90 * time.Second,
		WEPAddresses: true, GhostGrace: 60 * time.Second, Claims: true, ClaimGrace: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var (
		vmu        sync.Mutex
		violations invariants.Violations
		checks     int
		checkErrs  int
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
			vs, err := chk.Check(checkCtx)
			vmu.Lock()
			checks++
			if err != nil {
				checkErrs++ // e.g. kube-apiserver restarting
			}
			for _, v := range vs {
				t.Errorf("violation during chaos at %s: %s", time.Now().UTC().Format("15:04:05.000"), v)
				explain(checkCtx, t, f, v)
				violations = append(violations, v)
			}
			vmu.Unlock()
		}
	})
	checkWG.Go(func() {
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-time.After(20 * time.Second):
			}
			_ = readCalls(checkCtx)
		}
	})

	churn := &suite.Churn{
		Namespace: ns,
		Min:       30,
		Max:       90,
		Period:    250 * time.Millisecond,
	}
	suite.StartChurn(t, f, churn, seed)
	suite.StartChurn(t, f, pw.elastic, seed+3)

	var faults faultLog
	forceDeleted := 0
	// The result is printed however the run ends, a fatal fault included.
	var (
		settleStart time.Time
		pods        []corev1.Pod
		final       invariants.Violations
		i5          invariants.Violations
		i5Done      bool
	)
	defer func() {
		stopChecks()
		checkWG.Wait()
		stats := churn.Stop()
		pw.elastic.Stop()
		ks := f.Kubelet().Stats()
		st, _ := f.SimStats(context.Background())
		if !i5Done {
			_ = readCalls(context.Background())
			i5 = calls.Budget(chaosStart, time.Now(), budget)
		}
		busiestAt, busiest := calls.Busiest(chaosStart, time.Now())
		secs, inRun := calls.Seconds(chaosStart, time.Now())
		vmu.Lock()
		defer vmu.Unlock()
		byKind := map[invariants.Kind]int{}
		for _, vs := range []invariants.Violations{violations, final, i5} {
			for k, n := range vs.Kinds() {
				byKind[k] += n
			}
		}
		gcReleased := 0
		for _, r := range f.Replicas() {
			if data, err := os.ReadFile(r.LogPath()); err == nil {
				gcReleased += strings.Count(string(data), "gc: released")
			}
		}
		t.Logf("CHAOS RESULT seed=%d duration=%s: pods churned: %s, %d force-deleted (gc-drain), %s; %s; GC released %d IPs; "+
			"%d pods Running at the end; "+
			"injected %s; checks during chaos: %d (%d could not read); violations during chaos: %d, at the end: %d, I5: %d (by kind: %v); "+
			"settled: %v after %s; I5 at bce-sim: %d calls in %d s, busiest second %d calls (at %s), budget rate+burst %d; "+
			"kubelet-sim: %d allocations, %d failed and retried, allocate p50 %s p99 %s; bce-sim: %d calls, %d throttled",
			seed, duration, stats, forceDeleted, fixed, pw, gcReleased, len(pods), faults.String(), checks, checkErrs,
			len(violations), len(final), len(i5), byKind,
			!t.Failed() && !settleStart.IsZero(), since(settleStart), inRun, secs, busiest,
			time.Unix(busiestAt, 0).UTC().Format(time.TimeOnly), budget,
			ks.Allocations, ks.AllocationErrors, ks.AllocateLatency.P50, ks.AllocateLatency.P99, st.All.Calls, st.All.Throttled)
	}()
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
	kinds := []string{"kill", "kill", "pause", "bce-sim", "429", "apiserver", "partition",
		"lag-handover", "5xx-storm", "sts-move", "gc-drain", "psts-move", "quiet"}
	end := time.Now().Add(duration)
	lastAPIRestart := time.Now()
	next := func() (string, bool) {
		if time.Now().Before(end) {
			return kinds[rng.IntN(len(kinds))], true
		}
		// Time is up: whatever new kind did not come up yet, in order.
		for _, k := range newKinds {
			if faults.count(k) == 0 {
				return k, true
			}
		}
		return "", false
	}
	for ctx.Err() == nil {
		kind, ok := next()
		if !ok {
			break
		}
		// Choices that depend on the cluster's state (which pods run,
		// which nodes a replica holds) draw from their own source, so
		// that the schedule stays the seed's whatever they find.
		sub := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		switch kind {
		case "kill":
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
		case "pause":
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
		case "bce-sim":
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
				fl.ReplicaLagMs = 1000 + rng.IntN(int(maxInjectedLag/time.Millisecond)-1000)
				what = fmt.Sprintf("replica lag %dms", fl.ReplicaLagMs)
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
		case "429":
			d := hold(3*time.Second, 10*time.Second)
			low := map[bcesim.Op]bcesim.RateLimit{}
			for _, op := range []bcesim.Op{bcesim.OpBatchAddPrivateIP, bcesim.OpBatchDeletePrivateIP, bcesim.OpCreateENI,
				bcesim.OpAttachENI, bcesim.OpListENIs} {
				low[op] = bcesim.RateLimit{
					QPS:   0.5,
					Burst: 1,
				}
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
		case "apiserver":
			if time.Since(lastAPIRestart) < 20*time.Second {
				sleep(hold(500*time.Millisecond, 3*time.Second)) // a quiet spell instead
				break
			}
			down := hold(500*time.Millisecond, 3*time.Second)
			faults.add(t, "apiserver", fmt.Sprintf("restart, down %s", down))
			if err := f.RestartAPIServer(ctx, down); err != nil {
				t.Fatal(err)
			}
			lastAPIRestart = time.Now()
		case "partition":
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
		case "lag-handover":
			// bce-sim's reads lag while a replica's nodes go to the others
			// and come back to it: every taker and the returning replica
			// read a cloud older than their own writes.
			lag := time.Duration(1000+rng.IntN(int(maxInjectedLag/time.Millisecond)-1000)) * time.Millisecond
			r := pick()
			how := []string{"SIGKILL", "graceful leave", "partition"}[rng.IntN(3)]
			away := hold(2*time.Second, 10*time.Second)
			faults.add(t, "lag-handover", fmt.Sprintf("replica lag %s while replica %d hands over (%s, away %s) and back", lag,
				r.Index(), how, away))
			if err := f.SetFaults(ctx, bcesim.Faults{ReplicaLagMs: int(lag / time.Millisecond)}); err != nil {
				t.Fatal(err)
			}
			sleep(lag / 2)
			switch how {
			case "SIGKILL":
				if err := r.Kill(); err != nil {
					t.Fatal(err)
				}
			case "graceful leave":
				if err := r.Terminate(); err != nil {
					t.Error(err)
				}
			case "partition":
				if err := f.Partition(r); err != nil {
					t.Fatal(err)
				}
			}
			sleep(away)
			if how == "partition" {
				if err := f.Heal(r); err != nil {
					t.Fatal(err)
				}
			} else if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			sleep(lag + time.Second) // the hand-back under lag too
			if err := f.SetFaults(ctx, bcesim.Faults{}); err != nil {
				t.Fatal(err)
			}
		case "5xx-storm":
			rate := 0.5 + 0.45*rng.Float64()
			d := hold(2*time.Second, 6*time.Second)
			m := map[bcesim.Op]float64{}
			for _, op := range bcesim.AllOps {
				if op.Mutating() || op == bcesim.OpListENIs || op == bcesim.OpListSubnets {
					m[op] = rate
				}
			}
			faults.add(t, "5xx-storm", fmt.Sprintf("500 on %.0f%% of mutations and lists for %s", 100*rate, d))
			if err := f.SetFaults(ctx, bcesim.Faults{ErrorRate: m}); err != nil {
				t.Fatal(err)
			}
			sleep(d)
			if err := f.SetFaults(ctx, bcesim.Faults{}); err != nil {
				t.Fatal(err)
			}
		case "sts-move":
			n := 1 + rng.IntN(2)
			d := hold(2*time.Second, 6*time.Second)
			names, err := fixed.roll(ctx, sub, n)
			if err != nil || len(names) == 0 {
				t.Logf("chaos: sts-move: no fixed-IP pod deleted (%v)", err) // kube-apiserver restarting, or none Running
				sleep(time.Second)
				break
			}
			faults.add(t, "sts-move",
				fmt.Sprintf("fixed-IP pods %v deleted, to come back on another replica's node; next fault in %s", names, d))
			sleep(d)
		case "psts-move":
			d := hold(2*time.Second, 6*time.Second)
			names, err := pw.roll(ctx, sub)
			if err != nil || len(names) == 0 {
				t.Logf("chaos: psts-move: no PSTS pod deleted (%v)", err)
				sleep(time.Second)
				break
			}
			faults.add(t, "psts-move",
				fmt.Sprintf("PSTS Fixed and reuse pods %v deleted, to come back on another replica's node with their addresses; next fault in %s",
					names, d))
			sleep(d)
		case "gc-drain":
			// Work for GC on the nodes of a replica that then leaves
			// gracefully: churn pods deleted at once (no graceful DEL
			// first, so GC and the kubelet's DEL race for their weps) and
			// the fixed-IP StatefulSet scaled down (its top pod's
			// reservation becomes garbage). GC runs every gcPeriod, on the
			// leaving replica and on the takers.
			r := pick()
			away := hold(time.Second, 5*time.Second)
			// The replica that leaves is one that holds nodes (the drawn
			// one unless it holds none, e.g. just back from a fault).
			held := map[int][]string{}
			for _, n := range f.Nodes() {
				if i, err := f.NodeOwner(ctx, n); err == nil {
					held[i] = append(held[i], n)
				}
			}
			if len(held[r.Index()]) == 0 {
				var holders []*fleet.Replica
				for _, x := range replicas {
					if len(held[x.Index()]) > 0 {
						holders = append(holders, x)
					}
				}
				if len(holders) > 0 {
					r = holders[sub.IntN(len(holders))]
				}
			}
			mine := map[string]bool{}
			for _, n := range held[r.Index()] {
				mine[n] = true
			}
			var victims []string
			if list, err := f.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: suite.ChurnLabel}); err == nil {
				var cands []string
				for _, p := range list.Items {
					if mine[p.Spec.NodeName] && suite.Running(&p) {
						cands = append(cands, p.Name)
					}
				}
				sort.Strings(cands)
				for range 3 {
					if len(cands) == 0 {
						break
					}
					k := sub.IntN(len(cands))
					victims = append(victims, cands[k])
					cands = append(cands[:k], cands[k+1:]...)
				}
			}
			for _, name := range victims {
				if err := f.Kube.CoreV1().Pods(ns).Delete(ctx, name,
					metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err == nil {
					forceDeleted++
				}
			}
			if err := fixed.scale(ctx, fixedReplicas-1); err != nil {
				t.Logf("chaos: gc-drain: scale down: %v", err)
			}
			if err := pw.fixed.scale(ctx, pstsFixedReplicas-1); err != nil {
				t.Logf("chaos: gc-drain: scale the PSTS Fixed set down: %v", err)
			}
			faults.add(t, "gc-drain",
				fmt.Sprintf("replica %d (holds %d nodes) leaves gracefully during GC: %d churn pods on its nodes force-deleted %v, "+
					"fixed-IP and PSTS Fixed sets scaled to %d and %d; back after %s",
					r.Index(), len(mine), len(victims), victims, fixedReplicas-1, pstsFixedReplicas-1, away))
			sleep(gcPeriod / 2)
			if err := r.Terminate(); err != nil {
				t.Error(err)
			}
			sleep(away)
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := fixed.scale(ctx, fixedReplicas); err != nil {
				t.Logf("chaos: gc-drain: scale up: %v", err)
			}
			if err := pw.fixed.scale(ctx, pstsFixedReplicas); err != nil {
				t.Logf("chaos: gc-drain: scale the PSTS Fixed set up: %v", err)
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
	if err := fixed.scale(ctx, fixedReplicas); err != nil {
		t.Fatal(err)
	}
	if err := pw.fixed.scale(ctx, pstsFixedReplicas); err != nil {
		t.Fatal(err)
	}
	settleStart = time.Now()
	// Every node must have an owner again within a few lease periods; three
	// minutes is generous on a loaded machine.
	sctx, scancel := context.WithTimeout(ctx, 3*time.Minute)
	defer scancel()
	suite.WaitSharded(sctx, t, f)
	stats := churn.Stop()
	pstsStats := pw.elastic.Stop()
	pods = suite.WaitSettled(sctx, t, f, ns)
	suite.IPs(t, pods)
	fixedPods := suite.WaitPods(sctx, t, f.Kube, ns, fixed.selector(), fixedReplicas)
	elasticPods := suite.WaitSettledSelector(sctx, t, f, ns, pw.elastic.Selector())
	pfixedPods := suite.WaitPods(sctx, t, f.Kube, ns, pw.fixed.selector(), pstsFixedReplicas)
	reusePods := suite.WaitPods(sctx, t, f.Kube, ns, pw.reuse.selector(), pstsReusePods)
	suite.IPs(t, slices.Concat(pods, fixedPods, elasticPods, pfixedPods, reusePods))
	pw.checkRanges(t, pfixedPods, reusePods, elasticPods)
	stopBinder()
	binderWG.Wait()
	stopChecks()
	checkWG.Wait()
	// At the end, strictly: every wep's address on its node's ENI in the
	// cloud, no two weps on one address, and each owner's datastore assigns
	// exactly the addresses weps name on its nodes.
	endChk, err := f.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 30 * time.Second,
		Pool: &invariants.PoolBounds{
			Min: o.IdleMin,
			Max: o.IdleMax,
		}, WEPAddresses: true, Pools: f.NodePool, Claims: true, ClaimGrace: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer wcancel()
	final, err = endChk.WaitClean(wctx, 2*time.Second)
	if err != nil {
		t.Errorf("invariants after chaos did not settle: %v\n%s", err, final)
		for _, v := range final {
			explain(ctx, t, f, v)
		}
	}
	logPools(ctx, t, f)
	if err := f.SimCheck(ctx); err != nil {
		t.Errorf("bce-sim world check: %v", err)
	}
	if err := readCalls(ctx); err != nil {
		t.Errorf("I5: read bce-sim's call counters: %v", err)
	}
	i5, i5Done = calls.Budget(chaosStart, time.Now(), budget), true
	for _, v := range i5 {
		t.Errorf("I5: %s", v)
	}
	for _, k := range newKinds {
		if faults.count(k) == 0 {
			t.Errorf("the profile injected no %s fault", k)
		}
	}
	if stats.Created == 0 || stats.Deleted == 0 || len(faults.counts) == 0 {
		t.Errorf("chaos did nothing: %s, %s", stats, faults.String())
	}
	if pstsStats.Created == 0 || pstsStats.Deleted == 0 {
		t.Errorf("the PSTS Elastic churn did nothing: %s", pstsStats)
	}
}

// logPools prints, per node, what its owner's datastore holds next to the
// WorkloadEndpoints naming the node: the evidence behind check (f).
func logPools(ctx context.Context, t *testing.T, f *fleet.Fleet) {
	weps, err := f.CCE.CceV1alpha1().WorkloadEndpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("pools: %v", err)
		return
	}
	named := map[string]int{}
	for _, w := range weps.Items {
		named[w.Spec.Node]++
	}
	nodes := f.Nodes()
	sort.Strings(nodes)
	var parts []string
	for _, n := range nodes {
		owner, _ := f.NodeOwner(ctx, n)
		pc, err := f.NodePool(ctx, n)
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", n, err))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s@r%d assigned %d/weps %d idle %d held %d", n, owner, pc.Assigned, named[n], pc.Idle, pc.Held))
	}
	t.Logf("pools at the end (owner's datastore vs WorkloadEndpoints): %s", strings.Join(parts, "; "))
}

// explain logs what the cluster and the cloud say now about the objects a
// violation names: each pod (node, phase, IP, sandbox, deletion), its
// WorkloadEndpoint, its node's owner, and the ENI holding the address.
func explain(ctx context.Context, t *testing.T, f *fleet.Fleet, v invariants.Violation) {
	names := append([]string(nil), v.Pods...)
	if v.WEP != "" {
		names = append(names, strings.Split(v.WEP, ",")...)
	}
	seen := map[string]bool{}
	for _, k := range names {
		if seen[k] {
			continue
		}
		seen[k] = true
		ns, name, _ := strings.Cut(k, "/")
		var line strings.Builder
		fmt.Fprintf(&line, "evidence %s:", k)
		if p, err := f.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			fmt.Fprintf(&line, " pod: %v;", err)
		} else {
			sandbox := ""
			if len(p.Status.ContainerStatuses) > 0 {
				sandbox = p.Status.ContainerStatuses[0].ContainerID
			}
			owner, _ := f.NodeOwner(ctx, p.Spec.NodeName)
			fmt.Fprintf(&line, " pod uid=%s created=%s node=%s (owner r%d) phase=%s ip=%s sandbox=%s deleting=%v;",
				p.UID, p.CreationTimestamp.UTC().Format("15:04:05"), p.Spec.NodeName, owner, p.Status.Phase, p.Status.PodIP, sandbox,
				p.DeletionTimestamp != nil)
		}
		if w, err := f.CCE.CceV1alpha1().WorkloadEndpoints(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			fmt.Fprintf(&line, " wep: %v", err)
		} else {
			fmt.Fprintf(&line, " wep ip=%s node=%s eni=%s container=%s type=%s subnet=%s psts=%s phase=%s created=%s", w.Spec.IP,
				w.Spec.Node, w.Spec.ENIID, w.Spec.ContainerID, w.Spec.Type, w.Spec.SubnetID, w.Spec.SubnetTopologyReference,
				w.Spec.Phase, w.CreationTimestamp.UTC().Format("15:04:05"))
		}
		t.Log(line.String())
	}
	if v.IP == "" {
		return
	}
	if a, err := netip.ParseAddr(v.IP); err == nil {
		if c, err := f.CCE.CceV1alpha1().IPClaims().Get(ctx, cce.ClaimName(a), metav1.GetOptions{}); err != nil {
			t.Logf("evidence %s: IPClaim: %v", v.IP, err)
		} else {
			t.Logf("evidence %s: IPClaim subnet=%s holder=%+v node=%s eni=%s reserved=%v released=%v notBefore=%v", v.IP,
				c.Spec.SubnetID, c.Spec.Holder, c.Spec.Node, c.Spec.ENIID, c.Spec.ReservedAt, c.Spec.ReleasedAt, c.Spec.NotBefore)
		}
	}
	world, err := f.SimWorld(ctx)
	if err != nil {
		t.Logf("evidence %s: bce-sim world: %v", v.IP, err)
		return
	}
	var where []string
	for _, e := range world.ENIs {
		for _, ip := range e.PrivateIPSet {
			if ip.PrivateIPAddress == v.IP {
				where = append(where, fmt.Sprintf("%s (%s, instance %s, %s)", e.ENIID, e.Name, e.InstanceID, e.Status))
			}
		}
	}
	t.Logf("evidence %s: in bce-sim now on %v", v.IP, where)
}

func since(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return time.Since(t).Round(time.Second)
}
