package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cce-ipam/sharded/bench/report"
	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/shard"
)

// Item 10, bursts (issue #25 item 2): pods bound at once to one node, as a
// Deployment scaled up or a Job fanning out lands them, and the time until
// every one has its IP.
//
//	a. BurstSmall pods on a fresh node whose pool sits at its minimum
//	   (IdleMin idle): the rest must come from the cloud in batches.
//	b. BurstLarge pods on a fresh node whose attached ENIs are full: the
//	   addresses need at least one new ENI (create, attach, then batches).
//
// Every ADD of a burst is sent at once to the node's owner; a failed ADD is
// retried after 200 ms (a kubelet retries a failed sandbox after seconds,
// so this is the pod's best case). A pod's time is from the burst's start
// to its successful ADD. The floors are computed from the cloud limits and
// the bare wep creates measured in the same run (see burstFloor).

// burstRun is one burst's measurements.
type burstRun struct {
	name    string
	pods    int
	idleAt0 int             // idle addresses on the node when the burst began
	enisAt0 int             // addresses the node's ENIs could still take (free slots)
	took    []time.Duration // per pod, from the burst's start to its IP
	all     time.Duration   // until the last pod had its IP
	failed  int             // ADD attempts that failed and were retried
	calls   map[bcesim.Op]int64
	share   float64 // the owner's BCE rate share (calls/s) and burst
	shareB  int64
	// opShare is the owner's fraction of every per-operation limit (1/N of
	// the replicas, shard.budget.setOpShare) and opLimits the cluster-wide
	// table (the replicas' default, the upstream's: cloud.DefaultOpLimits).
	opShare    float64
	opLimits   map[string]cloud.OpLimit
	apiFloor   time.Duration // pods bare wep creates, all at once
	floor      time.Duration
	floorNote  string
	target     time.Duration
	targetText string
}

// burstResult is item 10.
type burstResult struct {
	runs []burstRun
}

// runBurst is item 10: two fresh nodes, one burst each.
func (e *env) runBurst(ctx context.Context) (*burstResult, error) {
	p := e.cfg.Profile
	res := &burstResult{}
	nodes, err := e.addNodes(ctx, 2)
	if err != nil {
		return nil, err
	}
	if _, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); err != nil {
		return nil, err
	}
	small, large := nodes[0], nodes[1]
	if _, err := e.waitPool(ctx, small, p.IdleMin); err != nil {
		return nil, err
	}

	// b's node: fill its first ENI to the last slot, so that the burst's
	// addresses need ENIs the node does not have yet. The product's pool
	// then keeps working toward IdleMin idle (a new ENI, ahead of need):
	// that is part of what the burst measures.
	free, err := e.waitPool(ctx, large, p.IdleMin)
	if err != nil {
		return nil, err
	}
	// Every slot of its ENIs, idle ones included, goes to a pod.
	fill, err := e.drv.createPods(ctx, "bf", []string{large}, free.idle+free.slots, 16)
	if err != nil {
		return nil, fmt.Errorf("create the filling pods: %w", err)
	}
	defer func() { _ = e.drv.deletePods(context.WithoutCancel(ctx), fill, 16) }()
	to, err := e.ownerTarget(ctx, e.running(), []string{small, large})
	if err != nil {
		return nil, err
	}
	fillCIDs, fillIPs := make([]string, len(fill)), make([]string, len(fill))
	defer func() { e.releaseAll(context.WithoutCancel(ctx), fill, fillCIDs, fillIPs, to) }()
	if err := parallel(ctx, len(fill), 8, func(ctx context.Context, i int) error {
		fillCIDs[i] = e.drv.containerID()
		var err error
		fillIPs[i], err = e.drv.allocateRetry(ctx, func() string { return to(fill[i]) }, fill[i], fillCIDs[i], time.Minute)
		return err
	}); err != nil {
		return nil, fmt.Errorf("fill node %s: %w", large, err)
	}

	for _, b := range []struct {
		name, node string
		pods       int
		fullENIs   bool
	}{{"a. pool at its minimum", small, p.BurstSmall, false}, {"b. first ENI full", large, p.BurstLarge, true}} {
		run, err := e.burstOnce(ctx, b.name, b.node, b.pods, b.fullENIs, to)
		res.runs = append(res.runs, run)
		if err != nil {
			return res, fmt.Errorf("burst %s: %w", b.name, err)
		}
	}
	return res, nil
}

// poolState is what the owner's datastore holds for a node: idle
// addresses, and the free slots of its attached ENIs (addresses it could
// still add without a new ENI).
type poolState struct{ idle, slots int }

