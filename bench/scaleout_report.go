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

// scaleOutSection is item 9: a row per replica count, the summary's verdict
// and the scale-out plot.
func (b *docBuilder) scaleOutSection(so *scaleOutResult) report.Section {
	runs := slices.Clone(so.runs)
	slices.SortFunc(runs, func(x, y scaleOutRun) int { return x.replicas - y.replicas })
	sec := report.Section{Heading: fmt.Sprintf("9. Scale-out: N replicas, each capped at %s CPU", report.Num(so.cpuQuota, 2))}
	t := report.Table{
		Caption: "9. Warm ADDs and their DELs per second with every worker busy (median of the waves), against N × one replica's",
		Header: []string{"replicas", "in flight", "ADD/s", "N × ADD/s at 1", "ratio", "DEL/s", "ratio", "ADD p50 ms", "ADD p99 ms",
			"each replica's CPU (s/s)", "throttled (s/s, all replicas)", "kube-apiserver CPU", "etcd CPU", "bench CPU",
			"machine busy (cores)", "retried errors"},
	}
	var one *scaleOutRun
	for i := range runs {
		if runs[i].replicas == 1 {
			one = &runs[i]
		}
	}
	var curve, ideal report.Series
	curve.Name, ideal.Name = "ADD/s, measured", "N × ADD/s at 1 replica"
	type verdict struct {
		n         int
		ratio     float64
		saturated bool
		busy      string
	}
	var vs []verdict
	for _, r := range runs {
		add, del := report.Median(r.addRates), report.Median(r.delRates)
		idealAdd, idealDel, ratio, delRatio := math.NaN(), math.NaN(), math.NaN(), math.NaN()
		if one != nil {
			idealAdd, idealDel = float64(r.replicas)*report.Median(one.addRates), float64(r.replicas)*report.Median(one.delRates)
			ratio, delRatio = add/idealAdd, del/idealDel
		}
		var each []string
		for _, name := range sortedKeys(r.cpu) {
			if strings.HasPrefix(name, "r") {
				each = append(each, report.Num(r.cpu[name], 2))
			}
		}
		busy := report.Num(r.busy, 2) + " of " + report.Num(r.machineCores, 0)
		t.Rows = append(t.Rows, []string{fmt.Sprint(r.replicas), fmt.Sprint(b.p.ScaleOutConc * r.replicas),
			report.Num(add, 0), report.Num(idealAdd, 0), report.Num(ratio, 2) + "×", report.Num(del, 0), report.Num(delRatio, 2) + "×",
			report.Num(r.add.quantile(0.5), 1), report.Num(r.add.quantile(0.99), 1),
			strings.Join(each, " / "), report.Num(r.throttled, 2),
			report.Num(r.cpu["kube-apiserver"], 2), report.Num(r.cpu["etcd"], 2), report.Num(r.cpu["bench"], 2),
			busy, fmt.Sprint(r.errors)})
		curve.X, curve.Y = append(curve.X, float64(r.replicas)), append(curve.Y, add)
		ideal.X, ideal.Y = append(ideal.X, float64(r.replicas)), append(ideal.Y, idealAdd)
		if r.replicas > 1 {
			vs = append(vs, verdict{r.replicas, ratio, r.machineCores > 0 && r.busy >= saturatedShare*r.machineCores, busy})
		}
	}
	sec.Tables = append(sec.Tables, t)

	// The verdict: every N below saturation at ≥ 0.8; the first saturated
	// N ends what the target asks for.
	var measured []string
	line, worst := "met", math.Inf(1)
	for _, v := range vs {
		m := fmt.Sprintf("N=%d: %s×", v.n, report.Num(v.ratio, 2))
		if v.saturated {
			m += " (saturated: " + v.busy + " cores busy)"
		}
		measured = append(measured, m)
		if !v.saturated {
			worst = min(worst, v.ratio)
			if v.ratio < 0.8 && line == "met" {
				line = fmt.Sprintf("missed at N=%d by %s×", v.n, report.Num(0.8-v.ratio, 2))
			}
		}
	}
	switch {
	case one == nil || len(vs) == 0:
		line = "not measured"
	case math.IsInf(worst, 1):
		line = "not measured below saturation: the machine was saturated from N=2"
	}
	b.addSummary(fmt.Sprintf("9. scale-out: ADD/s at N / (N × at 1), each replica ≤ %s CPU", report.Num(so.cpuQuota, 2)),
		"≥ 0.8× until saturation", strings.Join(measured, ", "), line)

	sec.Notes = append(sec.Notes,
		fmt.Sprintf("Each replica runs in a CPU cgroup of its own (%s) with a quota of %s CPU per 100 ms period; the API "+
			"server, etcd, bce-sim and this driver are not capped. Calls go to the replica serving the pod's node (no "+
			"forwarding hop); %d in flight per replica. Waves of %d warm ADDs (%d per node on %d nodes), then their DELs, "+
			"3 s apart (released addresses cool for 1 s); one warm-up wave per N, then %d waves. The rates are read "+
			"from when calls began, with every worker busy (see 8b).",
			so.cgroup, report.Num(so.cpuQuota, 2), b.p.ScaleOutConc, b.p.LatPerNode*b.p.LatNodes, b.p.LatPerNode, b.p.LatNodes,
			b.p.ScaleOutWaves),
		fmt.Sprintf("CPU columns are CPU-seconds per second of the waves (/proc/<pid>/stat), not of the pauses; machine busy "+
			"is all cores from /proc/stat. The target stops at saturation, taken as ≥ %d %% of the cores busy.",
			int(saturatedShare*100)),
		"Not measured here: the same with the cloud budget as the bottleneck (`--shard-budget-follow-demand` on and off).")
	if len(curve.X) > 1 {
		file := b.plot("scaleout")
		b.check(report.Lines(b.path(file), fmt.Sprintf("Warm ADDs per second, each replica capped at %s CPU",
			report.Num(so.cpuQuota, 2)), "replicas", "ADDs per second", []report.Series{curve, ideal}, nil))
		sec.Images = append(sec.Images, report.Image{Alt: "warm ADDs per second against N replicas", File: file})
	}
	return sec
}
