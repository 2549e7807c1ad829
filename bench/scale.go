package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cce-ipam/sharded/bench/report"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// coldStart is one start of `replicas` fresh processes on a settled cluster.
type coldStart struct {
	replicas int
	took     time.Duration // start until every node is served
	calls    map[bcesim.Op]int64
	total    int64
	// Memory per replica, sampled for MemWindow after the start, and the
	// nodes each replica owned at its end (the memory follows the share).
	peakRSS, heapInuse, owned []float64
	// anonRSS is the highest sampled RssAnon: the resident set without the
	// binary's mapped pages, which every process pays whatever its share.
	anonRSS []float64
	// settledWrites are the replicas' API writes per second by verb (their
	// client-side count, cce_ipam_kube_api_requests_total) over the memory
	// window, when nothing in the cluster changes (issue #25 item 5).
	settledWrites map[string]float64
	// settledCPU is each replica's CPU (cores: CPU-seconds per second, from
	// process_cpu_seconds_total) over the same window.
	settledCPU []float64
}

// idleReplica is the memory of a replica that serves no node (the cluster
// has none yet): the fixed cost every replica pays whatever its share
// (issue #25 item 7).
type idleReplica struct {
	peakRSS, anonRSS, heapInuse float64
	after                       time.Duration // since the replica was ready
}

// measureIdle reads replica 0's memory before the run adds any node.
func (e *env) measureIdle(ctx context.Context) (*idleReplica, error) {
	r := e.f.Replica(0)
	if r == nil || !r.Running() {
		return nil, errors.New("replica 0 does not run")
	}
	if err := r.WaitReady(ctx); err != nil {
		return nil, err
	}
	const settle = 10 * time.Second // informers synced, first renewals done
	sleep(ctx, settle)
	heap, err := r.Metric(ctx, "go_memstats_heap_inuse_bytes", nil)
	if err != nil {
		return nil, err
	}
	hwm, _, anon := procMem(r.PID())
	return &idleReplica{peakRSS: hwm, anonRSS: anon, heapInuse: heap, after: settle}, nil
}

// writeVerbs are the HTTP methods that change state at the API server.
var writeVerbs = []string{"POST", "PUT", "PATCH", "DELETE"}

// replicaCounters reads, in one scrape per running replica, their API
// requests of each write verb (summed over replicas) and each one's
// process_cpu_seconds_total by replica index (a replica whose scrape fails
// is left out of both, one without the series out of cpu).
func (e *env) replicaCounters(ctx context.Context) (writes map[string]float64, cpu map[int]float64) {
	writes, cpu = map[string]float64{}, map[int]float64{}
	for _, r := range e.running() {
		ss, err := r.Metrics(ctx)
		if err != nil {
			continue
		}
		for _, v := range writeVerbs {
			n, _ := ss.Sum("cce_ipam_kube_api_requests_total", map[string]string{"verb": v})
			writes[v] += n
		}
		if v, ok := ss.Sum("process_cpu_seconds_total", nil); ok {
			cpu[r.Index()] = v
		}
	}
	return writes, cpu
}

// settledWritesPerSec is the total of c.settledWrites.
func (c coldStart) settledWritesPerSec() float64 {
	sum := 0.0
	for _, v := range c.settledWrites {
		sum += v
	}
	return sum
}

// scaleResult is items 3, 4 and 6 for one cluster size.
type scaleResult struct {
	scale       Scale
	nodes, pods int
	enis        int
	fillTook    time.Duration
	fillLost    int64
	cold        []coldStart // alternating scale.sharded(), 1, scale.sharded(), 1, ...
}

func (s *scaleResult) of(replicas int) []coldStart {
	var out []coldStart
	for _, c := range s.cold {
		if c.replicas == replicas {
			out = append(out, c)
		}
	}
	return out
}

// fillOpLimits are the per-operation limits while the bench fills a cluster.
const fillOpLimits = "BatchAddPrivateIP=100:100,BatchDeletePrivateIP=100:100,CreateENI=50:50,AttachENI=50:50," +
	"DescribeSubnet=20:20,GetInstance=20:20,ListENIs=1:1,ListSubnets=1:1,DeleteENI=5:5"

// steadyArgs are the product's default periods for the background loops,
// so that a cold start's BCE calls are the start's and not the fleet's
// test-speed ENI syncs.
var steadyArgs = []string{"--eni-sync-period", "20s", "--subnet-sync-period", "15s", "--gc-period", "2m"}