// readPool reads node's pool from its owner (/shard/node: the datastore's
// NodeStats, ENIs with their capacity).
func (e *env) readPool(ctx context.Context, node string) (poolState, error) {
	ns, err := e.f.NodeStatus(ctx, node)
	if err != nil {
		return poolState{}, err
	}
	if !ns.Served || ns.Pool == nil {
		return poolState{}, fmt.Errorf("node %s: no pool from its owner (holder %q): %s", node, ns.Holder, ns.Error)
	}
	data, err := json.Marshal(ns.Pool)
	if err != nil {
		return poolState{}, err
	}
	var pool struct {
		Idle int
		ENIs []struct{ Capacity, Total int }
	}
	if err := json.Unmarshal(data, &pool); err != nil {
		return poolState{}, fmt.Errorf("node %s: pool: %w", node, err)
	}
	st := poolState{idle: pool.Idle}
	for _, en := range pool.ENIs {
		st.slots += max(0, en.Capacity-en.Total)
	}
	return st, nil
}

// waitPool waits until node's pool has at least idle idle addresses.
func (e *env) waitPool(ctx context.Context, node string, idle int) (poolState, error) {
	var st poolState
	err := retry(ctx, time.Minute, func() error {
		var err error
		if st, err = e.readPool(ctx, node); err != nil {
			return err
		}
		if st.idle < idle {
			return fmt.Errorf("node %s: %d idle, waiting for %d", node, st.idle, idle)
		}
		return nil
	})
	return st, err
}

// burstOnce binds n pods to node at once and times their ADDs.
func (e *env) burstOnce(ctx context.Context, name, node string, n int, onFullENIs bool, to func(pod) string) (burstRun, error) {
	run := burstRun{name: name, pods: n, calls: map[bcesim.Op]int64{}}
	sleep(ctx, 3*time.Second) // the pool worker at rest: what it holds is what the burst finds
	st, err := e.readPool(ctx, node)
	if err != nil {
		return run, err
	}
	run.idleAt0, run.enisAt0 = st.idle, st.slots
	if sh, err := e.ownerShare(ctx, node); err == nil {
		run.share, run.shareB = sh.Rate, sh.Burst
	}
	// The replicas run with the default table unless --replica-args
	// replaced it; then the floor counts the budget share only.
	if n := len(e.running()); n > 0 && !slices.ContainsFunc(e.cfg.ReplicaArgs, func(a string) bool {
		return strings.HasPrefix(a, "--bce-op-limits")
	}) {
		run.opShare, run.opLimits = 1/float64(n), cloud.DefaultOpLimits()
	}
	// The API part of the floor: n bare wep creates, all at once.
	_, elapsed, _, err := e.floorWave(ctx, n, n)
	if err != nil {
		return run, fmt.Errorf("floor: %w", err)
	}
	run.apiFloor = elapsed

	pods, err := e.drv.createPods(ctx, "bu", []string{node}, n, 16)
	if err != nil {
		return run, fmt.Errorf("create the burst's pods: %w", err)
	}
	defer func() { _ = e.drv.deletePods(context.WithoutCancel(ctx), pods, 16) }()
	before, err := e.f.SimStats(ctx)
	if err != nil {
		return run, err
	}
	var mu sync.Mutex
	cids, ips := make([]string, n), make([]string, n)
	defer func() { e.releaseAll(context.WithoutCancel(ctx), pods, cids, ips, to) }()
	start := time.Now()
	err = parallel(ctx, n, n, func(ctx context.Context, i int) error {
		cids[i] = e.drv.containerID()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ip, _, err := e.drv.allocate(ctx, to(pods[i]), pods[i], cids[i], 30*time.Second)
			mu.Lock()
			if err == nil {
				ips[i] = ip
				run.took = append(run.took, time.Since(start))
				mu.Unlock()
				return nil
			}
			run.failed++
			mu.Unlock()
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("allocate %s: %w", pods[i].name, err)
			}
			sleep(ctx, 200*time.Millisecond)
		}
	})
	run.all = time.Since(start)
	after, serr := e.f.SimStats(ctx)
	if serr == nil {
		for op, s := range after.Ops {
			if d := s.Calls - before.Ops[op].Calls; d > 0 {
				run.calls[op] = d
			}
		}
	}
	perENI := bcesim.MaxIPsPerENI(e.f.Options().InstanceMemoryGB) - 1 // the primary is no pod's
	run.floor, run.floorNote = burstFloor(run, benchBatchAddIPNum, perENI, e.f.Options().AttachDelay)
	// The targets: a burst on a pool at its minimum within 1.5× its
	// floor; one that needs ENIs within the attach time + 2 s.
	run.target, run.targetText = run.floor*3/2, "≤ 1.5× floor"
	if onFullENIs {
		run.target = e.f.Options().AttachDelay + 2*time.Second
		run.targetText = "≤ attach (" + e.f.Options().AttachDelay.String() + ") + 2 s"
	}
	e.log.Info("burst", "name", name, "pods", n, "all_s", run.all.Seconds(), "floor_s", run.floor.Seconds(),
		"idle_at_start", run.idleAt0, "free_slots", run.enisAt0, "failed_attempts", run.failed, "calls", fmt.Sprint(run.calls))
	return run, errors.Join(err, serr)
}

