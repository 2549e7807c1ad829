package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/cce-ipam/sharded/bench/report"
	"github.com/cce-ipam/sharded/e2e/invariants"
)

// ErrInvariant is returned by Run when the system broke an invariant
// (a duplicate IP and the like): the one way a benchmark run fails.
var ErrInvariant = errors.New("bench: invariant violated")

// results gathers every item's measurements.
type results struct {
	started    time.Time
	finished   time.Time
	machine    report.Env
	latency    *latencyResult
	psts       *pstsResult
	failover   *failoverResult
	budget     *budgetResult
	scales     []*scaleResult
	idle       *idleReplica
	apicost    *apicostResult
	scaleOut   *scaleOutResult
	burst      *burstResult
	violations []string
	checkerErr string
	// unchecked: the run was interrupted before the invariant checker ran.
	unchecked bool
	failed    []string // items that could not finish, with the error
	samples   []sample // the sampler's scrapes of the whole run
}

// Run starts the system, measures every item of the profile and writes the
// report (also when an item fails: what was measured is reported, with the
// error). It returns ErrInvariant when an invariant broke.
func Run(ctx context.Context, cfg Config) error {
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return err
	}
	res := &results{
		started: time.Now(),
		machine: report.Machine(cfg.BinDir),
	}
	e, err := startEnv(ctx, cfg)
	if err != nil {
		return err
	}
	runErr := e.runAll(ctx, res)
	closeErr := e.close()
	res.finished = time.Now()
	res.samples = e.smp.window(res.started, res.finished)
	if werr := writeReport(cfg, res); werr != nil {
		return errors.Join(runErr, closeErr, werr)
	}
	if len(res.violations) > 0 {
		return errors.Join(ErrInvariant, runErr)
	}
	return errors.Join(runErr, closeErr)
}

func (e *env) runAll(ctx context.Context, res *results) (err error) {
	p := e.cfg.Profile
	if e.cfg.runs("scale") {
		// Before any node exists: what a replica costs whatever its share.
		if res.idle, err = e.measureIdle(ctx); err != nil {
			e.log.Warn("idle replica not measured", "err", err)
		}
	}
	latNodes, err := e.addNodes(ctx, p.LatNodes)
	if err != nil {
		return err
	}
	if _, err := e.settle(ctx, len(latNodes), 3*time.Minute); err != nil {
		return err
	}
	step := func(item, name string, fn func() error) {
		if ctx.Err() != nil || !e.cfg.runs(item) {
			return
		}
		e.log.Info("item", "name", name)
		if err := fn(); err != nil {
			e.log.Error("item failed", "name", name, "err", err)
			res.failed = append(res.failed, fmt.Sprintf("%s: %v", name, err))
		}
	}
	step("latency", "1 warm allocation", func() (err error) { res.latency, err = e.runLatency(ctx, latNodes); return })
	step("psts", "7 PSTS allocation", func() (err error) { res.psts, err = e.runPSTS(ctx, latNodes); return })
	step("failover", "2 failover", func() (err error) { res.failover, err = e.runFailover(ctx, latNodes); return })
	step("budget", "5 budget", func() (err error) { res.budget, err = e.runBudget(ctx, latNodes); return })
	// Before the scale items add their nodes: a replica capped at 0.05 CPU
	// measures calls, not the rebuild of hundreds of nodes. It ends with
	// one replica; the next items start the replicas they need.
	step("scaleout", "9 scale-out under a CPU quota per replica", func() (err error) {
		res.scaleOut, err = e.runScaleOut(ctx, latNodes)
		return
	})
	step("burst", "10 bursts of pods on one node", func() (err error) { res.burst, err = e.runBurst(ctx); return })
	filled := map[string]bool{}
	for _, s := range p.Scales {
		step("scale", "3, 4, 6 at "+s.String(), func() error {
			r, err := e.runScale(ctx, s, filled)
			if r != nil {
				res.scales = append(res.scales, r)
			}
			return err
		})
	}
	step("apicost", "8 API cost of a CNI call", func() (err error) { res.apicost, err = e.runAPICost(ctx, latNodes); return })
	res.violations = e.drv.Violations()
	if ctx.Err() != nil {
		// Interrupted: the checker's wait (up to 3 min, on a control plane
		// that may be going away) is not what Ctrl-C asked for.
		e.log.Warn("interrupted: the invariant checker does not run")
		res.unchecked = true
		return ctx.Err()
	}
	// Invariants: what the driver saw, and the checker on the settled
	// cluster (the fill's Running pods).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	chk, err := e.f.Checker(invariants.Config{
		Namespaces:  []string{podNamespace},
		OrphanGrace: time.Minute,
		Claims:      true,
		ClaimGrace:  time.Minute,
	})
	if err != nil {
		return err
	}
	vs, err := chk.WaitClean(cctx, 5*time.Second)
	if err != nil {
		res.checkerErr = err.Error()
		for _, v := range vs {
			res.violations = append(res.violations, v.String())
		}
	}
	return ctx.Err()
}

// targetLine says whether a measured value meets a target (lower is
// better) and by how much it misses.
func targetLine(measured, target float64, unit string) string {
	if math.IsNaN(measured) {
		return "not measured"
	}
	if measured <= target {
		return "met"
	}
	return fmt.Sprintf("missed by %s%s (%s)", report.Num(measured-target, 2), unit, report.Ratio(measured, target)+" of target")
}

func writeReport(cfg Config, res *results) error {
	dir := cfg.OutDir
	name := cfg.ReportName
	if name == "" {
		name = "report.md"
	}
	doc := buildDoc(cfg, res, func(file string) string { return filepath.Join(dir, file) })
	return report.Write(filepath.Join(dir, name), doc)
}

// atLeastReplicas adds replicas until n run and the cluster settles: the
// latency item grows to three this way, and the failover and budget items
// make sure of three when a partial run (--items) skipped it.
func (e *env) atLeastReplicas(ctx context.Context, n int) error {
	added := false
	for len(e.running()) < n {
		if _, err := e.f.AddReplica(ctx); err != nil {
			return err
		}
		added = true
	}
	if added {
		_, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute)
		return err
	}
	return nil
}
