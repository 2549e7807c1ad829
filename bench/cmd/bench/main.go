// Command bench runs the cce-ipam benchmark (issue #8) and writes its report
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
	flag.Parse()

	p, ok := bench.Profiles[*profile]
	if !ok {
		fmt.Fprintf(os.Stderr, "bench: unknown profile %q\n", *profile)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := run(p, *binDir, *out, *workDir, log); err != nil {
		log.Error("bench failed", "err", err)
		if errors.Is(err, bench.ErrInvariant) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

func run(p bench.Profile, binDir, out, workDir string, log *slog.Logger) error {
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
	}
	log.Info("bench", "profile", p.Name, "out", out, "logs", workDir)
	err = bench.Run(ctx, bench.Config{Profile: p, BinDir: binDir, RepoRoot: root, WorkDir: workDir,
		OutDir: out, ReportName: name, Command: cmd, Logger: log})
	log.Info("report written", "file", filepath.Join(out, name), "logs", workDir)
	return err
}
