package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/shard"
)

// failoverRepeat is one SIGKILL.
type failoverRepeat struct {
	// config names the lease the replicas ran with (leaseConfigs).
	config      string
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

// leaseConfig is one set of shard lease values item 2 measures.
type leaseConfig struct {
	defaults                     bool // the replicas' own defaults: no flags
	lease, deadline, renewPeriod time.Duration
}

// leaseConfigs are the lease settings item 2 kills replicas under: the
// defaults, and the shortest the fence allows with two renewals within the
// deadline (issue #25 item 3: failover within 5 s of the kill).
func leaseConfigs() []leaseConfig {
	d := shardDefaults
	return []leaseConfig{
		{defaults: true, lease: d.LeaseDuration, deadline: d.RenewDeadline, renewPeriod: d.RenewPeriod},
		{lease: 3 * time.Second, deadline: 2 * time.Second, renewPeriod: 500 * time.Millisecond},
	}
}

func (lc leaseConfig) name() string {
	n := fmt.Sprintf("lease %v, deadline %v, renew %v", lc.lease, lc.deadline, lc.renewPeriod)
	if lc.defaults {
		return "defaults: " + n
	}
	return n
}

// args are the replicas' flags for lc (none for the defaults).
func (lc leaseConfig) args() []string {
	if lc.defaults {
		return nil
	}
	return []string{"--shard-lease-duration=" + lc.lease.String(), "--shard-renew-deadline=" + lc.deadline.String(),
		"--shard-renew-period=" + lc.renewPeriod.String()}
}

// margin is the renew deadline less the renew period: a renewal longer than
// this lapses the lease unless the next one is quicker than a period (a
// renewal, counted as at least a period, and the next must fit in the
// deadline together).
func (lc leaseConfig) margin() time.Duration { return lc.deadline - lc.renewPeriod }

// renewals is what the running replicas' renewal histograms showed at the
// end of one configuration's repeats (counts since each process started).
type renewals struct {
	config           string
	total, slow, max float64 // slow: longer than the config's margin; max: the largest bucket bound reached
	margin           time.Duration
}

// failoverResult is item 2.
type failoverResult struct {
	renewals      []renewals
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
	for _, lc := range leaseConfigs() {
		// The background loops at the product's periods (steadyArgs): the
		// fleet's test-speed ENI syncs would spend most of the cluster's
		// 1 ListENIs/s that a takeover's list needs.
		e.setPhaseArgs(append(slices.Clone(steadyArgs), lc.args()...)...)
		if err := e.restartAll(ctx, 3); err != nil {
			return res, err
		}
		for rep := range p.FailRepeats {
			if _, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); err != nil {
				return res, err
			}
			fr, err := e.killOnce(ctx, nodes)
			if err != nil {
				return res, err
			}
			fr.config = lc.name()
			res.repeats = append(res.repeats, fr)
			e.log.Info("failover", "config", lc.name(), "repeat", rep+1, "victim", fr.victim, "victim_nodes", fr.victimNodes,
				"all_recovered_s", fr.worst().Seconds(), "unrecovered", fr.unrecovered,
				"memberlist_first_s", fr.detectFirst.Seconds(), "memberlist_last_s", fr.detectLast.Seconds())
			victim := e.f.Replica(fr.victim)
			if err := victim.Start(ctx); err != nil {
				return res, fmt.Errorf("restart replica %d: %w", fr.victim, err)
			}
		}
		res.renewals = append(res.renewals, e.readRenewals(ctx, lc))
	}
	e.setPhaseArgs()
	if err := e.restartAll(ctx, 3); err != nil { // the defaults again for what follows
		return res, err
	}
	_, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute)
	return res, err
}

// readRenewals sums the running replicas' renewal histograms.
func (e *env) readRenewals(ctx context.Context, lc leaseConfig) renewals {
	const name = "cce_ipam_shard_lease_renew_duration_seconds"
	rn := renewals{config: lc.name(), margin: lc.margin()}
	for _, r := range e.running() {
		ss, err := r.Metrics(ctx)
		if err != nil {
			continue
		}
		count, _ := ss.Sum(name+"_count", nil)
		rn.total += count
		within, _ := ss.Sum(name+"_bucket", map[string]string{"le": fmt.Sprint(lc.margin().Seconds())})
		rn.slow += count - within
		prev := 0.0
		for _, b := range shard.RenewDurationBuckets {
			n, _ := ss.Sum(name+"_bucket", map[string]string{"le": fmt.Sprint(b)})
			if n > prev {
				rn.max = max(rn.max, b) // some renewal took at most b and more than the bound before
			}
			prev = n
		}
		if count > prev {
			rn.max = math.Inf(1) // beyond the last bucket
		}
	}
	return rn
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