// releaseAll frees what pods were given (untimed), so that the next items
// find the nodes as a kubelet would leave them.
func (e *env) releaseAll(ctx context.Context, pods []pod, cids, ips []string, to func(pod) string) {
	_ = parallel(ctx, len(pods), 8, func(ctx context.Context, i int) error {
		if ips[i] == "" {
			return nil
		}
		return e.drv.release(ctx, func() string { return to(pods[i]) }, pods[i], cids[i], ips[i], time.Minute)
	})
}

// ownerShare is the BCE budget share of node's owner.
func (e *env) ownerShare(ctx context.Context, node string) (shard.Share, error) {
	idx, err := e.f.NodeOwner(ctx, node)
	if err != nil {
		return shard.Share{}, err
	}
	r := e.f.Replica(idx)
	if r == nil {
		return shard.Share{}, fmt.Errorf("no replica %d", idx)
	}
	st, err := status(ctx, r)
	return st.Budget, err
}

// burstFloor is what the cloud limits and the API server allow at best:
// the addresses the node lacks fill its ENIs' free slots in batches of
// batch, one BCE call each; those beyond the free slots come with new ENIs
// created holding them (CreateENI's privateIpSet), perENI secondary
// addresses each, a create and an attach call each and, once, attachDelay
// (attached side by side); the pods' weps cost the bare creates of the same
// burst, or of its last batch when calls wait. The calls wait for two
// buckets: the owner's share of the budget (all calls), and its share of
// each operation's own limit (the batches wait for BatchAddPrivateIP's:
// with 3 replicas, a third of the upstream's 5/s); the slower decides. The
// parts are added: the IPAM needs the address before it writes the wep, and
// a new ENI before its addresses.
func burstFloor(r burstRun, batch, perENI int, attachDelay time.Duration) (time.Duration, string) {
	need := max(0, r.pods-r.idleAt0)
	batches := int(math.Ceil(float64(min(need, r.enisAt0)) / float64(max(1, batch))))
	newENIs := 0
	if short := need - r.enisAt0; short > 0 {
		newENIs = int(math.Ceil(float64(short) / float64(max(1, perENI))))
	}
	calls := batches + 2*newENIs
	// wait is how long n calls take from a full bucket of rate and burst.
	wait := func(n int, rate float64, burst int64) time.Duration {
		if rate <= 0 {
			return 0
		}
		return time.Duration(max(0, float64(n)-float64(burst)) / rate * float64(time.Second))
	}
	cloudWait := wait(calls, r.share, r.shareB)
	bound := fmt.Sprintf("%d BCE calls at the owner's share of %s/s with a burst of %d: %s",
		calls, report.Num(r.share, 2), r.shareB, cloudWait.Round(time.Millisecond))
	for _, op := range []struct {
		name string
		n    int
	}{{"BatchAddPrivateIP", batches}, {"CreateENI", newENIs}, {"AttachENI", newENIs}} {
		l, ok := r.opLimits[op.name]
		if !ok || op.n == 0 || r.opShare <= 0 {
			continue
		}
		sh := l.Share(r.opShare)
		rate, burst := sh.Rate, sh.Burst
		if w := wait(op.n, rate, burst); w > cloudWait {
			cloudWait = w
			bound = fmt.Sprintf("%d %s calls at the owner's share of its limit, %s/s with a burst of %d: %s "+
				"(all %d BCE calls at the owner's budget share of %s/s: less)", op.n, op.name, report.Num(rate, 2), burst,
				w.Round(time.Millisecond), calls, report.Num(r.share, 2))
		}
	}
	if newENIs > 0 {
		cloudWait += attachDelay
	}
	// The weps: when no call waits, every pod's create runs at once (the
	// bare creates of the burst). When calls wait, the pods served before
	// write their weps meanwhile, and only the last batch's pods (at most
	// batch) write theirs after the wait: that share of the bare creates.
	api := r.apiFloor
	apiNote := "bare wep creates of the burst, all at once: " + r.apiFloor.Round(time.Millisecond).String()
	if cloudWait > 0 && r.pods > batch {
		api = time.Duration(float64(r.apiFloor) * float64(batch) / float64(r.pods))
		apiNote = fmt.Sprintf("then the last batch's %d wep creates: %s (%d/%d of the burst's bare creates all at once, %s)",
			batch, api.Round(time.Millisecond), batch, r.pods, r.apiFloor.Round(time.Millisecond))
	}
	note := fmt.Sprintf("%d addresses to add (%d pods, %d idle, %d free ENI slots): %d batch call(s) of %d, %d new ENI(s) "+
		"created holding the rest (create + attach, %s attach); %s; %s",
		need, r.pods, r.idleAt0, r.enisAt0, batches, batch, newENIs, attachDelay, bound, apiNote)
	return cloudWait + api, note
}

// quantile of a burst's per-pod times, ms.
func (r burstRun) quantile(q float64) float64 { return report.Quantile(report.Millis(r.took), q) }
