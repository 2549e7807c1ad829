package bench

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Profile sizes a run. Short is `make bench`: its items but apicost took
// 9-12 min on two cores, apicost alone 11.5 min with three knee repeats
// (a whole short run with apicost has not been timed yet); Long is
// `make bench-long`.
type Profile struct {
	Name string

	// Item 1: LatNodes nodes, waves of LatPerNode allocations on every node
	// (at most the warm pool's IdleMin, so every call finds an idle IP),
	// Conc calls in flight; LatWaves waves per repeat, Repeats repeats.
	LatNodes, LatPerNode, LatWaves, Repeats, Conc int
	// Warm pool bounds of every replica.
	IdleMin, IdleMax int
	// The cluster-wide BCE budget (--bce-rate, --bce-burst).
	BudgetRate  float64
	BudgetBurst int

	// Item 2: FailRepeats SIGKILLs during churn by ChurnWorkers workers.
	FailRepeats, ChurnWorkers int
	// Item 5: how long replicas join and leave under load, and how long one
	// replica is busy alone.
	BudgetLoad, BusyAlone time.Duration

	// Items 3, 4, 6: cluster sizes, measured one after the other (nodes and
	// pods are added to reach the next size).
	Scales []Scale
	// ColdRepeats cold starts per size and replica count.
	ColdRepeats int
	// MemWindow is how long memory is sampled in a settled cluster.
	MemWindow time.Duration

	// Item 7: on the LatNodes nodes, waves of PSTSPerNode allocations per
	// node of each kind (ordinary warm, PSTS Elastic, PSTS Fixed), one
	// after the other; PSTSWaves waves per repeat, PSTSRepeats repeats.
	PSTSPerNode, PSTSWaves, PSTSRepeats int

	// Item 8: APICostCalls ADDs then DELs per concurrency of APICostConcs
	// (the knee), APICostKneeRepeats times each (the verdicts take the
	// median: one 100-call window lasts well under a second here, so one
	// pause moves a single sample by a third), APICostReqCalls calls per
	// kind counted at the API server.
	APICostCalls, APICostReqCalls int
	APICostConcs                  []int
	APICostKneeRepeats            int

	// Item 9 (scale-out): for each quota of ScaleOutCPUs (CPUs per
	// replica) and each replica count of ScaleOutReplicas, ScaleOutWaves
	// waves of warm ADDs (LatPerNode per node of the LatNodes) then DELs,
	// ScaleOutConc calls in flight per replica. Here one replica at 0.25
	// CPU already drives the API server to the machine's two cores, so a
	// smaller quota, where the replicas are the bottleneck, comes first.
	ScaleOutReplicas            []int
	ScaleOutCPUs                []float64
	ScaleOutConc, ScaleOutWaves int

	// Item 10 (bursts): BurstSmall pods bound at once to a node whose pool
	// is at its minimum, BurstLarge to a node whose first ENI is full.
	BurstSmall, BurstLarge int
}

// Scale is a cluster size for the memory, takeover and cold-start items.
type Scale struct {
	Nodes, PodsPerNode int
	// Replicas is the sharded configuration cold-started on the cluster
	// beside one replica alone (0: 3).
	Replicas int
}

// sharded is the replica count the cluster is cold-started with beside one
// replica.
func (s Scale) sharded() int {
	if s.Replicas > 0 {
		return s.Replicas
	}
	return 3
}

func (s Scale) String() string {
	return fmt.Sprintf("%d nodes / %d pods", s.Nodes, s.Nodes*s.PodsPerNode)
}