// runScale grows the cluster to s (nodes, then pods, through the IPAM),
// then cold-starts s.sharded() replicas and 1 replica on it, ColdRepeats
// times each.
func (e *env) runScale(ctx context.Context, s Scale, filled map[string]bool) (*scaleResult, error) {
	p := e.cfg.Profile
	res := &scaleResult{scale: s}
	if missing := s.Nodes - len(e.f.Nodes()); missing > 0 {
		e.log.Info("registering nodes", "count", missing)
		if _, err := e.addNodes(ctx, missing); err != nil {
			return nil, err
		}
	}
	// Fill: a generous budget and no bce-sim limits, so it goes fast.
	// The per-operation limits too (the upstream table allows 5
	// BatchAddPrivateIP/s, which alone would make the fill take minutes per
	// thousand nodes); ListENIs keeps its 1/s.
	e.setPhaseArgs("--bce-rate", "400", "--bce-burst", "200", "--bce-op-limits", fillOpLimits)
	if err := e.restartAll(ctx, s.sharded()); err != nil {
		return nil, err
	}
	if err := e.simLimits(ctx, false); err != nil {
		return nil, err
	}
	start := time.Now()
	lost, err := e.fill(ctx, s.PodsPerNode, filled)
	res.fillTook, res.fillLost = time.Since(start), lost
	if err != nil {
		return nil, err
	}
	if err := e.simLimits(ctx, true); err != nil {
		return nil, err
	}
	e.setPhaseArgs(steadyArgs...)
	defer e.setPhaseArgs()
	res.nodes = len(e.f.Nodes())
	for range filled {
		res.pods += s.PodsPerNode
	}
	// Counted from bce-sim's world (its admin API): a ListENIs here would
	// compete with the replicas' for the operation's 1/s and be counted as
	// one of their BCE calls (a 3,000-node run failed on its 429).
	world, err := e.f.SimWorld(ctx)
	if err != nil {
		return nil, err
	}
	for _, eni := range world.ENIs {
		if eni.VPCID == e.f.VPCID {
			res.enis++
		}
	}
	sleep(ctx, 10*time.Second) // pools settle after the fill

	for rep := range p.ColdRepeats {
		for _, n := range []int{s.sharded(), 1} {
			c, err := e.coldStart(ctx, n)
			if err != nil {
				return nil, err
			}
			res.cold = append(res.cold, c)
			e.log.Info("cold start", "scale", s.String(), "repeat", rep+1, "replicas", n, "took_s", c.took.Seconds(),
				"bce_calls", c.total, "list_enis", c.calls[bcesim.OpListENIs],
				"peak_rss_mib", report.Max(c.peakRSS)/(1<<20), "heap_inuse_mib", report.Max(c.heapInuse)/(1<<20))
		}
	}
	// Leave three replicas running for what follows.
	return res, e.restartAll(ctx, 3)
}

// restartAll terminates every running replica and starts the first n of
// replicas 0, 1, 2 again (concurrently), waiting until they settle.
func (e *env) restartAll(ctx context.Context, n int) error {
	if err := e.stopAll(); err != nil {
		return err
	}
	return e.startN(ctx, n)
}

