package bench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cce-ipam/sharded/bench/report"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// burstSection is item 10: a row per burst, its summary verdict, and the
// plot of IPs assigned over time against the floor.
func (b *docBuilder) burstSection(bu *burstResult) report.Section {
	sec := report.Section{Heading: "10. Bursts: pods bound at once to one node"}
	t := report.Table{
		Caption: "10. Time until every pod of the burst had its IP, against the floor from the cloud limits and the bare wep creates",
		Header: []string{"burst", "pods", "idle at start", "free ENI slots", "all have IPs (s)", "floor (s)", "ratio", "target",
			"pod p50 ms", "pod p99 ms", "failed attempts (retried)", "BCE calls"},
	}
	var series []report.Series
	var marks []report.Mark
	for _, r := range bu.runs {
		t.Rows = append(t.Rows, []string{r.name, fmt.Sprint(r.pods), fmt.Sprint(r.idleAt0), fmt.Sprint(r.enisAt0),
			report.Num(r.all.Seconds(), 2), report.Num(r.floor.Seconds(), 2), report.Ratio(r.all.Seconds(), r.floor.Seconds()),
			r.targetText, report.Num(r.quantile(0.5), 0), report.Num(r.quantile(0.99), 0), fmt.Sprint(r.failed),
			burstCalls(r.calls)})
		verdict := "met"
		if len(r.took) < r.pods {
			verdict = fmt.Sprintf("missed: %d of %d pods got an IP", len(r.took), r.pods)
		} else if r.all > r.target {
			verdict = fmt.Sprintf("missed by %s s (%s of target)", report.Num((r.all-r.target).Seconds(), 2),
				report.Ratio(r.all.Seconds(), r.target.Seconds()))
		}
		b.addSummary(fmt.Sprintf("10%s, %d pods: until every pod has its IP", r.name[:1]+". "+r.name[3:], r.pods),
			r.targetText, fmt.Sprintf("%s s (floor %s s, %s)", report.Num(r.all.Seconds(), 2), report.Num(r.floor.Seconds(), 2),
				report.Ratio(r.all.Seconds(), r.floor.Seconds())), verdict)
		sec.Notes = append(sec.Notes, fmt.Sprintf("Floor of %s: %s.", r.name, r.floorNote))
		s := report.Series{Name: fmt.Sprintf("%s (%d pods)", r.name, r.pods), Step: true}
		for i, d := range slices.Sorted(slices.Values(r.took)) {
			s.X, s.Y = append(s.X, d.Seconds()), append(s.Y, float64(i+1))
		}
		series = append(series, s)
		marks = append(marks, report.Mark{Name: "floor, " + r.name[:1], X: r.floor.Seconds(), Vertical: true})
	}
	sec.Tables = append(sec.Tables, t)
	sec.Notes = append(sec.Notes, "Each burst: a fresh node (the small one's pool at its minimum; the large one's first ENI filled "+
		"with Running pods, then 3 s for the pool to react, as it would between pods), its pods created first, then every "+
		"ADD sent at once to the node's owner; a failed ADD is retried after 200 ms (a kubelet waits seconds: this is the "+
		"pod's best case). A pod's time runs from the burst's start to its successful ADD. BCE calls are bce-sim's "+
		"counters over the burst (every replica).")
	if len(series) > 0 {
		file := b.plot("burst")
		b.check(report.Lines(b.path(file), "IPs assigned over time in a burst", "seconds since the burst's start",
			"pods with an IP", series, marks))
		sec.Images = append(sec.Images, report.Image{Alt: "pods with an IP over time, per burst, against the floor", File: file})
	}
	return sec
}

// burstCalls lists a burst's BCE calls by operation.
func burstCalls(calls map[bcesim.Op]int64) string {
	if len(calls) == 0 {
		return "0"
	}
	var parts []string
	for _, op := range sortedOps(calls) {
		parts = append(parts, fmt.Sprintf("%s %d", op, calls[op]))
	}
	return strings.Join(parts, ", ")
}
