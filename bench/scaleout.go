package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cce-ipam/sharded/bench/report"
	"github.com/cce-ipam/sharded/e2e/fleet"
)

// Item 9, scale-out (issue #25 item 1): what sharding buys when each
// replica has the same small CPU share, as in a cluster where a replica is
// one pod among many with a CPU limit. N replicas, each in a CPU cgroup
// capped at each of Profile.ScaleOutCPUs in turn; the API server, etcd and this driver are
// not capped. Each N runs waves of warm ADDs, then their DELs, with
// ScaleOutConc calls in flight per replica, each call sent to the node's
// owner (no forwarding hop: the hop is item 1's and #25 item 4's), and
// reads the rate served with every worker busy (phase.steadyRates' reading
// from starts: a wave is short, its fill and drain would dominate).
//
// The target: throughput(N) ≥ 0.8·N·throughput(1) until the API server
// saturates. What saturates is read from the CPU each process used in the
// waves (/proc/<pid>/stat) and the machine's busy cores (/proc/stat).

// scaleOutRun is one N's measurements.
type scaleOutRun struct {
	replicas int
	// nodesEach is how many of the measured nodes each replica served.
	nodesEach []int
	// addRates and delRates are each wave's steady calls per second.
	addRates, delRates []float64
	add, del           phase // every wave's calls, merged
	// pairs is how many ADD+DEL pairs the waves made, in waveSecs.
	pairs    int
	waveSecs float64
	// cpu is the CPU-seconds per second each process used over the waves:
	// "r<i>" per replica, "kube-apiserver", "etcd", "bench" (this driver).
	cpu map[string]float64
	// busy is the machine's busy cores over the waves (of machineCores).
	busy, machineCores float64
	// throttled is the replicas' summed cgroup throttled time per second
	// of the waves: how long their quota held them off the CPU.
	throttled float64
	errors    int
}

// replicaCPUPerPair is the CPU the replicas spent per ADD+DEL pair, ms.
func (r scaleOutRun) replicaCPUPerPair() float64 {
	if r.pairs == 0 {
		return math.NaN()
	}
	sum := 0.0
	for name, c := range r.cpu {
		if strings.HasPrefix(name, "r") {
			sum += c
		}
	}
	return sum * r.waveSecs / float64(r.pairs) * 1000
}

// scaleOutQuota is one CPU quota's runs, one per replica count.
type scaleOutQuota struct {
	cpus float64
	runs []scaleOutRun
}

// scaleOutResult is item 9.
type scaleOutResult struct {
	cgroup string // where the quotas were set ("cgroup v1 cpu", ...)
	quotas []scaleOutQuota
}

// runScaleOut is item 9 on nodes, for each quota of the profile: the
// largest N first, then one replica fewer at a time (a graceful leave: its
// nodes go to the others).
func (e *env) runScaleOut(ctx context.Context, nodes []string) (_ *scaleOutResult, err error) {
	p := e.cfg.Profile
	ns := slices.Clone(p.ScaleOutReplicas)
	slices.Sort(ns)
	slices.Reverse(ns)
	if len(ns) == 0 || ns[len(ns)-1] < 1 || len(p.ScaleOutCPUs) == 0 {
		return nil, errors.New("profile has no replica counts or CPU quotas for the scale-out")
	}
	res := &scaleOutResult{}
	pods, err := e.drv.createPods(ctx, "so", nodes, p.LatPerNode, 16)
	if err != nil {
		return nil, fmt.Errorf("create scale-out pods: %w", err)
	}
	defer func() { _ = e.drv.deletePods(context.WithoutCancel(ctx), pods, 16) }()
	for _, cpus := range p.ScaleOutCPUs {
		q, err := e.scaleOutQuota(ctx, cpus, ns, pods, nodes, res)
		res.quotas = append(res.quotas, q)
		if err != nil {
			return res, fmt.Errorf("%s CPU per replica: %w", report.Num(cpus, 2), err)
		}
	}
	return res, nil
}

