package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cce-ipam/sharded/bench/report"
)

// apicostSection is item 8's report section.
func (b *docBuilder) apicostSection(a *apicostResult) report.Section {
	p := b.p
	s := report.Section{Heading: "8. API-server cost of a CNI call (issue #28)"}
	s.Paragraphs = append(s.Paragraphs, fmt.Sprintf(
		"The replicas run with the flags of the chart's Deployment rendered with its default values (bin/helm), less those "+
			"the fleet sets itself (identity, BCE endpoint and budget, addresses, memberlist, webhooks): `%s`; the bench's "+
			"own `--kube-api-qps 500 --kube-api-burst 1000` is left out. One change: `--idle-ip-pool-max-size=64`, so that "+
			"the IPs of a warm-up round of %d ADDs and DELs stay in the pools and every measured ADD is warm (the chart's "+
			"minimum stays). %d nodes; parts a, b, c and d run on one replica, then b again on 3 (calls at a random replica).",
		strings.Join(a.chartArgs, " "), p.APICostCalls, a.nodes))
	if r := a.requests; r != nil {
		s.Tables = append(s.Tables, b.requestsTable(r))
		s.Notes = append(s.Notes, "**8a.** Counted at the kube-apiserver: `apiserver_request_total` summed by verb and "+
			"resource, scraped before and after each kind's calls, less the background rate (measured over 10 s with no "+
			"call: "+reqLine(r.background, 0.05)+" per second) times the phase's length, divided by the calls. Totals count "+
			"the resources a CNI call may touch (weps, pods, IPClaims, IPPools, nodes, StatefulSets, PSTS, Subnets, events); "+
			"the breakdown lists every resource above 0.05 per call. Calls go to the replica serving the pods' nodes, with "+
			"the node's name (as the CNI plugin sends it).")
	}
	if len(a.knee1)+len(a.knee3) > 0 {
		rates, lat := b.kneeTables(a)
		s.Tables = append(s.Tables, rates, lat, kneeWindows(a))
		s.Notes = append(s.Notes, fmt.Sprintf("**8b.** At each concurrency, %d time(s): %d bare wep creates then as many "+
			"deletes (the floor, the bench's admin client without a client-side limit, right before ours), then one ADD per "+
			"pod (a fresh sandbox) and the DEL of each. Rates are read from when calls began: in a closed loop every "+
			"call after the first c begins when one ends, so the first %d gaps between starts after the first c, and the "+
			"last %d, are calls served with every worker busy, without the fill's fastest or the drain's slowest ends "+
			"(the ends' reading is the rates table's last column). Only successful calls are timed; "+
			"failed attempts are retried and counted. The summary takes each concurrency's median over its repeats (a "+
			"window of 100 calls lasts well under a second here: one pause moves a single sample), then the worst "+
			"concurrency.", max(1, p.APICostKneeRepeats), p.APICostCalls, min(100, p.APICostCalls/4), min(100, p.APICostCalls/4)))
	}
	if c := a.cpu; c != nil && c.after.pairs > 0 {
		s.Tables = append(s.Tables, b.cpuTable(c))
		s.Notes = append(s.Notes, fmt.Sprintf("**8c.** One replica, restarted with each binary (the same flags); a warm-up "+
			"of 200 pairs, 10 s idle (the idle CPU rate: Leases, pool checks, syncs), then one ADD per pod and each DEL "+
			"at %d in flight. CPU-seconds from the replica's `process_cpu_seconds_total` less the idle rate times the "+
			"wall time; allocations from `go_memstats_mallocs_total` and `go_memstats_alloc_bytes_total` (everything "+
			"the process allocated in the window, background included). The before binary is built from the git "+
			"revision with `go build` (`--baseline-rev`).", c.conc))
	}
	if n := a.noisy; n != nil {
		s.Tables = append(s.Tables, b.noisyTable(n))
		note := fmt.Sprintf("**8d.** The replica runs as `%s` (a TokenRequest token), as in a cluster: the fleet's own user "+
			"is in system:masters, which API Priority and Fairness exempts (and the wep fencing policy fences that user, "+
			"so in this part the wep writes are not fenced). The neighbour, another ServiceAccount without a client-side "+
			"limit, keeps %d LISTs of every pod of the cluster (%d pods at the start) in flight while %d ADDs run at %d in "+
			"flight (%d waves; each wave's DELs untimed; one untimed wave before the first condition). The neighbour "+
			"reads each answer and drops it undecoded (it stands for a client on another machine). The API server's "+
			"seats: %s. APF queues a request only when its priority level's seats are taken; it shares seats, not CPU.",
			n.identity, n.workers, n.pods, n.addsPerCondition, p.Conc, n.waves, b.cfg.APIServerSeats)
		switch {
		case n.fcMissing != "":
			note += " **The flow-control half was not measured:** " + n.fcMissing + "."
		case len(n.fcObjects) == 0:
			note += " **The flow-control half did not run:** the part stopped before it (below)."
		default:
			note += " Flow-control objects applied from the chart: " + strings.Join(n.fcObjects, ", ") + "."
		}
		if n.floodErrs+n.floodErrsFC > 0 {
			note += fmt.Sprintf(" The neighbour's other errors: %d without, %d with (last: %s %s).", n.floodErrs, n.floodErrsFC,
				n.lastFloodErr, n.lastErrsFC)
		}
		s.Notes = append(s.Notes, note)
	}
	if len(a.loads) > 0 {
		s.Notes = append(s.Notes, "Load average (1, 5, 15 min; "+fmt.Sprint(b.res.machine.Cores)+" cores) at the start of each part: "+
			strings.Join(a.loads, "; ")+".")
	}
	s.Notes = append(s.Notes, kneeNotes(a)...)
	for _, f := range a.failed {
		s.Notes = append(s.Notes, "**Part did not finish:** "+f)
	}
	return s
}

