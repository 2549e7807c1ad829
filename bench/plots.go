package bench

import (
	"fmt"
	"slices"
	"time"

	"github.com/cce-ipam/sharded/bench/report"
)

// e2eOwnedPlot draws each replica's owned nodes over the failover phase,
// with the kills marked.
func e2eOwnedPlot(path string, res *results) error {
	f := res.failover
	byReplica := map[int]*report.Series{}
	var ids []int
	for _, sm := range resSamples(res, f.start, f.end) {
		s := byReplica[sm.replica]
		if s == nil {
			s = &report.Series{
				Name: fmt.Sprintf("r%d", sm.replica),
				Step: true,
			}
			byReplica[sm.replica] = s
			ids = append(ids, sm.replica)
		}
		s.X = append(s.X, sm.at.Sub(f.start).Seconds())
		s.Y = append(s.Y, sm.owned)
	}
	slices.Sort(ids)
	var series []report.Series
	for _, id := range ids {
		series = append(series, *byReplica[id])
	}
	var marks []report.Mark
	for i, r := range f.repeats {
		name := ""
		if i == 0 {
			name = "SIGKILL"
		}
		marks = append(marks, report.Mark{
			Name:     name,
			X:        r.killedAt.Sub(f.start).Seconds(),
			Vertical: true,
		})
	}
	return report.Lines(path, "Owned nodes per replica during failover", "seconds", "nodes served", series, marks)
}

// budgetPlot draws the BCE calls per second at bce-sim against rate+burst.
func budgetPlot(path string, p Profile, b *budgetResult) error {
	calls := report.Series{
		Name: "BCE calls/s at bce-sim",
		Step: true,
	}
	for _, s := range b.perSecond {
		calls.X = append(calls.X, float64(s.Unix-b.start.Unix()))
		calls.Y = append(calls.Y, float64(s.Calls))
	}
	busy := report.Series{
		Name: fmt.Sprintf("one busy replica (r%d), others idle", b.busyReplica),
		Step: true,
	}
	for _, s := range b.busyPerSecond {
		busy.X = append(busy.X, float64(s.Unix-b.start.Unix()))
		busy.Y = append(busy.Y, float64(s.Calls))
	}
	marks := []report.Mark{
		{
			Name: "rate + burst",
			Y:    p.BudgetRate + float64(p.BudgetBurst),
		},
		{
			Name: "rate",
			Y:    p.BudgetRate,
		},
	}
	for _, e := range b.events {
		marks = append(marks, report.Mark{
			Name:     e.name,
			X:        e.at.Sub(b.start).Seconds(),
			Vertical: true,
		})
	}
	return report.Lines(path, "BCE calls per second against the global budget", "seconds", "calls in the second",
		[]report.Series{calls, busy}, marks)
}

// resSamples returns the run's samples taken in [from, to].
func resSamples(res *results, from, to time.Time) []sample {
	var out []sample
	for _, sm := range res.samples {
		if !sm.at.Before(from) && !sm.at.After(to) {
			out = append(out, sm)
		}
	}
	return out
}
