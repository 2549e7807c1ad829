package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/bench/report"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// phase is one batch of timed calls: each call's duration, and when it
// began and ended (since the phase's start), each in its own order.
type phase struct {
	took    []time.Duration
	starts  []time.Duration // of each timed call's first attempt, sorted
	ends    []time.Duration
	elapsed time.Duration
	errors  int // failed attempts, retried
	lastErr string
	skipped int // calls that had nothing to time (errSkip)
}

// errSkip is what a call returns when it had nothing to do and is not
// timed: a floor wep the replica's GC deleted first (it names no pod).
var errSkip = errors.New("nothing to time")

// rateFirst is the calls per second of the first k calls to end: k over the
// time from the phase's start until the k-th ended.
func (p phase) rateFirst(k int) float64 {
	if k <= 0 || len(p.ends) < k || p.ends[k-1] <= 0 {
		return 0
	}
	return float64(k) / p.ends[k-1].Seconds()
}

// rateLast is the calls per second of the last k calls to end: k over the
// time from the end of the call before them until the last ended.
func (p phase) rateLast(k int) float64 {
	n := len(p.ends)
	if k <= 0 || n < k {
		return 0
	}
	var from time.Duration
	if n > k {
		from = p.ends[n-k-1]
	}
	span := p.ends[n-1] - from
	if span <= 0 {
		return 0
	}
	return float64(k) / span.Seconds()
}

// steadyRates are the calls per second of the first and of the last k
// calls served while conc were in flight, read from when calls began: in a
// closed loop of conc workers every call after the first conc begins when an
// earlier one ends, so k gaps between starts are k calls served at full
// concurrency. The ends would not do for a comparison: the first k ends come
// after the fastest calls of the fill, the last k wait for the slowest of the
// drain (with 32 in flight that alone read a flat run as 0.5–0.8×). Zero
// when the two windows would overlap.
func (p phase) steadyRates(k, conc int) (first, last float64) {
	n := len(p.starts)
	conc = max(conc, 1)
	if k <= 0 || conc+k > n-1-k {
		return 0, 0
	}
	rate := func(from, to time.Duration) float64 {
		if to <= from {
			return 0
		}
		return float64(k) / (to - from).Seconds()
	}
	return rate(p.starts[conc], p.starts[conc+k]), rate(p.starts[n-1-k], p.starts[n-1])
}

// windowRates are the calls per second of each successive window of k
// calls served while conc were in flight (read from starts, as
// steadyRates): a knee that builds up falls from window to window, a pause
// dips one window.
func (p phase) windowRates(k, conc int) []float64 {
	conc = max(conc, 1)
	if k <= 0 {
		return nil
	}
	var out []float64
	for from := conc; from+k < len(p.starts); from += k {
		if d := p.starts[from+k] - p.starts[from]; d > 0 {
			out = append(out, float64(k)/d.Seconds())
		}
	}
	return out
}

func (p phase) quantile(q float64) float64 { return report.Quantile(report.Millis(p.took), q) }

// timedPhase runs call(i) for i in 0..n-1, conc at a time. A failed call is
// retried (each attempt timed on its own; only the successful one counts)
// for up to 2 minutes.
func timedPhase(ctx context.Context, n, conc int, call func(ctx context.Context, i int) (time.Duration, error)) (phase, error) {
	var (
		mu sync.Mutex
		p  phase
	)
	start := time.Now()
	err := parallel(ctx, n, conc, func(ctx context.Context, i int) error {
		began := time.Since(start)
		deadline := time.Now().Add(2 * time.Minute)
		for {
			d, err := call(ctx, i)
			mu.Lock()
			if errors.Is(err, errSkip) {
				p.skipped++
				mu.Unlock()
				return nil
			}
			if err == nil {
				p.took = append(p.took, d)
				p.starts = append(p.starts, began)
				p.ends = append(p.ends, time.Since(start))
				mu.Unlock()
				return nil
			}
			p.errors++
			p.lastErr = err.Error()
			mu.Unlock()
			if time.Now().After(deadline) || ctx.Err() != nil {
				return err
			}
			sleep(ctx, 100*time.Millisecond)
		}
	})
	p.elapsed = time.Since(start)
	slices.Sort(p.starts)
	slices.Sort(p.ends)
	return p, err
}

