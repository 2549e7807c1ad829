package ipclaim

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Results of a Reserve, the values of the result label.
const (
	// resultCreated: the claim did not exist; it was created held.
	resultCreated = "created"
	// resultReused: a free claim was taken over (compare-and-swap).
	resultReused = "reused"
	// resultHeld: the holder held it already (a retried ADD, a Fixed pod's
	// next incarnation).
	resultHeld = "held"
	// resultTaken: held by another pod, cooling, blocked or corrupt; or a
	// race lost twice.
	resultTaken = "taken"
	// resultError: the API server failed the request.
	resultError = "error"
)

// ledgerMetrics are the Ledger's counters.
type ledgerMetrics struct {
	reserves  *prometheus.CounterVec
	lostRaces prometheus.Counter
	frees     *prometheus.CounterVec
	picks     *prometheus.CounterVec
}

func newLedgerMetrics(reg prometheus.Registerer) *ledgerMetrics {
	f := promauto.With(reg)
	m := &ledgerMetrics{
		reserves: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_reserves_total",
			Help: "Reservations of exclusive-subnet addresses, by result: created, reused (a free claim taken over), " +
				"held (already the caller's), taken (someone else's, cooling, blocked or corrupt), error.",
		}, []string{"result"}),
		lostRaces: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_lost_races_total",
			Help: "Addresses a pick believed free (from its cache) but another replica had taken: one request each.",
		}),
		frees: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_frees_total",
			Help: "Claims let go by their holder, by kind: free, or block (the cloud said the address is in use elsewhere).",
		}, []string{"kind"}),
		picks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_picks_total",
			Help: "Picks of an address from a subnet's ranges, by result: ok, exhausted, contended (too many lost races), error.",
		}, []string{"result"}),
	}
	for _, r := range []string{resultCreated, resultReused, resultHeld, resultTaken, resultError} {
		m.reserves.WithLabelValues(r)
	}
	for _, k := range []string{"free", "block"} {
		m.frees.WithLabelValues(k)
	}
	for _, r := range []string{"ok", "exhausted", "contended", "error"} {
		m.picks.WithLabelValues(r)
	}
	return m
}

// keeperMetrics are the Keeper's.
type keeperMetrics struct {
	orphansFreed prometheus.Counter
	adopted      prometheus.Counter
	swept        prometheus.Counter
	conflicts    prometheus.Gauge
	corrupt      prometheus.Gauge
	passes       *prometheus.CounterVec
}

func newKeeperMetrics(reg prometheus.Registerer) *keeperMetrics {
	f := promauto.With(reg)
	m := &keeperMetrics{
		orphansFreed: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_orphans_freed_total",
			Help: "Held claims the leader freed because their holder had no wep naming the address for the orphan grace.",
		}),
		adopted: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_adopted_total",
			Help: "Claims the leader created (or took over) for kept PSTS weps that had none (weps written by the reference).",
		}),
		swept: f.NewCounter(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_swept_total",
			Help: "Free claims the leader deleted because no PSTS lists their subnet any more.",
		}),
		conflicts: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_ipclaim_conflicts",
			Help: "Kept PSTS weps whose address is claimed by another pod, at the leader's last pass (each is a Warning event).",
		}),
		corrupt: f.NewGauge(prometheus.GaugeOpts{
			Name: "cce_ipam_ipclaim_corrupt",
			Help: "Claims the ledger cannot trust (bad name, spec.ip or holder), at the leader's last pass; nobody takes them.",
		}),
		passes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "cce_ipam_ipclaim_keeper_passes_total",
			Help: "Passes of the leader's claim keeper, by result: ok, or error (some request failed; the next pass retries).",
		}, []string{"result"}),
	}
	m.passes.WithLabelValues("ok")
	m.passes.WithLabelValues("error")
	return m
}