// kneeNotes say which of 8b's calls were retried (with the last error) and
// which floor deletes were not timed.
func kneeNotes(a *apicostResult) (notes []string) {
	var errs []string
	for _, runs := range [][]kneeRun{a.knee1, a.knee3} {
		for _, k := range runs {
			for _, ph := range []struct {
				what string
				p    phase
			}{{"ADD", k.add}, {"DEL", k.del}} {
				if ph.p.errors > 0 {
					errs = append(errs, fmt.Sprintf("%d replica(s), c=%d, %s: %d, last: %s", k.replicas, k.conc, ph.what,
						ph.p.errors, ph.p.lastErr))
				}
			}
		}
	}
	var skipped []string
	for _, runs := range [][]kneeRun{a.knee1, a.knee3} {
		for _, k := range runs {
			if k.floorDel.skipped > 0 {
				skipped = append(skipped, fmt.Sprintf("%d replica(s), c=%d: %d", k.replicas, k.conc, k.floorDel.skipped))
			}
		}
	}
	if len(skipped) > 0 {
		notes = append(notes, "Floor deletes not timed because the replica's GC had deleted the bare wep first (it names no "+
			"pod): "+strings.Join(skipped, "; ")+".")
	}
	if len(errs) > 0 {
		notes = append(notes, "Retried errors of 8b (each retried until it succeeded): "+strings.Join(errs, "; ")+".")
	}
	return notes
}

// requestsTable is 8a, with one summary row per kind that has a floor.
func (b *docBuilder) requestsTable(r *requestsResult) report.Table {
	t := report.Table{
		Caption: fmt.Sprintf("8a. API requests per call, counted at the kube-apiserver (%d replica)", r.replicas),
		Header:  []string{"call", "calls", "requests per call", "writes", "reads", "floor (issue #28)", "verdict", "by verb and resource"},
	}
	for _, row := range r.rows {
		all := row.total(true, true)
		verdict := "—"
		if !math.IsNaN(row.floor) {
			// Requests are whole: 0.05 per call is the counting noise
			// (a Lease renewal more or less in the phase).
			verdict = "met"
			if all > row.floor+0.05 {
				verdict = "missed by " + report.Num(all-row.floor, 2) + " requests per call"
			}
			b.addSummary("8a. API requests per "+row.kind, "≤ "+report.Num(row.floor, 0), report.Num(all, 2), verdict)
		}
		t.Rows = append(t.Rows, []string{row.kind, fmt.Sprint(row.calls), report.Num(all, 2),
			report.Num(row.total(true, false), 2), report.Num(row.total(false, true), 2), row.floorText, verdict,
			reqLine(row.perCall, 0.05)})
	}
	return t
}