// addDelPhases makes one ADD per pod (a fresh sandbox each), conc at a
// time, then the DEL of each: two timed phases.
func (e *env) addDelPhases(ctx context.Context, pods []pod, conc int, target func() string) (add, del phase, err error) {
	return e.addDelPhasesTo(ctx, pods, conc, func(pod) string { return target() })
}

// addDelPhasesTo is addDelPhases with each call sent where to(pod) says.
func (e *env) addDelPhasesTo(ctx context.Context, pods []pod, conc int, to func(pod) string) (add, del phase, err error) {
	cids := make([]string, len(pods))
	ips := make([]string, len(pods))
	add, err = timedPhase(ctx, len(pods), conc, func(ctx context.Context, i int) (time.Duration, error) {
		if cids[i] == "" {
			cids[i] = e.drv.containerID()
		}
		ip, d, err := e.drv.allocate(ctx, to(pods[i]), pods[i], cids[i], 30*time.Second)
		ips[i] = ip
		return d, err
	})
	// The DELs run also after a failed ADD phase: what was given is freed.
	del, derr := timedPhase(ctx, len(pods), conc, func(ctx context.Context, i int) (time.Duration, error) {
		if ips[i] == "" {
			return 0, errSkip
		}
		return e.drv.releaseOnce(ctx, to(pods[i]), pods[i], cids[i], ips[i])
	})
	return add, del, errors.Join(err, derr)
}

// releaseOnce makes one ReleaseIP call at addr, with the node's name as the
// CNI plugin sends it, and returns its duration.
func (d *driver) releaseOnce(ctx context.Context, addr string, p pod, cid, ip string) (time.Duration, error) {
	if addr == "" {
		return 0, errors.New("no live replica")
	}
	c, err := d.client(addr)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	reply, err := c.ReleaseIP(ctx, &rpc.ReleaseIPRequest{K8SPodName: p.name, K8SPodNamespace: d.ns,
		K8SPodInfraContainerID: cid, K8SNodeName: p.node, IPType: rpc.IPType_BCCMultiENIMultiIPType})
	took := time.Since(start)
	if err == nil && !reply.IsSuccess {
		err = errors.New(reply.ErrMsg)
	}
	if err != nil {
		return took, fmt.Errorf("release %s: %w", p.name, err)
	}
	d.heldMu.Lock()
	if h, ok := d.held[ip]; ok && h.pod == p.name {
		delete(d.held, ip)
	}
	d.heldMu.Unlock()
	return took, nil
}

