package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Item 5b, scale-out with the cloud budget as the bottleneck (issue #25
// item 1): the same churn as item 5 (a warm pool of one IP, so nearly every
// ADD and DEL is a cloud call), but under a cluster-wide budget of
// budgetScaleRate calls per second with the per-operation limits lifted, so
// that the shared budget alone bounds the calls. With 3 replicas, with
// --shard-budget-follow-demand off and on: churn on every node, then only on
// replica 0's nodes while the others idle; then 1 replica alone. Sharding
// cannot raise a global budget (I5): what it can do is not lose any of it,
// which is what the busy-alone cells show with follow-demand on.

// budgetScaleRate is item 5b's cluster-wide BCE rate (and burst): low
// enough that the churn's demand exceeds it.
const budgetScaleRate = 6

// budgetScaleCell is one cell of item 5b.
type budgetScaleCell struct {
	replicas int
	follow   bool
	busyOnly bool // churn only on replica 0's nodes
	nodes    int  // nodes churned
	allocs   int64
	lost     int64
	secs     float64
	bceCalls int64   // calls bce-sim received in the whole seconds the cell touched
	bceSecs  int     // how many such seconds
	share    float64 // replica 0's cce_ipam_shard_budget_rate at the end
}

// allocsPerSec is the cell's ADDs per second.
func (c budgetScaleCell) allocsPerSec() float64 { return float64(c.allocs) / c.secs }

// budgetScaleArgs are the replicas' flags in item 5b.
func budgetScaleArgs(follow bool) []string {
	r := strconv.Itoa(budgetScaleRate)
	return []string{"--batch-add-ip-num", "1", "--idle-ip-pool-min-size", "1", "--idle-ip-pool-max-size", "1",
		"--bce-rate", r, "--bce-burst", r, "--bce-op-limits=", "--shard-budget-follow-demand=" + strconv.FormatBool(follow)}
}

// budgetScale runs item 5b's cells into res; it may leave one replica
// (runBudget restores three with the bench's own flags).
func (e *env) budgetScale(ctx context.Context, res *budgetResult, nodes []string) error {
	restart := func(follow bool) error {
		e.setPhaseArgs(budgetScaleArgs(follow)...)
		for _, r := range e.running() {
			if err := r.Restart(ctx); err != nil {
				return err
			}
		}
		if _, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); err != nil {
			return err
		}
		sleep(ctx, 5*time.Second) // the pools refill
		return nil
	}
	for _, follow := range []bool{false, true} {
		if err := e.atLeastReplicas(ctx, 3); err != nil {
			return err
		}
		if err := restart(follow); err != nil {
			return err
		}
		for _, busyOnly := range []bool{false, true} {
			cell, err := e.budgetScaleCell(ctx, nodes, follow, busyOnly)
			if err != nil {
				return err
			}
			res.scale = append(res.scale, cell)
		}
	}
	for _, r := range e.running()[1:] {
		if err := r.Remove(); err != nil {
			return err
		}
	}
	if err := restart(false); err != nil {
		return err
	}
	cell, err := e.budgetScaleCell(ctx, nodes, false, false)
	if err != nil {
		return err
	}
	res.scale = append(res.scale, cell)
	return nil
}

// budgetScaleCell churns for Profile.BusyAlone on every node (busyOnly:
// on replica 0's nodes only) and counts the ADDs and the BCE calls.
func (e *env) budgetScaleCell(ctx context.Context, nodes []string, follow, busyOnly bool) (budgetScaleCell, error) {
	cell := budgetScaleCell{replicas: len(e.running()), follow: follow, busyOnly: busyOnly}
	churned := nodes
	busy := e.f.Replica(0)
	if busyOnly {
		var err error
		if churned, err = e.nodesOf(ctx, busy, busy, nodes); err != nil {
			return cell, err
		}
	}
	cell.nodes = len(churned)
	start := time.Now()
	ch := e.startChurn(ctx, budgetWorkers, func() []string { return churned }, 1)
	sleep(ctx, e.cfg.Profile.BusyAlone)
	cell.share, _ = busy.Metric(ctx, "cce_ipam_shard_budget_rate", nil)
	cell.allocs = ch.allocs.Load()
	end := time.Now()
	ch.stop()
	cell.lost, cell.secs = ch.lost.Load(), end.Sub(start).Seconds()
	st, err := e.f.SimStats(ctx)
	if err != nil {
		return cell, err
	}
	for _, s := range secondsIn(st.All.PerSecond, start, end) {
		cell.bceCalls += s.Calls
		cell.bceSecs++
	}
	e.log.Info("budget scale-out", "replicas", cell.replicas, "follow_demand", follow, "busy_only", busyOnly,
		"nodes", cell.nodes, "adds_per_s", cell.allocsPerSec(), "bce_calls", cell.bceCalls, "share", cell.share)
	if ctx.Err() != nil {
		return cell, ctx.Err()
	}
	return cell, nil
}

// budgetScaleLabel names a cell in the report.
func budgetScaleLabel(c budgetScaleCell) string {
	where := "every node"
	if c.busyOnly {
		where = "replica 0's nodes only"
	}
	follow := "off"
	if c.follow {
		follow = "on"
	}
	if c.replicas == 1 {
		return fmt.Sprintf("1 replica, %s", where)
	}
	return fmt.Sprintf("%d replicas, follow-demand %s, %s", c.replicas, follow, where)
}