// Profiles by name. Short runs 5 repeats of 3 waves (1,800 ADDs per
// configuration) so that each repeat's 3-replica p99 rests on more than a
// couple of samples.
var Profiles = map[string]Profile{
	"smoke": {
		Name:         "smoke",
		LatNodes:     6,
		LatPerNode:   4,
		LatWaves:     1,
		Repeats:      1,
		Conc:         8,
		IdleMin:      4,
		IdleMax:      16,
		BudgetRate:   20,
		BudgetBurst:  10,
		FailRepeats:  1,
		ChurnWorkers: 6,
		BudgetLoad:   30 * time.Second,
		BusyAlone:    10 * time.Second,
		Scales: []Scale{{
			Nodes:       30,
			PodsPerNode: 5,
		}},
		ColdRepeats: 1,
		MemWindow:   5 * time.Second,
		PSTSPerNode: 2,
		PSTSWaves:   1,
		PSTSRepeats: 1,

		APICostCalls:       200,
		APICostReqCalls:    50,
		APICostConcs:       []int{1, 8, 32},
		APICostKneeRepeats: 1,

		ScaleOutReplicas: []int{1, 2},
		ScaleOutCPUs:     []float64{0.05, 0.25},
		ScaleOutConc:     8,
		ScaleOutWaves:    2,
		BurstSmall:       10,
		BurstLarge:       30,
	},
	"short": {
		Name:         "short",
		LatNodes:     30,
		LatPerNode:   4,
		LatWaves:     3,
		Repeats:      5,
		Conc:         8,
		IdleMin:      4,
		IdleMax:      16,
		BudgetRate:   20,
		BudgetBurst:  10,
		FailRepeats:  3,
		ChurnWorkers: 6,
		BudgetLoad:   60 * time.Second,
		BusyAlone:    20 * time.Second,
		Scales: []Scale{{
			Nodes:       300,
			PodsPerNode: 30,
		}},
		ColdRepeats: 2,
		MemWindow:   10 * time.Second,
		PSTSPerNode: 2,
		PSTSWaves:   2,
		PSTSRepeats: 2,

		APICostCalls:       1000,
		APICostReqCalls:    100,
		APICostConcs:       []int{1, 8, 32},
		APICostKneeRepeats: 3,

		ScaleOutReplicas: []int{1, 2, 3, 4},
		ScaleOutCPUs:     []float64{0.05, 0.25},
		ScaleOutConc:     8,
		ScaleOutWaves:    5,
		BurstSmall:       30,
		BurstLarge:       100,
	},
	"long": {
		Name:         "long",
		LatNodes:     60,
		LatPerNode:   4,
		LatWaves:     3,
		Repeats:      5,
		Conc:         8,
		IdleMin:      4,
		IdleMax:      16,
		BudgetRate:   20,
		BudgetBurst:  10,
		FailRepeats:  5,
		ChurnWorkers: 6,
		BudgetLoad:   90 * time.Second,
		BusyAlone:    30 * time.Second,
		Scales: []Scale{{
			Nodes:       1000,
			PodsPerNode: 30,
		}, {
			Nodes:       3000,
			PodsPerNode: 30,
		}, {
			// Issue #25 item 6: a cluster of 5,000 nodes with 5 replicas.
			Nodes:       5000,
			PodsPerNode: 30,
			Replicas:    5,
		}},
		ColdRepeats: 2,
		MemWindow:   20 * time.Second,
		PSTSPerNode: 2,
		PSTSWaves:   2,
		PSTSRepeats: 2,

		APICostCalls:       1000,
		APICostReqCalls:    100,
		APICostConcs:       []int{1, 8, 32},
		APICostKneeRepeats: 3,

		ScaleOutReplicas: []int{1, 2, 3, 4},
		ScaleOutCPUs:     []float64{0.05, 0.25},
		ScaleOutConc:     8,
		ScaleOutWaves:    8,
		BurstSmall:       30,
		BurstLarge:       100,
	},
}

// Config is one run.
type Config struct {
	Profile Profile
	// BinDir holds cce-ipam, bce-sim, etcd and kube-apiserver.
	BinDir string
	// RepoRoot is the module's root (for the CRDs).
	RepoRoot string
	// WorkDir receives the control plane's and the processes' logs.
	WorkDir string
	// OutDir receives report.md (or ReportName) and the plots.
	OutDir     string
	ReportName string
	// Items limits the run to some items ("latency", "psts", "failover",
	// "budget", "scale", "apicost", "scaleout", "burst"); empty runs them all. A partial run's report says so.
	Items []string
	// Command is the command line, quoted in the report.
	Command string
	// NoFencingPolicy runs the replicas as the admin on a control plane
	// without the chart's wep fencing policy, to measure what the policy
	// costs; by default it is installed, as in a cluster.
	NoFencingPolicy bool
	// BaselineRev is the git revision whose cce-ipam item 8 measures as
	// "before" (DefaultBaselineRev when empty).
	BaselineRev string
	// APIServerSeats sizes kube-apiserver's --max-requests-inflight and
	// --max-mutating-requests-inflight; zero leaves its defaults.
	APIServerSeats APIServerSeats
	// ReplicaArgs are flags appended to every replica's command line, after
	// the bench's own (a later flag wins): for runs that try other values,
	// named in the report.
	ReplicaArgs []string
	Logger      *slog.Logger
}

// APIServerSeats are the API server's concurrency limits, the seats that API
// Priority and Fairness divides among its priority levels (their sum).
type APIServerSeats struct {
	ReadOnly, Mutating int // 0: the API server's default (400, 200)
}

// DefaultAPIServerSeats are the API server's own defaults. Fewer seats
// (sized to a 2-core machine) were tried for item 8d and changed little:
// on two cores a LIST of 1,000 pods holds a core, not a seat, for most of
// its time, so the flood is bounded by the CPU before APF queues it.
var DefaultAPIServerSeats = APIServerSeats{}

// args are the kube-apiserver flags of s.
func (s APIServerSeats) args() []string {
	var out []string
	if s.ReadOnly > 0 {
		out = append(out, fmt.Sprintf("--max-requests-inflight=%d", s.ReadOnly))
	}
	if s.Mutating > 0 {
		out = append(out, fmt.Sprintf("--max-mutating-requests-inflight=%d", s.Mutating))
	}
	return out
}

// String is how the report names s.
func (s APIServerSeats) String() string {
	ro, mu := "400 (default)", "200 (default)"
	if s.ReadOnly > 0 {
		ro = fmt.Sprint(s.ReadOnly)
	}
	if s.Mutating > 0 {
		mu = fmt.Sprint(s.Mutating)
	}
	return fmt.Sprintf("`--max-requests-inflight` %s, `--max-mutating-requests-inflight` %s", ro, mu)
}

// Items a run can be limited to; runAll names each step's item.
var items = []string{"latency", "psts", "failover", "budget", "scale", "apicost", "scaleout", "burst"}

// CheckItems refuses unknown item names.
func CheckItems(only []string) error {
	for _, it := range only {
		if !slices.Contains(items, it) {
			return fmt.Errorf("bench: unknown item %q (want one of %s)", it, strings.Join(items, ", "))
		}
	}
	return nil
}

// runs reports whether item is part of this run.
func (c Config) runs(item string) bool {
	return len(c.Items) == 0 || slices.Contains(c.Items, item)
}
