package kubeletsim

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Stats is a snapshot of what the simulator did, for tests and logs.
type Stats struct {
	Binds, BindErrors             int64
	Allocations, AllocationErrors int64 // AllocateIP calls that succeeded / failed
	Releases, ReleaseErrors       int64 // ReleaseIP calls that succeeded / failed
	StatusErrors                  int64 // failed pod status writes
	PodsStarted                   int64 // pods set Running
	PodsDeleted                   int64 // pods removed after their DEL
	// Sandboxes is the number of pods currently holding an IP.
	Sandboxes int
	// AllocateLatency is the duration of successful AllocateIP calls;
	// StartupLatency runs from the first time the simulator saw a pod to the
	// status write that made it Running (retries included).
	AllocateLatency Latency
	StartupLatency  Latency
	// LastAllocationError and LastReleaseError are the latest failures'
	// messages, for test logs.
	LastAllocationError, LastReleaseError string
}

// Latency summarises durations.
type Latency struct {
	Count         int
	P50, P99, Max time.Duration
}

// latencies keeps samples (at most maxSamples, then a uniform thinning).
type latencies struct {
	mu      sync.Mutex
	samples []time.Duration
	stride  int // keep every stride-th sample once full
	seen    int
}

const maxSamples = 1 << 18

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stride == 0 {
		l.stride = 1
	}
	l.seen++
	if l.seen%l.stride != 0 {
		return
	}
	if len(l.samples) == maxSamples {
		// Keep every other sample and halve the rate from now on.
		kept := l.samples[:0]
		for i := 0; i < len(l.samples); i += 2 {
			kept = append(kept, l.samples[i])
		}
		l.samples = kept
		l.stride *= 2
	}
	l.samples = append(l.samples, d)
}

func (l *latencies) summary() Latency {
	l.mu.Lock()
	s := slices.Clone(l.samples)
	seen := l.seen
	l.mu.Unlock()
	return summarize(s, seen)
}

// summarize sorts s and reads its quantiles (nearest rank).
func summarize(s []time.Duration, count int) Latency {
	if len(s) == 0 {
		return Latency{Count: count}
	}
	slices.Sort(s)
	q := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Latency{
		Count: count,
		P50:   q(0.50),
		P99:   q(0.99),
		Max:   s[len(s)-1],
	}
}

type counters struct {
	binds, bindErrors, allocs, allocErrors, releases, releaseErrors atomic.Int64
	statusErrors, started, deleted, sandboxes                       atomic.Int64
	allocLatency, startupLatency                                    latencies

	mu                       sync.Mutex
	lastAllocErr, lastRelErr string
}

func (c *counters) failed(last *string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*last = err.Error()
}

// metrics are the Prometheus view of the same counters.
type metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	binds    *prometheus.CounterVec
	startup  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		calls: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeletsim_cni_calls_total", Help: "CNI calls made by the simulated plugin, by method and result.",
		}, []string{"method", "result"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kubeletsim_cni_call_duration_seconds", Help: "Duration of CNI calls, by method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"method"}),
		binds: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeletsim_binds_total", Help: "Pod bindings to simulated nodes, by result.",
		}, []string{"result"}),
		startup: f.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeletsim_pod_startup_seconds", Help: "Time from first sight of a pod to its Running status.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}),
	}
}
