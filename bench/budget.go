package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// event is a labelled moment for plots.
type event struct {
	at   time.Time
	name string
}

// budgetResult is item 5.
type budgetResult struct {
	start, end     time.Time
	events         []event
	perSecond      []bcesim.SecondStats // every BCE call at bce-sim, join/leave window
	maxSecond      int64
	allocs, lost   int64
	busyReplica    int
	busyNodes      int
	busyStart      time.Time
	busyEnd        time.Time
	busyPerSecond  []bcesim.SecondStats
	busyMax        int64
	busyMean       float64
	busyShare      float64 // the busy replica's budget_rate gauge
	busyShareBurst float64
	scale          []budgetScaleCell // item 5b
}

// budgetWorkers churn in item 5: more ADDs waiting for a refill than the
// budget serves.
const budgetWorkers = 24

// runBudget is item 5. Every replica restarts with a warm pool of one IP
// (min = max = 1), so that nearly every ADD and DEL needs a cloud call, and
// bce-sim's own limits are lifted, so that the replicas' budget is the only
// limit. Churn runs on every node while a replica joins, one leaves
// gracefully, one is SIGKILLed and started again; then only the nodes of
// one replica get churn while the others idle.
func (e *env) runBudget(ctx context.Context, nodes []string) (_ *budgetResult, err error) {
	if err := e.atLeastReplicas(ctx, 3); err != nil {
		return nil, err
	}
	res := &budgetResult{}
	e.setPhaseArgs("--batch-add-ip-num", "1", "--idle-ip-pool-min-size", "1", "--idle-ip-pool-max-size", "1")
	// The items after this one get three replicas with the bench's own
	// flags, however this one ended (not its one-IP pools).
	defer func() {
		e.setPhaseArgs()
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		for _, r := range e.running() {
			err = errors.Join(err, r.Restart(rctx))
		}
		err = errors.Join(err, e.atLeastReplicas(rctx, 3))
	}()
	for _, r := range e.running() {
		if err := r.Restart(ctx); err != nil {
			return nil, err
		}
	}
	if _, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); err != nil {
		return nil, err
	}
	if err := e.simLimits(ctx, false); err != nil {
		return nil, err
	}
	defer func() { _ = e.simLimits(context.WithoutCancel(ctx), true) }()

	if err := e.budgetJoinLeave(ctx, res, nodes); err != nil {
		return nil, err
	}
	if err := e.budgetBusyAlone(ctx, res, nodes); err != nil {
		return nil, err
	}
	if err := e.budgetScale(ctx, res, nodes); err != nil {
		return res, fmt.Errorf("5b, scale-out under the budget: %w", err)
	}
	return res, nil
}

// budgetJoinLeave churns on every node for Profile.BudgetLoad while a
// replica joins, leaves gracefully, and one is SIGKILLed and started again;
// it records the events and the busiest second at bce-sim.
func (e *env) budgetJoinLeave(ctx context.Context, res *budgetResult, nodes []string) error {
	p := e.cfg.Profile
	res.start = time.Now()
	ch := e.startChurn(ctx, budgetWorkers, func() []string { return nodes }, 1)
	step := p.BudgetLoad / 6
	mark := func(name string) {
		res.events = append(res.events, event{
			at:   time.Now(),
			name: name,
		})
		e.log.Info("budget phase", "event", name)
	}
	sleep(ctx, step)
	joined, err := e.f.AddReplica(ctx)
	if err != nil {
		ch.stop()
		return err
	}
	mark(fmt.Sprintf("r%d joins", joined.Index()))
	sleep(ctx, step)
	mark(fmt.Sprintf("r%d leaves", joined.Index()))
	if err := joined.Remove(); err != nil {
		ch.stop()
		return err
	}
	sleep(ctx, step)
	crash := e.f.Replica(1)
	mark(fmt.Sprintf("r%d SIGKILL", crash.Index()))
	if err := crash.Kill(); err != nil {
		ch.stop()
		return err
	}
	sleep(ctx, step)
	mark(fmt.Sprintf("r%d restarts", crash.Index()))
	if err := crash.Start(ctx); err != nil {
		ch.stop()
		return err
	}
	sleep(ctx, max(0, time.Until(res.start.Add(p.BudgetLoad))))
	ch.stop()
	res.end = time.Now()
	res.allocs, res.lost = ch.allocs.Load(), ch.lost.Load()
	st, err := e.f.SimStats(ctx)
	if err != nil {
		return err
	}
	res.perSecond = secondsIn(st.All.PerSecond, res.start, res.end)
	for _, s := range res.perSecond {
		res.maxSecond = max(res.maxSecond, s.Calls)
	}
	return nil
}

// budgetBusyAlone churns only on replica 0's nodes for Profile.BusyAlone
// while the others idle, and records its budget share and the calls per
// second at bce-sim.
func (e *env) budgetBusyAlone(ctx context.Context, res *budgetResult, nodes []string) error {
	if _, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); err != nil {
		return err
	}
	sleep(ctx, 5*time.Second) // let the pools refill after the churn
	busy := e.f.Replica(0)
	mine, err := e.nodesOf(ctx, busy, busy, nodes)
	if err != nil {
		return err
	}
	res.busyReplica, res.busyNodes = busy.Index(), len(mine)
	res.busyStart = time.Now()
	ch := e.startChurn(ctx, budgetWorkers, func() []string { return mine }, 1)
	sleep(ctx, e.cfg.Profile.BusyAlone)
	res.busyShare, _ = busy.Metric(ctx, "cce_ipam_shard_budget_rate", nil)
	res.busyShareBurst, _ = busy.Metric(ctx, "cce_ipam_shard_budget_burst", nil)
	ch.stop()
	res.busyEnd = time.Now()
	st, err := e.f.SimStats(ctx)
	if err != nil {
		return err
	}
	// Skip the first two seconds (the burst) for the mean.
	res.busyPerSecond = secondsIn(st.All.PerSecond, res.busyStart, res.busyEnd)
	var sum float64
	n := 0
	for _, s := range res.busyPerSecond {
		res.busyMax = max(res.busyMax, s.Calls)
		if s.Unix >= res.busyStart.Unix()+2 && s.Unix < res.busyEnd.Unix() {
			sum += float64(s.Calls)
			n++
		}
	}
	if n > 0 {
		res.busyMean = sum / float64(n)
	}
	return nil
}

// secondsIn returns the seconds in [from, to], zero-filled.
func secondsIn(all []bcesim.SecondStats, from, to time.Time) []bcesim.SecondStats {
	by := map[int64]bcesim.SecondStats{}
	for _, s := range all {
		by[s.Unix] = s
	}
	var out []bcesim.SecondStats
	for sec := from.Unix(); sec <= to.Unix(); sec++ {
		s := by[sec]
		s.Unix = sec
		out = append(out, s)
	}
	return out
}