// checkOnce makes one CheckIP call at addr and returns the IP it reports.
func (d *driver) checkOnce(ctx context.Context, addr string, p pod, cid string) (string, time.Duration, error) {
	c, err := d.client(addr)
	if err != nil {
		return "", 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	reply, err := c.CheckIP(ctx, &rpc.CheckIPRequest{K8SPodName: p.name, K8SPodNamespace: d.ns,
		K8SPodInfraContainerID: cid, K8SNodeName: p.node})
	took := time.Since(start)
	if err == nil && !reply.IsSuccess {
		err = errors.New(reply.ErrMsg)
	}
	if err != nil {
		return "", took, fmt.Errorf("check %s: %w", p.name, err)
	}
	return reply.GetENIMultiIP().GetIP(), took, nil
}

// kneeRun is item 8b at one concurrency: our ADDs then DELs, and the bare
// wep creates then deletes of the same count right before them.
type kneeRun struct {
	conc, repeat                   int
	add, del, floorAdd, floorDel   phase
	firstLastK                     int
	replicas                       int
	addPerSecFirst, addPerSecLast  float64
	delPerSecFirst, delPerSecLast  float64
	floorPerSecAdd, floorPerSecDel float64
	// The releases answered and not yet finished (the replicas'
	// cce_ipam_release_finishes_pending, summed): the most seen while the
	// calls ran, and how long after the last DEL's answer they were all
	// finished (-1: not within finishDrainLimit).
	finishPeak  float64
	finishDrain time.Duration
}

// finishDrainLimit bounds the wait for the releases' finishes after a DEL
// phase.
const finishDrainLimit = time.Minute

// drainPoll times 8b's drain of the finishes to 20 ms. Items 8a and 8c
// wait for them at quietPoll: each read of /metrics costs the replica CPU
// and allocations, which 8c counts (8c's allocations per pair rose from
// 1411 to 1597 when the 20 ms polling came in together with the release
// change it waits for; the two were not measured apart).
const (
	drainPoll = 20 * time.Millisecond
	quietPoll = 500 * time.Millisecond
)

// finishesPending is the releases answered and not yet finished, over the
// running replicas.
func (e *env) finishesPending(ctx context.Context) float64 {
	return e.sumMetric(ctx, "cce_ipam_release_finishes_pending", nil)
}

// finishesDone waits until no release answered by a running replica is
// still finishing (cce_ipam_release_finishes_pending is 0 on all), reading
// the replicas' /metrics every poll, and returns how long that took.
func (e *env) finishesDone(ctx context.Context, poll time.Duration) (time.Duration, error) {
	began := time.Now()
	for time.Since(began) < finishDrainLimit {
		if e.finishesPending(ctx) == 0 {
			return time.Since(began), nil
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		sleep(ctx, poll)
	}
	return 0, fmt.Errorf("releases still finishing %s after the calls", finishDrainLimit)
}

// runKnee is item 8b at every concurrency of the profile: the floor (bare
// wep creates, then deletes, conc at a time), then one ADD per pod, then
// their DELs.
func (e *env) runKnee(ctx context.Context, pods []pod, target func() string) (_ []kneeRun, err error) {
	var out []kneeRun
	// The floor's weps name floorNode. Without a Node of that name they are
	// weps of a deleted node, which the replicas' GC deletes: when its tick
	// fell in a run it added hundreds of requests to the cell measured. A
	// Node without a providerID is no BCC node: no replica serves it and
	// the GC leaves its weps alone.
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: floorNode}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create the floor's node: %w", err)
	}
	defer func() {
		if derr := e.kube.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), floorNode, metav1.DeleteOptions{}); derr != nil &&
			!apierrors.IsNotFound(derr) {
			err = errors.Join(err, fmt.Errorf("delete the floor's node: %w", derr))
		}
	}()
	for _, c := range e.cfg.Profile.APICostConcs {
		for r := range max(1, e.cfg.Profile.APICostKneeRepeats) {
			k, err := e.kneeOnce(ctx, pods, target, c, r+1)
			if err != nil {
				return out, err
			}
			out = append(out, k)
		}
	}
	return out, nil
}