// scaleOutQuota runs every N of ns (descending) with each replica capped at
// cpus; the cgroups are gone when it returns.
func (e *env) scaleOutQuota(ctx context.Context, cpus float64, ns []int, pods []pod, nodes []string,
	res *scaleOutResult) (q scaleOutQuota, err error) {
	q.cpus = cpus
	caps, err := newCPUCaps(cpus)
	if err != nil {
		return q, fmt.Errorf("CPU quotas per replica: %w", err)
	}
	defer func() { err = errors.Join(err, caps.close()) }()
	res.cgroup = caps.kind
	if err := e.atLeastReplicas(ctx, ns[0]); err != nil {
		return q, err
	}
	for _, n := range ns {
		for len(e.running()) > n {
			run := e.running()
			last := run[len(run)-1]
			e.log.Info("scale-out: a replica leaves", "replica", last.Index())
			if err := last.Remove(); err != nil {
				return q, fmt.Errorf("remove replica %d: %w", last.Index(), err)
			}
			if _, err := e.settle(ctx, len(e.f.Nodes()), 3*time.Minute); err != nil {
				return q, err
			}
		}
		run, err := e.scaleOutAt(ctx, caps, pods, nodes)
		if err != nil {
			return q, fmt.Errorf("%d replicas: %w", n, err)
		}
		q.runs = append(q.runs, run)
	}
	return q, nil
}

// scaleOutAt measures the running replicas: every one capped, a warm-up
// wave, then Profile.ScaleOutWaves waves, the CPU read around each wave (not
// the pauses between them, which let released addresses cool).
func (e *env) scaleOutAt(ctx context.Context, caps *cpuCaps, pods []pod, nodes []string) (scaleOutRun, error) {
	p := e.cfg.Profile
	live := e.running()
	run := scaleOutRun{replicas: len(live), cpu: map[string]float64{}}
	for _, r := range live {
		if err := caps.place(r.Index(), r.PID()); err != nil {
			return run, err
		}
	}
	to, err := e.ownerTarget(ctx, live, nodes)
	if err != nil {
		return run, err
	}
	perAddr := map[string]int{}
	for _, n := range nodes {
		perAddr[to(pod{node: n})]++
	}
	for _, r := range live {
		run.nodesEach = append(run.nodesEach, perAddr[r.GRPCAddr()])
	}
	conc := p.ScaleOutConc * len(live)
	settleWarm := func() { sleep(ctx, 3*time.Second) } // cooling (1s) + pool check
	if _, _, err := e.addDelPhasesTo(ctx, pods, conc, to); err != nil {
		return run, fmt.Errorf("warm-up wave: %w", err)
	}
	procs := e.scaleOutProcs(live)
	ticks := map[string]float64{}
	var busy, total, thr float64
	var waveTime time.Duration
	for w := range p.ScaleOutWaves {
		settleWarm()
		t0, m0, thr0 := cpuTicks(procs), machineBusy(), caps.throttled()
		start := time.Now()
		add, del, err := e.addDelPhasesTo(ctx, pods, conc, to)
		waveTime += time.Since(start)
		t1, m1, thr1 := cpuTicks(procs), machineBusy(), caps.throttled()
		if err != nil {
			return run, fmt.Errorf("wave %d: %w", w+1, err)
		}
		for name := range procs {
			ticks[name] += t1[name] - t0[name]
		}
		busy, total, thr = busy+m1.busy-m0.busy, total+m1.total-m0.total, thr+(thr1-thr0).Seconds()
		run.machineCores = m1.cores
		run.addRates = append(run.addRates, closedLoopRate(add, conc))
		run.delRates = append(run.delRates, closedLoopRate(del, conc))
		run.add.took, run.del.took = append(run.add.took, add.took...), append(run.del.took, del.took...)
		run.pairs += len(del.took)
		run.errors += add.errors + del.errors
	}
	secs := waveTime.Seconds()
	run.waveSecs = secs
	for name, t := range ticks {
		run.cpu[name] = t / clockTicks / secs
	}
	if total > 0 {
		run.busy = busy / total * run.machineCores
	}
	run.throttled = thr / secs
	e.log.Info("scale-out", "cpu_quota", caps.cpus, "replicas", run.replicas, "add_per_s", report.Median(run.addRates),
		"del_per_s", report.Median(run.delRates), "add_p99_ms", run.add.quantile(0.99), "busy_cores", run.busy,
		"throttled_s_per_s", run.throttled, "cpu", fmt.Sprint(run.cpu))
	return run, nil
}

