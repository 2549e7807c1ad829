package main

import (
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
	klog.SetSlogLogger(log.With("component", "client-go"))
	return log, nil
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
