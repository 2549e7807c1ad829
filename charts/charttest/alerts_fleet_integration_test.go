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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
	"github.com/cce-ipam/sharded/shard"
)

// The chart's alerts fire on live replicas when their condition is created,
// and resolve when it is undone. A real Prometheus scrapes a fleet of three
// replicas (on a control plane of the fleet's own: the lease case stops
// kube-apiserver) and evaluates the rendered PrometheusRule, with `for`
// durations of seconds and a 20 s rate window instead of the defaults (the
// thresholds are the chart's):
//
//   - CCEIPAMBCEThrottling: bce-sim (started without rate limits) given a
//     ListENIs limit that the ENI syncs exceed, so they are answered 429;
//   - CCEIPAMLeakedIPsPastGrace: an address added to a served ENI behind the
//     IPAM's back (an orphan) while bce-sim fails every delete: past the
//     fleet's 20 s leak grace the GC cannot delete it;
//   - CCEIPAMCNIFailureRatio: ADDs of pods that do not exist, which fail;
//   - CCEIPAMFencingPolicyMissing: the binding of partition 0 of the fencing
//     policy deleted (then restored) in the fleet's control plane;
//   - CCEIPAMMembersBelowReplicas: one replica SIGSTOPped;
//   - CCEIPAMFencedWrites: a replica frozen right before a wep Create (the
//     before-wep-create failpoint, armed on every replica through the
//     environment, inert until its file exists) and resumed once another
//     replica holds the node's partition: the API server's fencing policy
//     refuses the Create, counted in cce_ipam_fenced_writes_total{by="apiserver"}
//     (the replica's own refusals, by="replica", come only in the moment
//     between its Lease lapsing and its ownership loop stopping the node's
//     work: no condition makes them on demand);
//   - CCEIPAMLeaseInvalid: kube-apiserver down, so no replica renews;
//   - CCEIPAMOwnerWaitTimeouts: meanwhile an ADD to every replica for a
//     node that, with no valid Lease anywhere, has no owner (owner wait 5 s);
//   - CCEIPAMSubnetNearlyFull: a node added in a /27 of its own (below the
//     default threshold of 32 free IPs; not undone);
//   - CCEIPAMNoReplicaUp: every replica SIGSTOPped.
func TestChart_AlertsFireOnFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
	defer cancel()
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed: run `make tools` (charts/tools/install-prometheus.sh)")
	}
	short := map[string]any{"for": "3s"}
	pr := one(t, render(t, "rel", "kube-system", "-f", valuesFile(t, map[string]any{
		"replicaCount": 3,
		// The thresholds are the chart's defaults (subnetNearlyFull: 32).
		"alerts": map[string]any{"enabled": true, "selector": `job="cce-ipam"`, "rateWindow": "20s",
			"bceThrottling": short, "leakedIPsPastGrace": short, "membersBelowReplicas": short,
			"leaseInvalid": short, "noReplicaUp": short, "fencingPolicyMissing": short,
			"ownerWaitTimeouts": short, "cniFailureRatio": short, "subnetNearlyFull": short, "fencedWrites": short},
	})), "PrometheusRule", "rel-cce-ipam-alerts")
	ruleFile := filepath.Join(t.TempDir(), "alerts.yaml")
	if err := os.WriteFile(ruleFile, alertRuleFile(t, alertRules(t, pr), false), 0o600); err != nil {
		t.Fatal(err)
	}

	freezeDir := t.TempDir()
	freeze := func(index int) string { return filepath.Join(freezeDir, "freeze-"+strconv.Itoa(index)) }
	f := fleet.Start(t, fleet.Options{Name: "alerts", Replicas: 3, Nodes: 3, BinDir: binDir(t), NoSimRateLimits: true,
		// sharding.ownerWait: a CNI call for a node without owner gives up
		// well within the lease case's kube-apiserver outage.
		ReplicaArgs: []string{"--shard-owner-wait", "5s"},
		// The fenced-writes case's failpoint (ipamcore/ipam/failpoint.go):
		// inert until the test creates the file.
		ReplicaEnvFunc: func(index int) []string {
			return []string{"CCE_IPAM_TEST_FAILPOINT=before-wep-create=" + freeze(index)}
		}})
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
		"CCEIPAMLeakedIPsPastGrace", "CCEIPAMFencingPolicyMissing", "CCEIPAMOwnerWaitTimeouts",
		"CCEIPAMCNIFailureRatio", "CCEIPAMSubnetNearlyFull", "CCEIPAMFencedWrites"} {
		waitAlert(t, ctx, prom, a, false, time.Minute)
	}

	// The fencing policy's binding of partition 0 is deleted now, and its
	// alert awaited after the next cases: a replica looks for the policy
	// once a minute, and the wait need not add to the test's time.
	fencing := f.Kube.AdmissionregistrationV1()
	binding := fencingBinding(t, ctx, f)
	if err := fencing.ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted the fencing policy binding %s", binding.Name)

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

	t.Run("CNI failure ratio", func(t *testing.T) {
		// ADDs of pods that do not exist: no replica can tell their node,
		// so each fails (result error). A kubelet sends those when a pod
		// was deleted as its sandbox was being set up.
		calls := 0
		deadline := time.Now().Add(90 * time.Second)
		for !firing(t, ctx, prom, "CCEIPAMCNIFailureRatio") {
			if time.Now().After(deadline) {
				t.Fatalf("CCEIPAMCNIFailureRatio not firing after %d failed calls: %s", calls, promRaw(ctx, prom, `ALERTS`))
			}
			for _, addr := range f.CNIAddrs() {
				reply := allocateIP(t, ctx, addr, &rpc.AllocateIPRequest{K8SPodName: fmt.Sprintf("no-such-pod-%d", calls),
					K8SPodNamespace: "default", K8SPodInfraContainerID: "c0ffee"})
				if reply.GetIsSuccess() {
					t.Fatalf("AllocateIP of a pod that does not exist succeeded: %v", reply)
				}
				if calls == 0 {
					t.Logf("AllocateIP of a pod that does not exist: %s", reply.GetErrMsg())
				}
				calls++
			}
			sleepCtx(ctx, 500*time.Millisecond)
		}
		t.Logf("CCEIPAMCNIFailureRatio firing after %d failed calls; failing share: %s", calls, promRaw(ctx, prom,
			`sum(rate(cce_ipam_cni_requests_total{hop="entry", result=~"error|busy"}[20s])) / sum(rate(cce_ipam_cni_requests_total{hop="entry"}[20s]))`))
		waitAlert(t, ctx, prom, "CCEIPAMCNIFailureRatio", false, 90*time.Second)
	})

	t.Run("fencing policy missing", func(t *testing.T) {
		// Deleted before the cases above; a replica's next look (at most
		// a minute after) finds it missing.
		waitAlert(t, ctx, prom, "CCEIPAMFencingPolicyMissing", true, 2*time.Minute)
		restore := binding.DeepCopy()
		restore.ObjectMeta = metav1.ObjectMeta{Name: binding.Name, Labels: binding.Labels, Annotations: binding.Annotations}
		if _, err := fencing.ValidatingAdmissionPolicyBindings().Create(ctx, restore, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Resolved at the replicas' next look: awaited after the next
		// cases (fencing policy restored).
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

	t.Run("fenced writes", func(t *testing.T) {
		waitAlert(t, ctx, prom, "CCEIPAMFencedWrites", false, 30*time.Second)
		node := f.Nodes()[0]
		// The case before resumed a replica: its nodes may be between
		// owners for a moment.
		idx, err := f.WaitNodeOwner(ctx, node, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		victim := f.Replica(idx)
		st, err := victim.ShardStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Arm the failpoint on the node's owner, and give the node a pod:
		// the kubelet's ADD reaches the owner, which passes its fence and
		// stops before the wep Create.
		fp := freeze(idx)
		if err := os.WriteFile(fp, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.Remove(fp)
			_ = victim.Cont()
		})
		pods := f.Kube.CoreV1().Pods("default")
		if _, err := pods.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "fenced-write"},
			Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: new(int64(0)),
				Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		hctx, hcancel := context.WithTimeout(ctx, 90*time.Second)
		defer hcancel()
		eventually(t, hctx, 50*time.Millisecond, "the owner reaching the failpoint", func() error {
			_, err := os.Stat(fp + ".hit")
			return err
		})
		detail, _ := os.ReadFile(fp + ".hit")
		t.Logf("replica %d (%s) frozen before its wep Create: %s", idx, st.Self, strings.TrimSpace(string(detail)))

		// Freeze the whole process until another replica holds the
		// node's partition, then let the Create out.
		if err := victim.Stop(); err != nil {
			t.Fatal(err)
		}
		// A failed scrape marks the replica's series stale: the next value
		// Prometheus gets is one from after the resume.
		fencedSeries := fmt.Sprintf(`cce_ipam_fenced_writes_total{by="apiserver", instance=%q}`, victim.MetricsAddr())
		waitQuery(t, ctx, prom, 30*time.Second, fmt.Sprintf(`up{instance=%q} == 0`, victim.MetricsAddr()))
		claims := f.Kube.CoordinationV1().Leases(f.Options().LeaseNamespace)
		claim := shard.PartitionLeaseName(shard.PartitionOf(271, node))
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		defer ccancel()
		eventually(t, cctx, 200*time.Millisecond, claim+" taken over", func() error {
			l, err := claims.Get(cctx, claim, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if h := ptr.Deref(l.Spec.HolderIdentity, ""); h == "" || h == st.Self {
				return fmt.Errorf("held by %q", h)
			}
			t.Logf("%s: holder %q epoch %d", claim, ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0))
			return nil
		})
		// Resume the process, the Create still held: once Prometheus has
		// a sample of the counter from after the resume, let it out. A
		// counter whose first sample after a gap already has the refusal
		// would show no increase within the 20 s rate window if the freeze
		// outlasted it.
		if err := victim.Cont(); err != nil {
			t.Fatal(err)
		}
		waitQuery(t, ctx, prom, 30*time.Second, fencedSeries)
		if err := os.Remove(fp); err != nil {
			t.Fatal(err)
		}
		// The replica's own fence may refuse a write or two as it resumes
		// (by="replica"), which the alert sums too; the API server's
		// refusal must be there, and alone above the alert's threshold.
		waitQuery(t, ctx, prom, time.Minute, "increase("+fencedSeries+"[20s]) > 0")
		waitAlert(t, ctx, prom, "CCEIPAMFencedWrites", true, time.Minute)
		// The alert's expression with by="apiserver" only (threshold: the
		// chart's default, 0).
		apiOnly := `sum(rate(cce_ipam_fenced_writes_total{by="apiserver"}[20s])) > 0`
		t.Logf("fenced writes: %s; by the API server per second: %s",
			promRaw(ctx, prom, `sum by (instance, by) (cce_ipam_fenced_writes_total) > 0`), promRaw(ctx, prom, apiOnly))
		if n, err := promQuery(ctx, prom, apiOnly); err != nil || n == 0 {
			t.Errorf("CCEIPAMFencedWrites fires, but the API server's refusals alone are not above its threshold (%d, %v)", n, err)
		}
		if err := pods.Delete(ctx, "fenced-write", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMFencedWrites", false, time.Minute)
		waitAlert(t, ctx, prom, "CCEIPAMMembersBelowReplicas", false, time.Minute)
	})

	t.Run("lease invalid", func(t *testing.T) {
		waitAlert(t, ctx, prom, "CCEIPAMLeaseInvalid", false, time.Minute)
		waitAlert(t, ctx, prom, "CCEIPAMOwnerWaitTimeouts", false, time.Minute)
		restarted := make(chan error, 1)
		go func() { restarted <- f.RestartAPIServer(ctx, 40*time.Second) }()
		// Renew deadline (4s) + a scrape + for (3s), while kube-apiserver is down.
		waitAlert(t, ctx, prom, "CCEIPAMLeaseInvalid", true, 30*time.Second)
		// No replica holds a valid Lease: a CNI call for a node waits for
		// an owner (5 s here) and gives up, on every replica.
		node := f.Nodes()[0]
		var wg sync.WaitGroup
		replies := make([]*rpc.AllocateIPReply, len(f.CNIAddrs()))
		for i, addr := range f.CNIAddrs() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i] = allocateIP(t, ctx, addr, &rpc.AllocateIPRequest{K8SPodName: fmt.Sprintf("owner-wait-%d", i),
					K8SPodNamespace: "default", K8SPodInfraContainerID: "c0ffee", K8SNodeName: node})
			}()
		}
		wg.Wait()
		for i, reply := range replies {
			if reply == nil {
				t.FailNow() // allocateIP failed the test
			}
			if reply.GetIsSuccess() || !strings.Contains(reply.GetErrMsg(), "no replica serves node") {
				t.Fatalf("AllocateIP for %s on replica %d while no replica holds a Lease: %v", node, i, reply)
			}
			t.Logf("replica %d: %s", i, reply.GetErrMsg())
		}
		// Within the rate window (20 s) of those timeouts, outage or not.
		waitAlert(t, ctx, prom, "CCEIPAMOwnerWaitTimeouts", true, 15*time.Second)
		if err := <-restarted; err != nil {
			t.Fatal(err)
		}
		waitAlert(t, ctx, prom, "CCEIPAMLeaseInvalid", false, time.Minute)
		waitAlert(t, ctx, prom, "CCEIPAMOwnerWaitTimeouts", false, time.Minute)
	})

	t.Run("fencing policy restored", func(t *testing.T) {
		// Restored in "fencing policy missing": a minute has passed since.
		// A replica looks once a minute, and a look that fell in the API
		// server's restart above failed: two periods and the rule's.
		waitAlert(t, ctx, prom, "CCEIPAMFencingPolicyMissing", false, 150*time.Second)
	})

	t.Run("subnet nearly full", func(t *testing.T) {
		// A node in a /27 of its own: its IPPool lists the subnet, whose
		// free addresses (32 at most, fewer once BCE's reserved ones and
		// the node's ENI and pool take theirs) are below the chart's
		// default threshold of 32. Not undone: the Subnet resource stays
		// (as it would in a cluster) and the alert with it.
		if err := f.AddSubnet(ctx, "sbn-alerts-tiny", "10.21.0.0/27"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.AddNodesIn(ctx, 1, "sbn-alerts-tiny"); err != nil {
			t.Fatal(err)
		}
		// Two steps, so that a slow one is named: the new node's pool
		// lists the subnet and a replica describes it (after the API
		// server's restart above, under a loaded machine this has taken
		// over 90 s), then the alert's rule (for 3 s) fires.
		waitQuery(t, ctx, prom, 3*time.Minute, `cce_ipam_subnet_available_ips{subnet="sbn-alerts-tiny"}`)
		waitAlert(t, ctx, prom, "CCEIPAMSubnetNearlyFull", true, time.Minute)
		t.Logf("free IPs: %s", promRaw(ctx, prom, `max by (subnet) (cce_ipam_subnet_available_ips)`))
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

// fencingBinding returns the binding of partition 0 of the chart's fencing
// policies the fleet installed: the policies <name>-g<group> have a sibling
// <name>-token, and the replicas look for the binding <name>-0
// (shard/fencing.go).
func fencingBinding(t testing.TB, ctx context.Context, f *fleet.Fleet) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	t.Helper()
	adm := f.Kube.AdmissionregistrationV1()
	policies, err := adm.ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range policies.Items {
		if name, ok := strings.CutSuffix(p.Name, "-token"); ok {
			b, err := adm.ValidatingAdmissionPolicyBindings().Get(ctx, name+"-0", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatal("the fleet installed no fencing policy")
	return nil
}

// allocateIP makes an ADD as a CNI plugin would, to the replica at addr.
func allocateIP(t testing.TB, ctx context.Context, addr string, req *rpc.AllocateIPRequest) *rpc.AllocateIPReply {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Error(err)
		return nil
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	reply, err := rpc.NewCNIBackendClient(conn).AllocateIP(ctx, req)
	if err != nil {
		t.Errorf("AllocateIP on %s: %v", addr, err)
		return nil
	}
	return reply
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