// reqLine lists the keys of c whose |value| ≥ min, "post workloadendpoints
// 1.00, get pods 0.01".
func reqLine(c reqCounts, least float64) string {
	var parts []string
	for _, k := range c.keys() {
		if v := c[k]; math.Abs(v) >= least && k.resource != "" {
			parts = append(parts, k.String()+" "+report.Num(v, 2))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// kneeTables are 8b: the rates of the first and last calls, and the
// latencies against the floor, a row per repeat; summary rows take, per
// concurrency, the median over its repeats, then the worst concurrency.
func (b *docBuilder) kneeTables(a *apicostResult) (rates, lat report.Table) {
	rates = report.Table{
		Caption: "8b. No knee: calls per second of the first and the last 100 calls served with every worker busy, " +
			"read from when calls began (want last ≥ 0.9× first); the last column reads the same from when calls ended, " +
			"which counts the fill's fastest and the drain's slowest calls",
		Header: []string{"replicas", "in flight", "repeat", "ADD first/s", "ADD last/s", "last/first", "DEL first/s", "DEL last/s",
			"last/first", "floor creates/s (its last/first)", "floor deletes/s (its last/first)", "retried errors (ADD, DEL)",
			"by ends: ADD, DEL last/first"},
	}
	lat = report.Table{
		Caption: "8b. Latency against the bare wep create / delete at the same concurrency (want DEL p50 ≤ 1.2× ADD p50, p99 ≤ 2× floor)",
		Header: []string{"replicas", "in flight", "repeat", "ADD p50 ms", "DEL p50 ms", "DEL/ADD p50", "ADD p99 ms", "floor create p99 ms",
			"ratio", "DEL p99 ms", "floor delete p99 ms", "ratio", "releases finishing after their answer: most at once",
			"all finished, ms after the last DEL", "DELs/s with their finishes"},
	}
	for _, runs := range [][]kneeRun{a.knee1, a.knee3} {
		if len(runs) == 0 {
			continue
		}
		// Per concurrency, each verdict's value of every repeat.
		type cell struct{ rate, delAdd, addP99, delP99 []float64 }
		cells := map[int]*cell{}
		for _, k := range runs {
			addLF, delLF := k.addPerSecLast/k.addPerSecFirst, k.delPerSecLast/k.delPerSecFirst
			a50, d50 := k.add.quantile(0.5), k.del.quantile(0.5)
			a99, d99 := k.add.quantile(0.99), k.del.quantile(0.99)
			fa99, fd99 := k.floorAdd.quantile(0.99), k.floorDel.quantile(0.99)
			c := cells[k.conc]
			if c == nil {
				c = &cell{}
				cells[k.conc] = c
			}
			if k.addPerSecFirst > 0 && k.delPerSecFirst > 0 { // else too few calls for two windows
				c.rate = append(c.rate, min(addLF, delLF))
			}
			c.delAdd, c.addP99, c.delP99 = append(c.delAdd, d50/a50), append(c.addP99, a99/fa99), append(c.delP99, d99/fd99)
			rates.Rows = append(rates.Rows, []string{fmt.Sprint(k.replicas), fmt.Sprint(k.conc), fmt.Sprint(k.repeat),
				report.Num(k.addPerSecFirst, 0), report.Num(k.addPerSecLast, 0), report.Ratio(k.addPerSecLast, k.addPerSecFirst),
				report.Num(k.delPerSecFirst, 0), report.Num(k.delPerSecLast, 0), report.Ratio(k.delPerSecLast, k.delPerSecFirst),
				floorRate(k.floorPerSecAdd, k.floorAdd, k.firstLastK, k.conc),
				floorRate(k.floorPerSecDel, k.floorDel, k.firstLastK, k.conc),
				fmt.Sprintf("%d, %d", k.add.errors, k.del.errors),
				report.Ratio(k.add.rateLast(k.firstLastK), k.add.rateFirst(k.firstLastK)) + ", " +
					report.Ratio(k.del.rateLast(k.firstLastK), k.del.rateFirst(k.firstLastK))})
			lat.Rows = append(lat.Rows, []string{fmt.Sprint(k.replicas), fmt.Sprint(k.conc), fmt.Sprint(k.repeat),
				report.Num(a50, 1), report.Num(d50, 1), report.Ratio(d50, a50),
				report.Num(a99, 1), report.Num(fa99, 1), report.Ratio(a99, fa99),
				report.Num(d99, 1), report.Num(fd99, 1), report.Ratio(d99, fd99),
				report.Num(k.finishPeak, 0), drainText(k.finishDrain), finishedRate(len(k.del.took), k.del.elapsed, k.finishDrain)})
		}
		worstRate, worstDelAdd, worstAddP99, worstDelP99 := math.Inf(1), 0.0, 0.0, 0.0
		for _, c := range cells {
			if len(c.rate) > 0 {
				worstRate = min(worstRate, report.Median(c.rate))
			}
			worstDelAdd = max(worstDelAdd, report.Median(c.delAdd))
			worstAddP99, worstDelP99 = max(worstAddP99, report.Median(c.addP99)), max(worstDelP99, report.Median(c.delP99))
		}
		repeats := 0
		for _, k := range runs {
			repeats = max(repeats, k.repeat)
		}
		label := fmt.Sprintf("%d replica(s), worst of c=%s, median of %d repeat(s) each", runs[0].replicas, concList(runs), repeats)
		b.addSummary("8b. last 100 / first 100 calls per second, "+label, "≥ 0.9×", report.Num(worstRate, 2)+"×",
			atLeastLine(worstRate, 0.9))
		b.addSummary("8b. DEL p50 / ADD p50, "+label, "≤ 1.2×", report.Num(worstDelAdd, 2)+"×", targetLine(worstDelAdd, 1.2, "×"))
		b.addSummary("8b. ADD p99 / bare create p99, "+label, "≤ 2×", report.Num(worstAddP99, 2)+"×", targetLine(worstAddP99, 2, "×"))
		b.addSummary("8b. DEL p99 / bare delete p99, "+label, "≤ 2×", report.Num(worstDelP99, 2)+"×", targetLine(worstDelP99, 2, "×"))
	}
	return rates, lat
}

// drainText is how long the releases' finishes took after the last DEL.
func drainText(d time.Duration) string {
	if d < 0 {
		return fmt.Sprintf("not within %s", finishDrainLimit)
	}
	return report.Num(float64(d.Microseconds())/1000, 0)
}

// finishedRate is DELs per second counted until their finishes were done.
func finishedRate(n int, phase, drain time.Duration) string {
	if drain < 0 || n == 0 {
		return "—"
	}
	return report.Num(float64(n)/(phase+drain).Seconds(), 0)
}

// kneeWindows is 8b's calls per second in each successive window of 100
// calls, at 8 in flight and more: whether a low last/first is a trend or one
// window's dip.
func kneeWindows(a *apicostResult) report.Table {
	t := report.Table{
		Caption: "8b. ADD and DEL calls per second in each successive window of 100 calls served with every worker busy " +
			"(from starts), 8 in flight and more",
		Header: []string{"replicas", "in flight", "repeat", "phase", "calls/s per window, first to last"},
	}
	for _, runs := range [][]kneeRun{a.knee1, a.knee3} {
		for _, k := range runs {
			if k.conc < 8 {
				continue
			}
			for _, ph := range []struct {
				name string
				p    phase
			}{{"ADD", k.add}, {"DEL", k.del}, {"floor create", k.floorAdd}, {"floor delete", k.floorDel}} {
				var ws []string
				for _, r := range ph.p.windowRates(k.firstLastK, k.conc) {
					ws = append(ws, report.Num(r, 0))
				}
				t.Rows = append(t.Rows, []string{fmt.Sprint(k.replicas), fmt.Sprint(k.conc), fmt.Sprint(k.repeat), ph.name,
					strings.Join(ws, " ")})
			}
		}
	}
	return t
}

// floorRate is a floor phase's rate and, in brackets, its own last k / first
// k served at concurrency conc: a knee the API server shows without us.
func floorRate(perSec float64, p phase, k, conc int) string {
	first, last := p.steadyRates(k, conc)
	return report.Num(perSec, 0) + " (" + report.Ratio(last, first) + ")"
}

// atLeastLine is targetLine for a value that should be at least target.
func atLeastLine(measured, target float64) string {
	if math.IsNaN(measured) || math.IsInf(measured, 0) {
		return "not measured"
	}
	if measured >= target {
		return "met"
	}
	return "missed by " + report.Num(target-measured, 2) + "×"
}

// concList names the concurrencies of runs, each once, in their order.
func concList(runs []kneeRun) string {
	var cs []string
	for _, k := range runs {
		if c := fmt.Sprint(k.conc); !slices.Contains(cs, c) {
			cs = append(cs, c)
		}
	}
	return strings.Join(cs, ", ")
}

// cpuTable is 8c: before and after, and their ratio.
func (b *docBuilder) cpuTable(c *cpuResult) report.Table {
	t := report.Table{
		Caption: "8c. One replica's CPU and allocations per 1,000 ADD+DEL pairs, before and after (same run)",
		Header: []string{"binary", "commit", "pairs", "wall s", "CPU-s per 1,000 pairs (idle out)", "idle CPU-s per s",
			"allocations per pair", "KiB allocated per pair"},
	}
	for _, r := range []cpuRun{c.before, c.after} {
		if r.pairs == 0 {
			continue
		}
		commit := r.commit
		if len(r.leftOut) > 0 {
			// An older baseline ran without the chart's flags it does not know.
			commit += " (without " + strings.Join(r.leftOut, " ") + ")"
		}
		t.Rows = append(t.Rows, []string{r.label, commit, fmt.Sprint(r.pairs), report.Num(r.wall.Seconds(), 1),
			report.Num(r.per1000(), 2), report.Num(r.idle, 3), report.Num(r.mallocsPerPair(), 0), report.Num(r.bytesPerPair()/1024, 1)})
	}
	if c.before.pairs > 0 && c.after.pairs > 0 {
		t.Rows = append(t.Rows, []string{"**after / before**", "", "", report.Ratio(c.after.wall.Seconds(), c.before.wall.Seconds()),
			report.Ratio(c.after.per1000(), c.before.per1000()), "", report.Ratio(c.after.mallocsPerPair(), c.before.mallocsPerPair()),
			report.Ratio(c.after.bytesPerPair(), c.before.bytesPerPair())})
		after, before := c.after.per1000(), c.before.per1000()
		b.addSummary("8c. CPU-s per 1,000 ADD+DEL pairs, after / before", "(reported)",
			report.Num(after, 2)+" / "+report.Num(before, 2)+" s = "+report.Ratio(after, before), "—")
		b.addSummary("8c. allocations per ADD+DEL pair, after / before", "(reported)",
			report.Num(c.after.mallocsPerPair(), 0)+" / "+report.Num(c.before.mallocsPerPair(), 0)+" = "+
				report.Ratio(c.after.mallocsPerPair(), c.before.mallocsPerPair()), "—")
	}
	return t
}

// noisyTable is 8d: the ADD latency with and without the neighbour, with
// and without the chart's flow-control objects.
func (b *docBuilder) noisyTable(n *noisyResult) report.Table {
	t := report.Table{
		Caption: "8d. Noisy neighbour: ADD latency while another client LISTs every pod",
		Header: []string{"condition", "ADDs", "p50 ms", "p99 ms", "p99 / quiet p99", "neighbour LISTs/s", "neighbour 429s",
			"retried ADD errors"},
	}
	row := func(name string, ph, quiet phase, lists float64, rejected int64, flood bool) {
		if len(ph.took) == 0 {
			return
		}
		l, r := "—", "—"
		if flood {
			l, r = report.Num(lists, 1), fmt.Sprint(rejected)
		}
		t.Rows = append(t.Rows, []string{name, fmt.Sprint(len(ph.took)), report.Num(ph.quantile(0.5), 1), report.Num(ph.quantile(0.99), 1),
			report.Ratio(ph.quantile(0.99), quiet.quantile(0.99)), l, r, fmt.Sprint(ph.errors)})
	}
	row("no neighbour", n.quiet, n.quiet, 0, 0, false)
	row("neighbour, no flow-control objects", n.flood, n.quiet, n.lists, n.rejected, true)
	row("no neighbour, the chart's flow-control objects", n.quietFC, n.quietFC, 0, 0, false)
	row("neighbour, the chart's flow-control objects", n.floodFC, n.quietFC, n.listsFC, n.rejectedFC, true)
	without := report.Num(n.flood.quantile(0.99)/n.quiet.quantile(0.99), 2) + "×"
	if len(n.flood.took) == 0 {
		without = "no ADD succeeded (see the part's error)"
	}
	if n.floodFailed != "" {
		without = fmt.Sprintf("%d of %d ADDs succeeded within %s; last error: %s", len(n.flood.took), n.addsPerCondition,
			noisyFloodLimit, n.floodFailed)
	}
	b.addSummary("8d. ADD p99 rise under a LIST flood, without flow-control objects", "(reported)", without, "—")
	if n.floodFailedFC != "" {
		b.addSummary("8d. ADD p99 rise under a LIST flood, the chart's flow-control objects", "≤ 1.5×",
			fmt.Sprintf("%d of %d ADDs succeeded within %s", len(n.floodFC.took), n.addsPerCondition, noisyFloodLimit),
			"missed: "+n.floodFailedFC)
	} else if len(n.floodFC.took) > 0 {
		with := n.floodFC.quantile(0.99) / n.quietFC.quantile(0.99)
		b.addSummary("8d. ADD p99 rise under a LIST flood, the chart's flow-control objects", "≤ 1.5×", report.Num(with, 2)+"×",
			targetLine(with, 1.5, "×"))
	} else {
		b.addSummary("8d. ADD p99 rise under a LIST flood, the chart's flow-control objects", "≤ 1.5×", "not measured",
			"not measured: "+firstNonEmpty(n.fcMissing, "no data"))
	}
	return t
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}
