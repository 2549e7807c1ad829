package bench

import (
	"bufio"
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cce-ipam/sharded/e2e/fleet"
)

// sample is one scrape of one replica.
type sample struct {
	at      time.Time
	replica int
	// From /metrics.
	owned, budgetRate, budgetBurst, failEvents, heapInuse, rss float64
	// From /proc/<pid>/status: peak and current resident set, and the
	// current anonymous part of it (without the binary's mapped pages), bytes.
	hwm, vmRSS, rssAnon float64
	// down: the replica's process was not running.
	down bool
}

// sampler scrapes every running replica's /metrics (and /proc) at a fixed
// interval for the whole run, so each item can read back the series of its
// window.
type sampler struct {
	f        *fleet.Fleet
	interval time.Duration

	mu      sync.Mutex
	samples []sample

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newSampler(f *fleet.Fleet, interval time.Duration) *sampler {
	return &sampler{
		f:        f,
		interval: interval,
	}
}

func (s *sampler) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Go(func() {
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.scrapeAll(ctx)
		}
	})
}

func (s *sampler) stop() {
	if s.cancel != nil {
		s.cancel()
		s.wg.Wait()
	}
}

func (s *sampler) scrapeAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range s.f.Replicas() {
		if !r.Running() {
			// A stopped replica serves nothing: plots drop to zero.
			s.mu.Lock()
			s.samples = append(s.samples, sample{
				at:      time.Now(),
				replica: r.Index(),
				down:    true,
			})
			s.mu.Unlock()
			continue
		}
		wg.Go(func() {
			if sm, ok := scrape(ctx, r); ok {
				s.mu.Lock()
				s.samples = append(s.samples, sm)
				s.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// scrape reads one replica now.
func scrape(ctx context.Context, r *fleet.Replica) (sample, bool) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	at := time.Now()
	ss, err := r.Metrics(ctx)
	if err != nil {
		return sample{}, false
	}
	get := func(name string, labels map[string]string) float64 {
		v, _ := ss.Sum(name, labels)
		return v
	}
	sm := sample{at: at, replica: r.Index(),
		owned:       get("cce_ipam_shard_owned_nodes", nil),
		budgetRate:  get("cce_ipam_shard_budget_rate", nil),
		budgetBurst: get("cce_ipam_shard_budget_burst", nil),
		failEvents:  get("cce_ipam_membership_events_total", map[string]string{"type": "fail"}),
		heapInuse:   get("go_memstats_heap_inuse_bytes", nil),
		rss:         get("process_resident_memory_bytes", nil),
	}
	sm.hwm, sm.vmRSS, sm.rssAnon = procMem(r.PID())
	return sm, true
}

// procMem reads VmHWM, VmRSS and RssAnon of pid in bytes (0 when unreadable).
func procMem(pid int) (hwm, rss, anon float64) {
	if pid == 0 {
		return 0, 0, 0
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *float64
		switch k {
		case "VmHWM":
			dst = &hwm
		case "VmRSS":
			dst = &rss
		case "RssAnon":
			dst = &anon
		default:
			continue
		}
		if fs := strings.Fields(v); len(fs) > 0 {
			kb, _ := strconv.ParseFloat(fs[0], 64)
			*dst = kb * 1024
		}
	}
	return hwm, rss, anon
}

// window returns the samples taken in [from, to].
func (s *sampler) window(from, to time.Time) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sample
	for _, sm := range s.samples {
		if !sm.at.Before(from) && !sm.at.After(to) {
			out = append(out, sm)
		}
	}
	return out
}

func newRand() *rand.Rand { return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())) }
