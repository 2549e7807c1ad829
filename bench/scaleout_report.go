package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/cce-ipam/sharded/bench/report"
)

// saturatedShare is the share of the machine's cores busy from which item 9
// counts the machine as saturated: the target holds only below it.
const saturatedShare = 0.9

// scaleOutSection is item 9: per quota, a row per replica count and the
// summary's verdict; one plot of every quota's curve.
func (b *docBuilder) scaleOutSection(so *scaleOutResult) report.Section {
	sec := report.Section{Heading: "9. Scale-out: N replicas, each capped at the same CPU quota"}
	t := report.Table{
		Caption: "9. Warm ADDs and their DELs per second with every worker busy (median of the waves), against N × one replica's",
		Header: []string{"CPU per replica", "replicas", "nodes each", "in flight", "ADD/s", "N × ADD/s at 1", "ratio", "DEL/s", "ratio",
			"ADD p50 ms", "ADD p99 ms", "each replica's CPU (s/s)", "throttled (s/s, all replicas)",
			"replicas' CPU ms per ADD+DEL", "kube-apiserver CPU", "etcd CPU", "bench CPU", "machine busy (cores)", "retried errors"},
	}
	var series []report.Series
	for _, q := range so.quotas {
		rows, curve, ideal := b.scaleOutQuota(q)
		t.Rows = append(t.Rows, rows...)
		if len(curve.X) > 1 {
			series = append(series, curve, ideal)
		}
	}
	sec.Tables = append(sec.Tables, t)
	sec.Notes = append(sec.Notes,
		fmt.Sprintf("Each replica runs in a CPU cgroup of its own (%s) with the quota per 100 ms period; the API "+
			"server, etcd, bce-sim and this driver are not capped. Calls go to the replica serving the pod's node (no "+
			"forwarding hop); %d in flight per replica. Waves of %d warm ADDs (%d per node on %d nodes), then their DELs, "+
			"3 s apart (released addresses cool for 1 s); one warm-up wave per N, then %d waves. The rates are read "+
			"from when calls began, with every worker busy (see 8b). The workers share one queue of calls, so the "+
			"replica with the most nodes bounds the rate: the ideal for N is N × one replica's only when each serves "+
			"the same number of nodes (\"nodes each\").",
			so.cgroup, b.p.ScaleOutConc, b.p.LatPerNode*b.p.LatNodes, b.p.LatPerNode, b.p.LatNodes, b.p.ScaleOutWaves),
		fmt.Sprintf("CPU columns are CPU-seconds per second of the waves (/proc/<pid>/stat), not of the pauses; machine busy "+
			"is all cores from /proc/stat. Throttled is the cgroups' cpu.stat throttled time, counted per CPU run queue, "+
			"so one replica can show more than 1 s/s. The target stops at saturation, taken as ≥ %d %% of the cores busy.",
			int(saturatedShare*100)),
		"Not measured here: the same with the cloud budget as the bottleneck (`--shard-budget-follow-demand` on and off).")
	if len(series) > 0 {
		file := b.plot("scaleout")
		b.check(report.Lines(b.path(file), "Warm ADDs per second against replicas, each replica capped",
			"replicas", "ADDs per second", series, nil))
		sec.Images = append(sec.Images, report.Image{Alt: "warm ADDs per second against N replicas", File: file})
	}
	return sec
}

// scaleOutQuota is one quota's rows, its summary row and its plot series.
func (b *docBuilder) scaleOutQuota(q scaleOutQuota) (rows [][]string, curve, ideal report.Series) {
	runs := slices.Clone(q.runs)
	slices.SortFunc(runs, func(x, y scaleOutRun) int { return x.replicas - y.replicas })
	cpus := report.Num(q.cpus, 2)
	var one *scaleOutRun
	for i := range runs {
		if runs[i].replicas == 1 {
			one = &runs[i]
		}
	}
	curve.Name, ideal.Name = "ADD/s at "+cpus+" CPU each", "N × ADD/s at 1, "+cpus+" CPU"
	type verdict struct {
		n         int
		ratio     float64
		saturated bool
		busy      string
	}
	var vs []verdict
	saturatedAtOne := false
	for _, r := range runs {
		add, del := report.Median(r.addRates), report.Median(r.delRates)
		idealAdd, ratio, delRatio := math.NaN(), math.NaN(), math.NaN()
		if one != nil {
			idealAdd = float64(r.replicas) * report.Median(one.addRates)
			ratio, delRatio = add/idealAdd, del/(float64(r.replicas)*report.Median(one.delRates))
		}
		var each []string
		for _, name := range sortedKeys(r.cpu) {
			if strings.HasPrefix(name, "r") {
				each = append(each, report.Num(r.cpu[name], 2))
			}
		}
		busy := report.Num(r.busy, 2) + " of " + report.Num(r.machineCores, 0)
		saturated := r.machineCores > 0 && r.busy >= saturatedShare*r.machineCores
		nodes := make([]string, len(r.nodesEach))
		for i, n := range r.nodesEach {
			nodes[i] = fmt.Sprint(n)
		}
		rows = append(rows, []string{cpus, fmt.Sprint(r.replicas), strings.Join(nodes, " / "), fmt.Sprint(b.p.ScaleOutConc * r.replicas),
			report.Num(add, 0), report.Num(idealAdd, 0), report.Num(ratio, 2) + "×", report.Num(del, 0), report.Num(delRatio, 2) + "×",
			report.Num(r.add.quantile(0.5), 1), report.Num(r.add.quantile(0.99), 1),
			strings.Join(each, " / "), report.Num(r.throttled, 2), report.Num(r.replicaCPUPerPair(), 2),
			report.Num(r.cpu["kube-apiserver"], 2), report.Num(r.cpu["etcd"], 2), report.Num(r.cpu["bench"], 2),
			busy, fmt.Sprint(r.errors)})
		curve.X, curve.Y = append(curve.X, float64(r.replicas)), append(curve.Y, add)
		ideal.X, ideal.Y = append(ideal.X, float64(r.replicas)), append(ideal.Y, idealAdd)
		if r.replicas == 1 {
			saturatedAtOne = saturated
		} else {
			vs = append(vs, verdict{r.replicas, ratio, saturated, busy})
		}
	}

	// The verdict: every N below saturation at ≥ 0.8; a saturated N is
	// reported, not judged.
	var measured []string
	line, judged := "met", 0
	for _, v := range vs {
		m := fmt.Sprintf("N=%d: %s×", v.n, report.Num(v.ratio, 2))
		if v.saturated {
			m += " (saturated: " + v.busy + " cores busy)"
		}
		measured = append(measured, m)
		if !v.saturated {
			judged++
			if v.ratio < 0.8 && line == "met" {
				line = fmt.Sprintf("missed at N=%d by %s×", v.n, report.Num(0.8-v.ratio, 2))
			}
		}
	}
	switch {
	case one == nil || len(vs) == 0:
		line = "not measured"
	case saturatedAtOne:
		line = "not measured below saturation: the machine was saturated with 1 replica"
	case judged == 0:
		line = "not measured below saturation: the machine was saturated from N=2"
	}
	b.addSummary(fmt.Sprintf("9. scale-out: ADD/s at N / (N × at 1), each replica ≤ %s CPU", cpus),
		"≥ 0.8× until saturation", strings.Join(measured, ", "), line)
	return rows, curve, ideal
}