// closedLoopRate is the calls per second p served with all conc workers
// busy: the gaps between the starts after the first conc (each one an
// earlier call's end). With too few calls for that, calls over the phase.
func closedLoopRate(p phase, conc int) float64 {
	n := len(p.starts)
	if n-1 > conc && p.starts[n-1] > p.starts[conc] {
		return float64(n-1-conc) / (p.starts[n-1] - p.starts[conc]).Seconds()
	}
	if p.elapsed > 0 {
		return float64(len(p.took)) / p.elapsed.Seconds()
	}
	return 0
}

// ownerTarget sends each pod's calls to the replica that serves its node,
// as the replicas in live see it now (they are settled).
func (e *env) ownerTarget(ctx context.Context, live []*fleet.Replica, nodes []string) (func(pod) string, error) {
	addrOf := map[string]string{}
	for _, r := range live {
		name, err := self(ctx, r)
		if err != nil {
			return nil, err
		}
		addrOf[name] = r.GRPCAddr()
	}
	holder, err := e.holders(ctx, live[0], nodes)
	if err != nil {
		return nil, err
	}
	to := map[string]string{}
	for node, h := range holder {
		a, ok := addrOf[h]
		if !ok {
			return nil, fmt.Errorf("node %s is held by %q, not a running replica", node, h)
		}
		to[node] = a
	}
	return func(p pod) string { return to[p.node] }, nil
}

// scaleOutProcs are the processes whose CPU item 9 reports, by name.
func (e *env) scaleOutProcs(live []*fleet.Replica) map[string]int {
	out := map[string]int{"bench": os.Getpid()}
	for _, r := range live {
		out[fmt.Sprintf("r%d", r.Index())] = r.PID()
	}
	for name, pid := range e.cp.PIDs() {
		if name == "kube-apiserver" || name == "etcd" {
			out[name] = pid
		}
	}
	return out
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// cpuTicks reads each process's user+system CPU time, in clock ticks.
func cpuTicks(procs map[string]int) map[string]float64 {
	out := map[string]float64{}
	for name, pid := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		if t, err := parseStatCPU(string(b)); err == nil {
			out[name] = t
		}
	}
	return out
}

// parseStatCPU returns utime+stime from a /proc/<pid>/stat line. The
// command name (field 2) is in parentheses and may hold spaces and ')', so
// the fields are counted from the last ')'.
func parseStatCPU(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// After the name: state is field 3, utime 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the name, want at least 13", len(f))
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	return u + s, nil
}

// cpuTime is /proc/stat's first line: busy and total jiffies of all cores.
type cpuTime struct{ busy, total, cores float64 }

func machineBusy() cpuTime {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTime{}
	}
	t, _ := parseProcStat(string(b))
	return t
}

// parseProcStat reads the "cpu" line (user nice system idle iowait irq
// softirq steal ...) and counts the "cpuN" lines. Busy is all but idle and
// iowait.
func parseProcStat(s string) (cpuTime, error) {
	var t cpuTime
	found := false
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "cpu":
			if len(f) < 6 {
				return t, errors.New("/proc/stat: short cpu line")
			}
			for i, x := range f[1:min(len(f), 9)] { // guest times are in user already
				v, err := strconv.ParseFloat(x, 64)
				if err != nil {
					return t, fmt.Errorf("/proc/stat: %w", err)
				}
				t.total += v
				if i != 3 && i != 4 {
					t.busy += v
				}
			}
			found = true
		case strings.HasPrefix(f[0], "cpu"):
			t.cores++
		}
	}
	if !found {
		return t, errors.New("/proc/stat: no cpu line")
	}
	return t, nil
}

