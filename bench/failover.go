package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cce-ipam/sharded/e2e/fleet"
)

// failoverRepeat is one SIGKILL.
type failoverRepeat struct {
	victim      int
	victimNodes int
	killedAt    time.Time
	// recovered is, per victim node, how long after the kill its first
	// allocation started after the kill completed.
	recovered []time.Duration
	// unrecovered counts victim nodes with no allocation before the timeout.
	unrecovered int
	// detectFirst / detectLast: when the first / last survivor counted a
	// memberlist "fail" event (0: not seen within the timeout).
	detectFirst, detectLast time.Duration
}

func (r failoverRepeat) worst() time.Duration {
	var w time.Duration
	for _, d := range r.recovered {
		w = max(w, d)
	}
	return w
}

// failoverResult is item 2.
type failoverResult struct {
	repeats       []failoverRepeat
	start, end    time.Time
	churnAllocs   int64
	churnLost     int64
	churnRelFails int64
	lastErr       string
}

const recoveryTimeout = 90 * time.Second

// runFailover is item 2: during churn, SIGKILL the replica owning the most
// nodes; probe each of its nodes with a pod created before the kill, whose
// ADD starts right at the kill and is retried until it succeeds.
func (e *env) runFailover(ctx context.Context, nodes []string) (*failoverResult, error) {
	p := e.cfg.Profile
	if err := e.atLeastReplicas(ctx, 3); err != nil {
		return nil, err
	}
	res := &failoverResult{start: time.Now()}
	ch := e.startChurn(ctx, p.ChurnWorkers, func() []string { return nodes }, 1)
	defer func() {
		ch.stop()
		res.churnAllocs, res.churnLost, res.churnRelFails = ch.allocs.Load(), ch.lost.Load(), ch.releaseFailures.Load()
		res.lastErr = ch.lastErr
		res.end = time.Now()
	}()
	for rep := range p.FailRepeats {
		if _, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); err != nil {
			return res, err
		}
		fr, err := e.killOnce(ctx, nodes)
		if err != nil {
			return res, err
		}
		res.repeats = append(res.repeats, fr)
		e.log.Info("failover", "repeat", rep+1, "victim", fr.victim, "victim_nodes", fr.victimNodes,
			"all_recovered_s", fr.worst().Seconds(), "unrecovered", fr.unrecovered,
			"memberlist_first_s", fr.detectFirst.Seconds(), "memberlist_last_s", fr.detectLast.Seconds())
		victim := e.f.Replica(fr.victim)
		if err := victim.Start(ctx); err != nil {
			return res, fmt.Errorf("restart replica %d: %w", fr.victim, err)
		}
	}
	_, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute)
	return res, err
}

// killOnce SIGKILLs the replica owning the most nodes and measures, per
// victim node, how long a probe ADD takes to succeed again, and when the
// survivors' memberlist declares the victim dead.
func (e *env) killOnce(ctx context.Context, nodes []string) (failoverRepeat, error) {
	var fr failoverRepeat
	victim, survivors, err := e.pickVictim(ctx)
	if err != nil {
		return fr, err
	}
	victimNodes, err := e.nodesOf(ctx, victim, survivors[0], nodes)
	if err != nil {
		return fr, err
	}
	fr.victim, fr.victimNodes = victim.Index(), len(victimNodes)
	probes, err := e.drv.createPods(ctx, "probe", victimNodes, 1, 16)
	if err != nil {
		return fr, err
	}
	defer func() { _ = e.drv.deletePods(context.WithoutCancel(ctx), probes, 16) }()
	fails0 := map[int]float64{}
	for _, r := range survivors {
		fails0[r.Index()], _ = r.Metric(ctx, "cce_ipam_membership_events_total", map[string]string{"type": "fail"})
	}
	sleep(ctx, 3*time.Second) // steady churn before the kill

	fr.killedAt = time.Now()
	if err := victim.Kill(); err != nil {
		return fr, err
	}
	target := e.randomTarget()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, pd := range probes {
		wg.Go(func() { e.probeRecovery(ctx, target, pd, &fr, &mu) })
	}
	wg.Go(func() { watchFailDetection(ctx, survivors, fails0, &fr, &mu) })
	wg.Wait()
	return fr, ctx.Err()
}

// pickVictim returns the running replica owning the most nodes and the
// others.
func (e *env) pickVictim(ctx context.Context) (victim *fleet.Replica, survivors []*fleet.Replica, err error) {
	run := e.running()
	owned := map[int]float64{}
	for _, r := range run {
		v, err := r.Metric(ctx, "cce_ipam_shard_owned_nodes", nil)
		if err != nil {
			return nil, nil, err
		}
		owned[r.Index()] = v
		if victim == nil || v > owned[victim.Index()] {
			victim = r
		}
	}
	for _, r := range run {
		if r != victim {
			survivors = append(survivors, r)
		}
	}
	return victim, survivors, nil
}

// nodesOf returns the nodes that replica r holds, as asker sees them.
func (e *env) nodesOf(ctx context.Context, r, asker *fleet.Replica, nodes []string) ([]string, error) {
	name, err := self(ctx, r)
	if err != nil {
		return nil, err
	}
	holders, err := e.holders(ctx, asker, nodes)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range sortedKeys(holders) {
		if holders[n] == name {
			out = append(out, n)
		}
	}
	return out, nil
}

// probeRecovery retries the probe pod's ADD from the kill until it
// succeeds (recorded in fr.recovered) or recoveryTimeout passes
// (fr.unrecovered), then releases the IP.
func (e *env) probeRecovery(ctx context.Context, target func() string, pd pod, fr *failoverRepeat, mu *sync.Mutex) {
	cid := e.drv.containerID()
	ip, err := e.drv.allocateRetry(ctx, target, pd, cid, recoveryTimeout)
	took := time.Since(fr.killedAt)
	mu.Lock()
	if err != nil {
		fr.unrecovered++
	} else {
		fr.recovered = append(fr.recovered, took)
	}
	mu.Unlock()
	if err == nil {
		_ = e.drv.release(context.WithoutCancel(ctx), target, pd, cid, ip, time.Minute)
	}
}

// watchFailDetection polls the survivors' memberlist fail-event counters
// every 100 ms until each counted one more than fails0 (or recoveryTimeout
// passes), recording the first and last detection in fr.
func watchFailDetection(ctx context.Context, survivors []*fleet.Replica, fails0 map[int]float64,
	fr *failoverRepeat, mu *sync.Mutex) {
	seen := map[int]bool{}
	deadline := fr.killedAt.Add(recoveryTimeout)
	for len(seen) < len(survivors) && time.Now().Before(deadline) && ctx.Err() == nil {
		for _, r := range survivors {
			if seen[r.Index()] {
				continue
			}
			v, err := r.Metric(ctx, "cce_ipam_membership_events_total", map[string]string{"type": "fail"})
			if err == nil && v > fails0[r.Index()] {
				seen[r.Index()] = true
				d := time.Since(fr.killedAt)
				mu.Lock()
				if fr.detectFirst == 0 {
					fr.detectFirst = d
				}
				fr.detectLast = d
				mu.Unlock()
			}
		}
		sleep(ctx, 100*time.Millisecond)
	}
}
