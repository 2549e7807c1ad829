package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/cce-ipam/sharded/e2e/fleet"
)

// baseline is the "before" binary of item 8c.
type baseline struct {
	rev, commit, bin string
}

// cpuRun is one binary's measurement in item 8c.
type cpuRun struct {
	label, commit string
	pairs         int
	wall          time.Duration
	// cpu is the replica's CPU-seconds over the pairs, idle its CPU-seconds
	// per second with no call (Leases, pool checks), measured right before.
	cpu, idle float64
	// mallocs and allocBytes are go_memstats_mallocs_total and
	// go_memstats_alloc_bytes_total over the pairs.
	mallocs, allocBytes float64
	// leftOut are the chart's flags this binary does not know (an older
	// baseline, before the flag existed): it ran without them.
	leftOut []string
}

// per1000 is the run's CPU-seconds per 1,000 ADD+DEL pairs with the idle
// rate taken out.
func (c cpuRun) per1000() float64 {
	return (c.cpu - c.idle*c.wall.Seconds()) * 1000 / float64(c.pairs)
}

// mallocsPerPair is the allocations per ADD+DEL pair.
func (c cpuRun) mallocsPerPair() float64 { return c.mallocs / float64(c.pairs) }

func (c cpuRun) bytesPerPair() float64 { return c.allocBytes / float64(c.pairs) }

// cpuResult is item 8c: before and after, measured one after the other.
type cpuResult struct {
	before, after cpuRun
	conc          int
}

// buildBaseline builds cce-ipam from Config.BaselineRev into the work
// directory: git archive of the revision, go build (the module cache and
// build cache are shared with this tree's build).
func (e *env) buildBaseline(ctx context.Context) (baseline, error) {
	rev := e.cfg.BaselineRev
	if rev == "" {
		rev = DefaultBaselineRev
	}
	b := baseline{rev: rev}
	out, err := exec.CommandContext(ctx, "git", "-C", e.cfg.RepoRoot, "rev-parse", "--short=12", rev+"^{commit}").Output()
	if err != nil {
		return b, fmt.Errorf("git rev-parse %s: %w", rev, err)
	}
	b.commit = strings.TrimSpace(string(out))
	// Built once per commit into the user's cache (a build takes minutes on
	// a loaded machine), else into the work directory.
	dir := filepath.Join(e.cfg.WorkDir, "baseline-"+b.commit)
	if c, err := os.UserCacheDir(); err == nil {
		dir = filepath.Join(c, "cce-ipam-bench", "baseline-"+b.commit)
	}
	b.bin = filepath.Join(dir, "cce-ipam")
	if _, err := os.Stat(b.bin); err == nil {
		return b, nil
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return b, err
	}
	e.log.Info("apicost: building the baseline cce-ipam", "rev", rev, "commit", b.commit, "dir", dir)
	archive := exec.CommandContext(ctx, "git", "-C", e.cfg.RepoRoot, "archive", "--format=tar", b.commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return b, err
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		return b, err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return b, fmt.Errorf("git archive %s: %w", b.commit, err)
	}
	if err := untar.Wait(); err != nil {
		return b, fmt.Errorf("untar %s: %w", b.commit, err)
	}
	// Into a temporary name first: an interrupted build leaves no binary
	// that a later run would take for a whole one.
	build := exec.CommandContext(ctx, "go", "build", "-o", b.bin+".tmp", "./cmd/cce-ipam")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return b, fmt.Errorf("go build %s: %w: %s", b.commit, err, out)
	}
	return b, os.Rename(b.bin+".tmp", b.bin)
}

