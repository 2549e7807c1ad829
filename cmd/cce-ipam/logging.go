package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// One log stream: our own slog handler, with client-go's klog output
// (leader election, reflectors, event recorders) routed through it, so that
// a log pipeline that parses JSON never meets a klog text line.

// Log formats of --log-format.
const (
	logFormatJSON = "json"
	logFormatText = "text"
)

// newLogger returns the process logger writing to w in the given format and
// level, and makes klog log through it.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch strings.ToLower(format) {
	case logFormatJSON:
		h = slog.NewJSONHandler(w, opts)
	case logFormatText:
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want %s or %s", format, logFormatJSON, logFormatText)
	}
	log := slog.New(h)
	// klog's records carry their own source (the client-go package); the
	// component attribute says where they came from in our stream.
	klog.SetSlogLogger(slog.New(quietCanceled{h}).With("component", "client-go"))
	return log, nil
}

// quietCanceled drops client-go's error records whose error is a canceled
// context: a replica cancels a node's pod watch on every hand-over and at
// shutdown, and client-go reports each as "Failed to watch" (and a read cut
// short as "Unexpected error when reading response body") at ERROR. A run
// of 5 replicas on 5,000 nodes logged ~10,000 such lines for stops it asked
// for. A deadline that passed is still logged.
type quietCanceled struct{ slog.Handler }

func (h quietCanceled) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		canceled := false
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" && strings.Contains(a.Value.String(), context.Canceled.Error()) {
				canceled = true
			}
			return !canceled
		})
		if canceled {
			return nil
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietCanceled) WithAttrs(as []slog.Attr) slog.Handler {
	return quietCanceled{h.Handler.WithAttrs(as)}
}

func (h quietCanceled) WithGroup(name string) slog.Handler {
	return quietCanceled{h.Handler.WithGroup(name)}
}

// buildInfo is what `--version` prints and cce_ipam_build_info carries.
type buildInfo struct {
	Version, Revision, GoVersion string
}

func currentBuild() buildInfo {
	b := buildInfo{Version: version, Revision: "unknown", GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				b.Revision = s.Value
			}
		}
	}
	return b
}

func (b buildInfo) String() string {
	return fmt.Sprintf("cce-ipam %s (revision %s, %s)", b.Version, b.Revision, b.GoVersion)
}

// registerBuildInfo exports the build as cce_ipam_build_info (value 1), so
// that dashboards can tell which version each replica runs during a rollout.
func registerBuildInfo(reg prometheus.Registerer, b buildInfo) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cce_ipam_build_info",
		Help: "The replica's build: version, VCS revision and Go version (value 1).",
		ConstLabels: prometheus.Labels{
			"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion,
		},
	})
	g.Set(1)
	reg.MustRegister(g)
}
