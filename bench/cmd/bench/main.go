// Command bench runs the cce-ipam benchmark (package bench) and writes its report
// and plots:
//
//	go run ./bench/cmd/bench --profile short   # make bench
//	go run ./bench/cmd/bench --profile long    # make bench-long
//
// Logs of every process stay in --work-dir (a temporary directory by
// default, printed at the end).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cce-ipam/sharded/bench"
)

func main() {
	profile := flag.String("profile", "short", "profile: smoke, short or long")
	binDir := flag.String("bin-dir", "bin", "directory with cce-ipam, bce-sim, etcd and kube-apiserver")
	out := flag.String("out", "", "output directory (default bench/results/<today>)")
	workDir := flag.String("work-dir", "", "directory for the processes' logs (default: a new temporary directory)")
	items := flag.String("items", "",
		"comma-separated items to run: latency, psts, failover, budget, scale, apicost, scaleout, burst "+
			"(default all; the report then says it is partial)")
	baselineRev := flag.String("baseline-rev", bench.DefaultBaselineRev,
		"git revision whose cce-ipam item 8 (apicost) measures as \"before\" (CPU and allocations per call); built into the work dir")
	scales := flag.String("scales", "",
		"comma-separated node counts for items 3, 4 and 6, overriding the profile's (pods per node stay the profile's)")
	podsPerNode := flag.Int("pods-per-node", 0,
		"pods per node for items 3, 4 and 6, for every scale (0: the profile's)")
	scaleReplicas := flag.Int("scale-replicas", 0,
		"replicas cold-started beside one replica in items 4 and 6, for every scale (0: the profile's, 3 unless it says)")
	coldRepeats := flag.Int("cold-repeats", 0, "cold starts per size and replica count, overriding the profile's (0: the profile's)")
	noPolicy := flag.Bool("no-fencing-policy", false,
		"run without the chart's wep fencing policy (replicas as the admin), to measure what the policy costs")
	seatsRO := flag.Int("apiserver-max-requests-inflight", bench.DefaultAPIServerSeats.ReadOnly,
		"kube-apiserver's --max-requests-inflight (0: its default, 400); with the next flag, the seats API Priority and Fairness divides")
	seatsMut := flag.Int("apiserver-max-mutating-requests-inflight", bench.DefaultAPIServerSeats.Mutating,
		"kube-apiserver's --max-mutating-requests-inflight (0: its default, 200)")
	replicaArgs := flag.String("replica-args", "",
		"extra flags for every replica, space-separated, appended after the bench's own (a later flag wins), "+
			"e.g. \"--shard-lease-duration=3s --shard-renew-deadline=2s\"; the report names them")
	flag.Parse()
	if *seatsRO < 0 || *seatsMut < 0 {
		fmt.Fprintln(os.Stderr, "bench: --apiserver-max-requests-inflight and --apiserver-max-mutating-requests-inflight must be >= 0")
		os.Exit(2)
	}
	seats := bench.APIServerSeats{ReadOnly: *seatsRO, Mutating: *seatsMut}
	var only []string
	if *items != "" {
		only = strings.Split(*items, ",")
	}
	if err := bench.CheckItems(only); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	p, ok := bench.Profiles[*profile]
	if !ok {
		fmt.Fprintf(os.Stderr, "bench: unknown profile %q\n", *profile)
		os.Exit(2)
	}
	if err := applyScaleFlags(&p, *scales, *podsPerNode, *scaleReplicas); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if *coldRepeats > 0 {
		p.ColdRepeats = *coldRepeats
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := run(p, only, *binDir, *out, *workDir, *noPolicy, *baselineRev, seats, strings.Fields(*replicaArgs), log); err != nil {
		log.Error("bench failed", "err", err)
		if errors.Is(err, bench.ErrInvariant) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

// applyScaleFlags applies --scales, --pods-per-node and --scale-replicas to
// the profile's scales (a copy: the profiles stay as defined).
func applyScaleFlags(p *bench.Profile, scales string, podsPerNode, scaleReplicas int) error {
	if podsPerNode < 0 || scaleReplicas < 0 {
		return errors.New("--pods-per-node and --scale-replicas must be >= 0")
	}
	if scales != "" {
		per := p.Scales[0].PodsPerNode
		p.Scales = nil
		for _, f := range strings.Split(scales, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				return fmt.Errorf("--scales: %q is not a node count", f)
			}
			p.Scales = append(p.Scales, bench.Scale{Nodes: n, PodsPerNode: per})
		}
	}
	p.Scales = slices.Clone(p.Scales)
	for i := range p.Scales {
		if podsPerNode > 0 {
			p.Scales[i].PodsPerNode = podsPerNode
		}
		if scaleReplicas > 0 {
			p.Scales[i].Replicas = scaleReplicas
		}
	}
	return nil
}

func run(p bench.Profile, only []string, binDir, out, workDir string, noPolicy bool, baselineRev string,
	seats bench.APIServerSeats, replicaArgs []string, log *slog.Logger) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if binDir, err = filepath.Abs(binDir); err != nil {
		return err
	}
	if out == "" {
		out = filepath.Join("bench", "results", time.Now().Format("2006-01-02"))
	}
	if workDir == "" {
		if workDir, err = os.MkdirTemp("", "cce-ipam-bench-"); err != nil {
			return err
		}
	}
	name := "report.md"
	if p.Name != "short" {
		name = "report-" + p.Name + ".md"
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd := "go run ./bench/cmd/bench " + strings.Join(os.Args[1:], " ")
	if m := os.Getenv("BENCH_COMMAND"); m != "" {
		cmd = m
		// make exports a command-line BENCH_ARGS: the report names the
		// exact command, a partial run's selection included.
		if a := os.Getenv("BENCH_ARGS"); a != "" {
			cmd += " BENCH_ARGS=" + strconv.Quote(a)
		}
	}
	log.Info("bench", "profile", p.Name, "out", out, "logs", workDir)
	err = bench.Run(ctx, bench.Config{
		Profile:         p,
		BinDir:          binDir,
		RepoRoot:        root,
		WorkDir:         workDir,
		OutDir:          out,
		ReportName:      name,
		Items:           only,
		Command:         cmd,
		NoFencingPolicy: noPolicy,
		BaselineRev:     baselineRev,
		APIServerSeats:  seats,
		ReplicaArgs:     replicaArgs,
		Logger:          log,
	})
	log.Info("report written", "file", filepath.Join(out, name), "logs", workDir)
	return err
}