// runCPU is item 8c on one replica: with the baseline's binary, then this
// tree's, the replica restarts, warms up, idles 10 s (its idle CPU rate),
// then serves one ADD per pod and their DELs at Profile.Conc; CPU-seconds
// (process_cpu_seconds_total) and allocations (go_memstats) are read from
// its /metrics before and after.
func (e *env) runCPU(ctx context.Context, pods []pod, base baseline) (*cpuResult, error) {
	res := &cpuResult{conc: e.cfg.Profile.Conc}
	head := binaryRevision(ctx, filepath.Join(e.cfg.BinDir, "cce-ipam"))
	if head == "unknown" {
		// A binary built in a git worktree carries no VCS stamp: `make
		// bench` builds bin/ from the tree first, so name the tree.
		if out, err := exec.CommandContext(ctx, "git", "-C", e.cfg.RepoRoot, "rev-parse", "--short=12", "HEAD").Output(); err == nil {
			head = "tree " + strings.TrimSpace(string(out))
		}
	}
	phase := e.currentPhaseArgs()
	for _, run := range []struct {
		into          *cpuRun
		label, commit string
		bin           string
	}{{&res.before, "before (" + base.rev + ")", base.commit, base.bin}, {&res.after, "after (bin/cce-ipam)", head, ""}} {
		if err := e.useReplicaBinary(run.bin); err != nil {
			return res, err
		}
		args, leftOut := phase, []string(nil)
		if run.bin != "" {
			known, err := knownFlags(ctx, run.bin)
			if err != nil {
				return res, fmt.Errorf("%s: %w", run.label, err)
			}
			if args, leftOut = argsKnownTo(phase, known); len(leftOut) > 0 {
				e.log.Info("apicost cpu: the chart's flags this binary does not know are left out", "binary", run.label,
					"flags", leftOut)
			}
		}
		if err := e.restartWith(ctx, args...); err != nil {
			return res, fmt.Errorf("%s: restart: %w", run.label, err)
		}
		r := e.running()[0]
		target := e.firstTarget()
		// Warm-up: connections, caches, the pools (the restart rebuilt them).
		if _, _, err := e.addDelPhases(ctx, pods[:min(len(pods), 200)], res.conc, target); err != nil {
			return res, fmt.Errorf("%s: warm-up: %w", run.label, err)
		}
		sleep(ctx, 3*time.Second)
		i0, err := procStats(ctx, r)
		if err != nil {
			return res, err
		}
		t0 := time.Now()
		sleep(ctx, 10*time.Second)
		i1, err := procStats(ctx, r)
		if err != nil {
			return res, err
		}
		idle := (i1.cpu - i0.cpu) / time.Since(t0).Seconds()
		start := time.Now()
		if _, _, err := e.addDelPhases(ctx, pods, res.conc, target); err != nil {
			return res, fmt.Errorf("%s: %w", run.label, err)
		}
		// The DELs' finishes after their answers are part of the pairs.
		if _, err := e.finishesDone(ctx, quietPoll); err != nil {
			return res, fmt.Errorf("%s: %w", run.label, err)
		}
		wall := time.Since(start)
		s1, err := procStats(ctx, r)
		if err != nil {
			return res, err
		}
		*run.into = cpuRun{label: run.label, commit: run.commit, pairs: len(pods), wall: wall, cpu: s1.cpu - i1.cpu, idle: idle,
			mallocs: s1.mallocs - i1.mallocs, allocBytes: s1.allocBytes - i1.allocBytes, leftOut: leftOut}
		e.log.Info("apicost cpu", "binary", run.label, "commit", run.commit, "cpu_s_per_1000_pairs", run.into.per1000(),
			"idle_cpu_per_s", idle, "mallocs_per_pair", run.into.mallocsPerPair(), "wall", wall)
	}
	return res, e.useReplicaBinary("")
}

// binaryRevision is the git revision a Go binary was built from
// (vcs.revision, "+dirty" when vcs.modified), from `go version -m`.
func binaryRevision(ctx context.Context, bin string) string {
	out, err := exec.CommandContext(ctx, "go", "version", "-m", bin).Output()
	if err != nil {
		return "unknown"
	}
	rev, dirty := "unknown", ""
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "build" {
			continue
		}
		k, v, _ := strings.Cut(f[1], "=")
		switch {
		case k == "vcs.revision" && len(v) >= 12:
			rev = v[:12]
		case k == "vcs.modified" && v == "true":
			dirty = "+dirty"
		}
	}
	return rev + dirty
}

// procCounters are a replica's cumulative CPU-seconds and allocations.
type procCounters struct {
	cpu, mallocs, allocBytes float64
}

func procStats(ctx context.Context, r *fleet.Replica) (procCounters, error) {
	ss, err := r.Metrics(ctx)
	if err != nil {
		return procCounters{}, err
	}
	var c procCounters
	for _, m := range []struct {
		name string
		into *float64
	}{{"process_cpu_seconds_total", &c.cpu}, {"go_memstats_mallocs_total", &c.mallocs},
		{"go_memstats_alloc_bytes_total", &c.allocBytes}} {
		v, ok := ss.Sum(m.name, nil)
		if !ok {
			return c, fmt.Errorf("replica %d exposes no %s", r.Index(), m.name)
		}
		*m.into = v
	}
	return c, nil
}

// currentPhaseArgs returns the phase flags replicas start with now.
func (e *env) currentPhaseArgs() []string {
	e.argsMu.Lock()
	defer e.argsMu.Unlock()
	return append([]string(nil), e.phaseArgs...)
}

// knownFlags are the long flags bin's --help names.
func knownFlags(ctx context.Context, bin string) (map[string]bool, error) {
	// --help may exit non-zero (pflag's ErrHelp); its text is what counts.
	out, _ := exec.CommandContext(ctx, bin, "--help").CombinedOutput()
	known := map[string]bool{}
	for _, m := range flagName.FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("%s --help names no flag: %.200s", bin, out)
	}
	return known, nil
}

var flagName = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)

// argsKnownTo keeps the flags of args that known names, with the values
// that follow them as separate arguments, and returns the others.
func argsKnownTo(args []string, known map[string]bool) (kept, left []string) {
	keep := true
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			keep = known[name]
		}
		if keep {
			kept = append(kept, a)
		} else {
			left = append(left, a)
		}
	}
	return kept, left
}