// cpuCaps are the per-replica CPU cgroups of item 9: one per replica
// index, each with a quota of cpus per 100 ms period.
type cpuCaps struct {
	kind  string // how the report names the mechanism
	root  string // the directory the replicas' cgroups are made in
	v2    bool
	cpus  float64
	quota int // µs per period
	made  map[int]string
}

const cfsPeriod = 100000 // µs

// newCPUCaps finds a CPU controller this process may create cgroups under:
// cgroup v2 (a unified hierarchy with "cpu" in its controllers) or v1's
// cpu hierarchy.
func newCPUCaps(cpus float64) (*cpuCaps, error) {
	if cpus <= 0 {
		return nil, errors.New("the quota must be above 0 CPUs")
	}
	c := &cpuCaps{cpus: cpus, quota: int(cpus * cfsPeriod), made: map[int]string{}}
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
		c.kind, c.root, c.v2 = "cgroup v2 cpu.max", "/sys/fs/cgroup", true
		// The children's cpu.max needs the controller enabled for them.
		if err := os.WriteFile(filepath.Join(c.root, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
			return nil, fmt.Errorf("enable the cpu controller in %s: %w", c.root, err)
		}
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		c.kind, c.root = "cgroup v1 cpu.cfs_quota_us", "/sys/fs/cgroup/cpu"
	} else {
		return nil, errors.New("no writable CPU cgroup controller (neither cgroup v2 with cpu nor v1's cpu hierarchy)")
	}
	return c, nil
}

// place moves process pid into replica index's cgroup, made on first use.
func (c *cpuCaps) place(index, pid int) error {
	dir, ok := c.made[index]
	if !ok {
		dir = filepath.Join(c.root, fmt.Sprintf("cce-bench-%d-q%d-r%d", os.Getpid(), c.quota, index))
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("make cgroup %s: %w", dir, err)
		}
		c.made[index] = dir
		var err error
		if c.v2 {
			err = os.WriteFile(filepath.Join(dir, "cpu.max"), fmt.Appendf(nil, "%d %d", c.quota, cfsPeriod), 0)
		} else {
			err = errors.Join(os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), fmt.Appendf(nil, "%d", cfsPeriod), 0),
				os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), fmt.Appendf(nil, "%d", c.quota), 0))
		}
		if err != nil {
			return fmt.Errorf("set the quota of %s: %w", dir, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), fmt.Appendf(nil, "%d", pid), 0); err != nil {
		return fmt.Errorf("move replica %d (pid %d) into %s: %w", index, pid, dir, err)
	}
	return nil
}

// throttled sums the time the quotas held the replicas off the CPU.
func (c *cpuCaps) throttled() time.Duration {
	var sum time.Duration
	for _, dir := range c.made {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			v, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				continue
			}
			switch f[0] {
			case "throttled_usec": // v2
				sum += time.Duration(v) * time.Microsecond
			case "throttled_time": // v1, ns
				sum += time.Duration(v)
			}
		}
	}
	return sum
}

// close moves what is left in the cgroups back to the root and removes
// them: the replicas run on uncapped after the item.
func (c *cpuCaps) close() error {
	var errs []error
	for _, dir := range c.made {
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, pid := range strings.Fields(string(b)) {
				if err := os.WriteFile(filepath.Join(c.root, "cgroup.procs"), []byte(pid), 0); err != nil {
					errs = append(errs, fmt.Errorf("move pid %s out of %s: %w", pid, dir, err))
				}
			}
		}
		if err := os.Remove(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}
