//go:build integration

package charttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/fleet"
)

// The chart's alerts fire on live replicas when their condition is created,
// and resolve when it is undone. A real Prometheus scrapes a fleet of three
// replicas (on a control plane of the fleet's own: the lease case stops
// kube-apiserver) and evaluates the rendered PrometheusRule, with `for`
// durations of seconds and a 20 s rate window instead of the defaults:
//
//   - CCEIPAMBCEThrottling: bce-sim (started without rate limits) given a
//     ListENIs limit that the ENI syncs exceed, so they are answered 429;
//   - CCEIPAMLeakedIPsPastGrace: an address added to a served ENI behind the
//     IPAM's back (an orphan) while bce-sim fails every delete: past the
//     fleet's 20 s leak grace the GC cannot delete it;
//   - CCEIPAMMembersBelowReplicas: one replica SIGSTOPped;
//   - CCEIPAMLeaseInvalid: kube-apiserver down, so no replica renews;
//   - CCEIPAMNoReplicaUp: every replica SIGSTOPped.
//
// The other alerts (fencing policy, owner-wait timeouts, CNI failure ratio,
// subnet nearly full, fenced writes) have promtool tests only
// (TestChart_AlertRules).
func TestChart_AlertsFireOnFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed: run `make tools` (charts/tools/install-prometheus.sh)")
	}
	short := map[string]any{"for": "3s"}
	pr := one(t, render(t, "rel", "kube-system", "-f", valuesFile(t, map[string]any{
		"replicaCount": 3,
		"alerts": map[string]any{"enabled": true, "selector": `job="cce-ipam"`, "rateWindow": "20s",
			"bceThrottling": short, "leakedIPsPastGrace": short, "membersBelowReplicas": short,
			"leaseInvalid": short, "noReplicaUp": short},
	})), "PrometheusRule", "rel-cce-ipam-alerts")
	ruleFile := filepath.Join(t.TempDir(), "alerts.yaml")
	if err := os.WriteFile(ruleFile, alertRuleFile(t, alertRules(t, pr), false), 0o600); err != nil {
		t.Fatal(err)
	}

	f := fleet.Start(t, fleet.Options{Name: "alerts", Replicas: 3, Nodes: 3, BinDir: binDir(t), NoSimRateLimits: true})
	var addrs []string
	for _, r := range f.Replicas() {
		addrs = append(addrs, r.MetricsAddr())
	}
	prom := runPrometheus(t, promBin, addrs, ruleFile)
	waitQuery(t, ctx, prom, time.Minute, `count(up{job="cce-ipam"} == 1) == 3 and min(cce_ipam_shard_members) == 3`)
	// A healthy fleet settles with none of them firing. Not at once: before
	// the first scrapes every rule saw no series (absent(up == 1) held for
	// its 3 s), and an alert resolves only at the next evaluation after the
	// data arrived.
	for _, a := range []string{"CCEIPAMMembersBelowReplicas", "CCEIPAMLeaseInvalid", "CCEIPAMNoReplicaUp",
		"CCEIPAMLeakedIPsPastGrace"} {
		waitAlert(t, ctx, prom, a, false, 30*time.Second)
	}

	t.Run("BCE throttling", func(t *testing.T) {
		// bce-sim starts without limits (NoSimRateLimits): nothing is throttled.
		waitAlert(t, ctx, prom, "CCEIPAMBCEThrottling", false, 30*time.Second)
		if err := f.SetSimRateLimits(ctx, map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {QPS: 0.01, Burst: 1}}); err != nil {
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMBCEThrottling", true, 90*time.Second)
		t.Logf("throttled per second: %s", promRaw(ctx, prom, `sum by (operation) (rate(cce_ipam_cloud_api_throttled_total[20s])) > 0`))
		if err := f.SetSimRateLimits(ctx, map[bcesim.Op]bcesim.RateLimit{bcesim.OpListENIs: {}}); err != nil { // QPS 0: no limit
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMBCEThrottling", false, 90*time.Second)
	})

	t.Run("leaked IP past the grace", func(t *testing.T) {
		eniID := servedENI(t, ctx, f)
		if err := f.SetFaults(ctx, bcesim.Faults{ErrorRate: map[bcesim.Op]float64{
			bcesim.OpDeletePrivateIP: 1, bcesim.OpBatchDeletePrivateIP: 1}}); err != nil {
			t.Fatal(err)
		}
		client := fleetSimClient(t, f)
		added, err := client.BatchAddPrivateIPs(ctx, eniID, cloud.BatchAddRequest{Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("orphan %s on %s; every cloud delete fails", added[0], eniID)
		// ENI sync (5s) + leak grace (20s) + a GC pass (5s) + for (3s).
		waitAlert(t, ctx, prom, "CCEIPAMLeakedIPsPastGrace", true, 2*time.Minute)
		if err := f.SetFaults(ctx, bcesim.Faults{}); err != nil {
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMLeakedIPsPastGrace", false, time.Minute)
	})

	t.Run("members below replicas", func(t *testing.T) {
		r := f.Replica(2)
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMMembersBelowReplicas", true, time.Minute)
		if err := r.Cont(); err != nil {
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMMembersBelowReplicas", false, time.Minute)
	})

	t.Run("lease invalid", func(t *testing.T) {
		waitAlert(t, ctx, prom, "CCEIPAMLeaseInvalid", false, time.Minute)
		restarted := make(chan error, 1)
		go func() { restarted <- f.RestartAPIServer(ctx, 30*time.Second) }()
		// Renew deadline (4s) + a scrape + for (3s), while kube-apiserver is down.
		waitAlert(t, ctx, prom, "CCEIPAMLeaseInvalid", true, 28*time.Second)
		if err := <-restarted; err != nil {
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMLeaseInvalid", false, time.Minute)
	})

	t.Run("no replica up", func(t *testing.T) {
		for _, r := range f.Replicas() {
			if err := r.Stop(); err != nil {
				t.Fatal(err)
			}
		}
		waitAlert(t, ctx, prom, "CCEIPAMNoReplicaUp", true, 30*time.Second)
		for _, r := range f.Replicas() {
			if err := r.Cont(); err != nil {
				t.Fatal(err)
			}
		}
		waitAlert(t, ctx, prom, "CCEIPAMNoReplicaUp", false, 30*time.Second)
	})
}

// firing reports whether Prometheus has the alert firing now.
func firing(t testing.TB, ctx context.Context, prom, alert string) bool {
	t.Helper()
	n, err := promQuery(ctx, prom, fmt.Sprintf(`ALERTS{alertname=%q, alertstate="firing"}`, alert))
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// waitAlert waits until the alert fires (want) or no longer fires (!want).
func waitAlert(t testing.TB, ctx context.Context, prom, alert string, want bool, within time.Duration) {
	t.Helper()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	state := map[bool]string{true: "firing", false: "not firing"}[want]
	eventually(t, wctx, time.Second, alert+" "+state, func() error {
		if firing(t, ctx, prom, alert) != want {
			return fmt.Errorf("ALERTS: %s", promRaw(ctx, prom, `ALERTS`))
		}
		return nil
	})
	t.Logf("%s %s after %s", alert, state, time.Since(start).Round(100*time.Millisecond))
}

// waitQuery waits until the query has a result.
func waitQuery(t testing.TB, ctx context.Context, prom string, within time.Duration, q string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	eventually(t, wctx, time.Second, q, func() error {
		n, err := promQuery(ctx, prom, q)
		if err == nil && n == 0 {
			err = errors.New("no result")
		}
		return err
	})
}

// servedENI returns an attached ENI of one of the fleet's instances.
func servedENI(t testing.TB, ctx context.Context, f *fleet.Fleet) string {
	t.Helper()
	w, err := f.SimWorld(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range w.ENIs {
		if e.InstanceID != "" && e.VPCID == f.VPCID {
			return e.ENIID
		}
	}
	t.Fatal("no attached ENI in the fleet's bce-sim")
	return ""
}

// fleetSimClient is a BCE client of the fleet's bce-sim, acting behind the
// IPAM's back (as a person with the console would).
func fleetSimClient(t testing.TB, f *fleet.Fleet) *cloud.Client {
	t.Helper()
	cfg := cloud.DefaultConfig()
	cfg.OpLimits = nil
	cfg.Endpoint = f.SimURL()
	cfg.Region = fleet.Region
	cfg.AccessKeyID, cfg.SecretAccessKey = fleet.AccessKey, fleet.SecretKey
	cfg.Rate, cfg.Burst = 100, 100
	c, err := cloud.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
