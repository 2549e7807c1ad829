package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cce-ipam/sharded/bench/report"
)

// latRun is one configuration's measurements: per repeat, the samples and
// the calls per second of its waves.
type latRun struct {
	name    string
	repeats [][]time.Duration
	rates   []float64 // calls/s per repeat (calls / summed wave time)
	errors  int
}

func (l *latRun) all() []float64 {
	var out []float64
	for _, r := range l.repeats {
		out = append(out, report.Millis(r)...)
	}
	return out
}

// medians returns the medians over repeats of p50, p99 (ms) and the rate.
func (l *latRun) medians() (p50, p99, rate float64) {
	var a, b []float64
	for _, r := range l.repeats {
		ms := report.Millis(r)
		a = append(a, report.Quantile(ms, 0.5))
		b = append(b, report.Quantile(ms, 0.99))
	}
	return report.Median(a), report.Median(b), report.Median(l.rates)
}

// latencyResult is item 1.
type latencyResult struct {
	floor1, ours1, floor3, ours3 *latRun
	forwardedShare               float64 // of CNI calls during the 3-replica waves
	// direct and forwarded split the 3-replica waves' calls by whether the
	// replica called served the pod's node or forwarded the call to the
	// one that does (issue #25 item 4: the hop's own cost).
	direct, forwarded []time.Duration
}

// floorWave creates n bare WorkloadEndpoints, conc at a time, timing each
// Create; then deletes them (untimed).
func (e *env) floorWave(ctx context.Context, n, conc int) ([]time.Duration, time.Duration, int, error) {
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	base := int(e.drv.seq.Add(int64(n)))
	start := time.Now()
	err := parallel(ctx, n, conc, func(ctx context.Context, i int) error {
		d, err := e.drv.floorCreate(ctx, floorNamespace, fmt.Sprintf("floor-%d", base+i), i)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs++
			return nil
		}
		lat = append(lat, d)
		return nil
	})
	elapsed := time.Since(start)
	if err != nil {
		return nil, 0, errs, err
	}
	return lat, elapsed, errs, e.drv.floorDeleteAll(ctx, floorNamespace)
}

// allocWave allocates one IP for each pod (a fresh sandbox), conc at a time,
// each call at target(); failed calls are counted and retried, only
// successful calls are timed. Then every IP is released again (untimed).
func (e *env) allocWave(ctx context.Context, pods []pod, conc int, target func() string) ([]time.Duration, time.Duration, int, error) {
	return e.allocWaveSeen(ctx, pods, conc, target, nil)
}

// allocWaveSeen is allocWave that also tells seen, when not nil, where each
// successful call went and how long it took.
func (e *env) allocWaveSeen(ctx context.Context, pods []pod, conc int, target func() string,
	seen func(p pod, addr string, took time.Duration)) ([]time.Duration, time.Duration, int, error) {
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	cids := make([]string, len(pods))
	ips := make([]string, len(pods))
	start := time.Now()
	err := parallel(ctx, len(pods), conc, func(ctx context.Context, i int) error {
		cids[i] = e.drv.containerID()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			addr := target()
			ip, d, err := e.drv.allocate(ctx, addr, pods[i], cids[i], 30*time.Second)
			mu.Lock()
			if err == nil {
				if seen != nil {
					seen(pods[i], addr, d)
				}
				lat = append(lat, d)
				ips[i] = ip
				mu.Unlock()
				return nil
			}
			errs++
			mu.Unlock()
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("allocate %s: %w", pods[i].name, err)
			}
			sleep(ctx, 200*time.Millisecond)
		}
	})
	elapsed := time.Since(start)
	rerr := parallel(ctx, len(pods), conc, func(ctx context.Context, i int) error {
		if ips[i] == "" {
			return nil
		}
		return e.drv.release(ctx, target, pods[i], cids[i], ips[i], time.Minute)
	})
	if err == nil {
		err = rerr
	}
	return lat, elapsed, errs, err
}