// kneeOnce is one repeat of 8b at concurrency c.
func (e *env) kneeOnce(ctx context.Context, pods []pod, target func() string, c, repeat int) (kneeRun, error) {
	k := kneeRun{conc: c, repeat: repeat, firstLastK: min(100, len(pods)/4), replicas: len(e.running())}
	var err error
	if k.floorAdd, k.floorDel, err = e.floorPhases(ctx, len(pods), c); err != nil {
		return k, fmt.Errorf("floor at c=%d: %w", c, err)
	}
	sleep(ctx, 2*time.Second)
	sctx, stop := context.WithCancel(ctx)
	sampled := make(chan float64, 1)
	go func() {
		peak := 0.0
		for sctx.Err() == nil {
			peak = max(peak, e.finishesPending(ctx))
			sleep(sctx, 100*time.Millisecond)
		}
		sampled <- peak
	}()
	k.add, k.del, err = e.addDelPhases(ctx, pods, c, target)
	stop()
	k.finishPeak = <-sampled
	if err != nil {
		return k, fmt.Errorf("ADD/DEL at c=%d: %w", c, err)
	}
	if k.finishDrain, err = e.finishesDone(ctx, drainPoll); err != nil {
		k.finishDrain = -1
		e.log.Warn("apicost: releases still finishing", "conc", c, "err", err)
	}
	k.addPerSecFirst, k.addPerSecLast = k.add.steadyRates(k.firstLastK, c)
	k.delPerSecFirst, k.delPerSecLast = k.del.steadyRates(k.firstLastK, c)
	k.floorPerSecAdd = float64(len(k.floorAdd.took)) / k.floorAdd.elapsed.Seconds()
	k.floorPerSecDel = float64(len(k.floorDel.took)) / k.floorDel.elapsed.Seconds()
	e.log.Info("apicost knee", "replicas", k.replicas, "conc", c, "repeat", repeat,
		"add_p50_ms", k.add.quantile(0.5), "add_p99_ms", k.add.quantile(0.99),
		"del_p50_ms", k.del.quantile(0.5), "del_p99_ms", k.del.quantile(0.99),
		"floor_create_p99_ms", k.floorAdd.quantile(0.99), "floor_delete_p99_ms", k.floorDel.quantile(0.99),
		"add_first_per_s", k.addPerSecFirst, "add_last_per_s", k.addPerSecLast,
		"del_first_per_s", k.delPerSecFirst, "del_last_per_s", k.delPerSecLast,
		"finish_peak", k.finishPeak, "finish_drain", k.finishDrain)
	sleep(ctx, 3*time.Second) // cooling (1s) + pool check
	return k, nil
}

// floorPhases creates n bare weps conc at a time, then deletes them conc at
// a time, timing each request.
func (e *env) floorPhases(ctx context.Context, n, conc int) (create, del phase, err error) {
	base := int(e.drv.seq.Add(int64(n)))
	name := func(i int) string { return fmt.Sprintf("floor-%d", base+i) }
	create, err = timedPhase(ctx, n, conc, func(ctx context.Context, i int) (time.Duration, error) {
		return e.drv.floorCreate(ctx, floorNamespace, name(i), i)
	})
	if err != nil {
		return create, del, errors.Join(err, e.drv.floorDeleteAll(ctx, floorNamespace))
	}
	weps := e.cce.CceV1alpha1().WorkloadEndpoints(floorNamespace)
	del, err = timedPhase(ctx, n, conc, func(ctx context.Context, i int) (time.Duration, error) {
		start := time.Now()
		err := weps.Delete(ctx, name(i), metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			// The replica's GC deletes weps of pods that do not exist,
			// these among them (every 2 minutes with the chart's period).
			return 0, errSkip
		}
		return time.Since(start), err
	})
	return create, del, err
}

// linkBinDir makes dir a directory of symbolic links to every file of
// binDir, so that one of them can be pointed elsewhere.
func linkBinDir(binDir, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(binDir)
	if err != nil {
		return "", err
	}
	for _, en := range ents {
		link := filepath.Join(dir, en.Name())
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join(binDir, en.Name()), link); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// useReplicaBinary points the fleet's cce-ipam at bin ("" for bin/'s own)
// for replicas started from now on.
func (e *env) useReplicaBinary(bin string) error {
	if e.replicaBin == "" {
		return errors.New("the fleet's cce-ipam is not a link (item 8 was not selected at the start)")
	}
	if bin == "" {
		bin = filepath.Join(e.cfg.BinDir, "cce-ipam")
	}
	tmp := e.replicaBin + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(bin, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, e.replicaBin)
}