func (e *env) stopAll() error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, r := range e.running() {
		wg.Go(func() {
			if err := r.Terminate(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// startN starts replicas 0..n-1 at once and waits until every node is
// served. (The stopped ones stay in the join lists: joining them fails,
// harmlessly.)
func (e *env) startN(ctx context.Context, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		r := e.f.Replica(i)
		if r == nil { // a partial run (--items) has not made it yet
			wg.Go(func() { _, errs[i] = e.f.AddReplica(ctx) })
			continue
		}
		wg.Go(func() { errs[i] = r.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err := e.settle(ctx, len(e.f.Nodes()), 10*time.Minute)
	return err
}

// coldStart stops every replica, starts n fresh ones and measures the time
// and BCE calls until every node is served, then samples their memory.
func (e *env) coldStart(ctx context.Context, n int) (coldStart, error) {
	c := coldStart{
		replicas: n,
		calls:    map[bcesim.Op]int64{},
	}
	if err := e.stopAll(); err != nil {
		return c, err
	}
	sleep(ctx, 2*time.Second)
	before, err := e.f.SimStats(ctx)
	if err != nil {
		return c, err
	}
	start := time.Now()
	if err := e.startN(ctx, n); err != nil {
		return c, err
	}
	c.took = time.Since(start)
	after, err := e.f.SimStats(ctx)
	if err != nil {
		return c, err
	}
	for op, st := range after.Ops {
		if d := st.Calls - before.Ops[op].Calls; d > 0 {
			c.calls[op] = d
			c.total += d
		}
	}
	from := time.Now()
	w0, cpu0 := e.replicaCounters(ctx)
	sleep(ctx, e.cfg.Profile.MemWindow)
	w1, cpu1 := e.replicaCounters(ctx)
	secs := time.Since(from).Seconds()
	for idx, c1 := range cpu1 {
		if c0, ok := cpu0[idx]; ok {
			c.settledCPU = append(c.settledCPU, (c1-c0)/secs)
		}
	}
	c.settledWrites = map[string]float64{}
	for _, v := range writeVerbs {
		if d := w1[v] - w0[v]; d > 0 {
			c.settledWrites[v] = d / secs
		}
	}
	peak := map[int]float64{}
	heap := map[int]float64{}
	anon := map[int]float64{}
	owned := map[int]float64{}
	ownedAt := map[int]time.Time{}
	for _, sm := range e.smp.window(start, time.Now()) {
		peak[sm.replica] = max(peak[sm.replica], sm.hwm)
		anon[sm.replica] = max(anon[sm.replica], sm.rssAnon)
		if !sm.at.Before(from) {
			heap[sm.replica] = max(heap[sm.replica], sm.heapInuse)
		}
		if !sm.down && !sm.at.Before(ownedAt[sm.replica]) {
			owned[sm.replica], ownedAt[sm.replica] = sm.owned, sm.at
		}
	}
	e.saveHeapProfiles(ctx, n)
	for _, r := range e.running() {
		// One last reading, in case the window was short.
		hwm, _, rssAnon := procMem(r.PID())
		c.peakRSS = append(c.peakRSS, max(peak[r.Index()], hwm))
		c.anonRSS = append(c.anonRSS, max(anon[r.Index()], rssAnon))
		c.heapInuse = append(c.heapInuse, heap[r.Index()])
		c.owned = append(c.owned, owned[r.Index()])
	}
	return c, ctx.Err()
}

// fill gives every node not yet filled perNode Running pods, through the
// IPAM (create, ADD at a random replica, status with the IP).
func (e *env) fill(ctx context.Context, perNode int, filled map[string]bool) (int64, error) {
	var todo []string
	for _, n := range e.f.Nodes() {
		if !filled[n] {
			todo = append(todo, n)
		}
	}
	e.log.Info("filling nodes", "nodes", len(todo), "pods", len(todo)*perNode)
	target := e.randomTarget()
	var lost, done atomic.Int64
	pods := make([]pod, 0, len(todo)*perNode)
	for k := range perNode {
		for _, n := range todo {
			pods = append(pods, pod{
				name: fmt.Sprintf("fill-%s-%d", n, k),
				node: n,
			})
		}
	}
	stopLog := make(chan struct{})
	var logWG sync.WaitGroup
	logWG.Go(func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopLog:
				return
			case <-t.C:
				e.log.Info("fill progress", "done", done.Load(), "of", len(pods))
			}
		}
	})
	err := parallel(ctx, len(pods), 24, func(ctx context.Context, i int) error {
		pd := pods[i]
		if err := retry(ctx, time.Minute, func() error { return e.drv.createPod(ctx, pd) }); err != nil {
			return err
		}
		ip, err := e.drv.allocateRetry(ctx, target, pd, e.drv.containerID(), 3*time.Minute)
		if err != nil {
			// Counted, not fatal: the report gives the count; the log says why.
			e.log.Warn("fill: a pod got no IP", "pod", pd.name, "node", pd.node, "err", err)
			lost.Add(1)
			return nil
		}
		done.Add(1)
		return e.drv.setRunning(ctx, pd, ip)
	})
	close(stopLog)
	logWG.Wait()
	for _, n := range todo {
		filled[n] = true
	}
	return lost.Load(), err
}

// saveHeapProfiles keeps every running replica's heap profile in the work
// directory, to tell what a replica's memory is made of
// (go tool pprof -sample_index=inuse_space <file>). Failures only log.
func (e *env) saveHeapProfiles(ctx context.Context, replicas int) {
	dir := filepath.Join(e.cfg.WorkDir, "heap")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.log.Warn("heap profiles not saved", "err", err)
		return
	}
	stamp := time.Now().UTC().Format("150405")
	for _, r := range e.running() {
		file := filepath.Join(dir, fmt.Sprintf("%dn-%drep-r%d-%s.pb.gz", len(e.f.Nodes()), replicas, r.Index(), stamp))
		if err := fetchToFile(ctx, "http://"+r.MetricsAddr()+"/debug/pprof/heap", file); err != nil {
			e.log.Warn("heap profile not saved", "replica", r.Index(), "err", err)
		}
	}
}

func fetchToFile(ctx context.Context, url, file string) error {
	return get(ctx, url, 30*time.Second, func(body io.Reader) error {
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
}