// runLatency is item 1: warm allocations with 1 and with 3 replicas, each
// against the bare-create floor measured right before it.
func (e *env) runLatency(ctx context.Context, nodes []string) (*latencyResult, error) {
	p := e.cfg.Profile
	pods, err := e.drv.createPods(ctx, "lat", nodes, p.LatPerNode, 16)
	if err != nil {
		return nil, fmt.Errorf("create latency pods: %w", err)
	}
	defer func() { _ = e.drv.deletePods(context.WithoutCancel(ctx), pods, 16) }()
	settleWarm := func() { sleep(ctx, 3*time.Second) } // cooling (1s) + pool check (1s)
	res := &latencyResult{floor1: &latRun{name: "floor, 1-replica phase"}, ours1: &latRun{name: "1 replica"},
		floor3: &latRun{name: "floor, 3-replica phase"}, ours3: &latRun{name: "3 replicas"}}

	var seen func(pod, string, time.Duration) // set for the 3-replica waves
	measure := func(floor, ours *latRun, target func() string) error {
		// Warm-up: connections, caches, pools.
		if _, _, _, err := e.allocWave(ctx, pods, p.Conc, target); err != nil {
			return err
		}
		if _, _, _, err := e.floorWave(ctx, len(pods), p.Conc); err != nil {
			return err
		}
		settleWarm()
		for rep := range p.Repeats {
			var fl, ol []time.Duration
			var ft, ot time.Duration
			for range p.LatWaves {
				lat, el, errs, err := e.floorWave(ctx, len(pods), p.Conc)
				if err != nil {
					return err
				}
				fl, ft, floor.errors = append(fl, lat...), ft+el, floor.errors+errs
				lat, el, errs, err = e.allocWaveSeen(ctx, pods, p.Conc, target, seen)
				if err != nil {
					return err
				}
				ol, ot, ours.errors = append(ol, lat...), ot+el, ours.errors+errs
				settleWarm()
			}
			floor.repeats, floor.rates = append(floor.repeats, fl), append(floor.rates, float64(len(fl))/ft.Seconds())
			ours.repeats, ours.rates = append(ours.repeats, ol), append(ours.rates, float64(len(ol))/ot.Seconds())
			f50, f99, fr := floor.medians()
			o50, o99, or := ours.medians()
			e.log.Info("latency repeat", "config", ours.name, "repeat", rep+1,
				"floor_p50_ms", f50, "floor_p99_ms", f99, "floor_rate", fr, "p50_ms", o50, "p99_ms", o99, "rate", or)
		}
		return nil
	}

	r0 := e.f.Replica(0)
	if err := measure(res.floor1, res.ours1, func() string { return r0.GRPCAddr() }); err != nil {
		return nil, err
	}
	e.log.Info("adding two replicas")
	if err := e.atLeastReplicas(ctx, 3); err != nil {
		return nil, err
	}
	fwd0 := e.sumMetric(ctx, "cce_ipam_shard_forwarded_requests_total", nil)
	// hop "entry" counts a forwarded call once, where it entered.
	entry := map[string]string{"hop": "entry"}
	calls0 := e.sumMetric(ctx, "cce_ipam_cni_requests_total", entry)
	if seen, err = e.hopRecorder(ctx, nodes, res); err != nil {
		return nil, err
	}
	if err := measure(res.floor3, res.ours3, e.randomTarget()); err != nil {
		return nil, err
	}
	fwd := e.sumMetric(ctx, "cce_ipam_shard_forwarded_requests_total", nil) - fwd0
	calls := e.sumMetric(ctx, "cce_ipam_cni_requests_total", entry) - calls0
	if calls > 0 {
		res.forwardedShare = fwd / calls
	}
	return res, nil
}

// hopRecorder files each call into res.direct or res.forwarded by whether
// it entered at the owner of the pod's node, as the settled replicas see it.
func (e *env) hopRecorder(ctx context.Context, nodes []string, res *latencyResult) (func(pod, string, time.Duration), error) {
	owner, err := e.ownerTarget(ctx, e.running(), nodes)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	return func(p pod, addr string, took time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if addr == owner(p) {
			res.direct = append(res.direct, took)
		} else {
			res.forwarded = append(res.forwarded, took)
		}
	}, nil
}

// sumMetric sums a metric's series with labels over the running replicas.
func (e *env) sumMetric(ctx context.Context, name string, labels map[string]string) float64 {
	var sum float64
	for _, r := range e.running() {
		v, _ := r.Metric(ctx, name, labels)
		sum += v
	}
	return sum
}
