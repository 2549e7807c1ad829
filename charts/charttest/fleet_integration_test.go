//go:build integration

package charttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/e2e/freeport"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/supervisor"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/membership"
)

const (
	fleetAK, fleetSK = "AKCHART", "SKchartSecret"
	fleetCluster     = "cce-chart"
	fleetVPC         = "vpc-chart"
	fleetSubnet      = "sbn-chart"
	fleetZone        = "cn-bj-a"
	fleetGroup       = "g-chart"
	fleetRelease     = "fleet"
	fleetReplicas    = 3
	fleetNodes       = 6
	fleetPods        = 24
)

// The chart and the binary cannot drift apart, the RBAC suffices, and the
// dashboard queries real metrics:
//
//  1. The chart is rendered once per replica; only what cannot work outside
//     a pod is substituted, through chart values (listenAddress 127.0.0.1,
//     free ports) or files (the rendered Secrets written where the pod
//     would mount them). The memberlist join DNS name of the headless
//     Service resolves only in a cluster: it becomes replica 0's address.
//     $(VAR) in args is expanded from the container's env, with the
//     fieldRefs a kubelet would fill in (POD_IP=127.0.0.1). --kubeconfig is
//     appended.
//  2. The ServiceAccount, ClusterRole, Role and bindings are applied from the
//     same render, and the replicas authenticate with a token of that
//     ServiceAccount.
//  3. Three replicas must become ready; the kubelet simulator then runs pods
//     through them (AllocateIP and ReleaseIP spread over all three).
//  4. A real Prometheus scrapes the three; every PromQL query of the
//     dashboard must return data, and promtool must accept each /metrics.
//  5. No replica may log "forbidden".
func TestChart_FleetUnderPrometheus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed: run `make tools` (charts/tools/install-prometheus.sh)")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: run `make tools` (charts/tools/install-prometheus.sh)")
	}
	ns := cp.Namespace(t)
	if err := cp.InstallCRDs(ctx, filepath.Join(chartDir, "crds")); err != nil {
		t.Fatal(err)
	}
	simURL := startBCESim(t)

	// 1. One render per replica (its own ports), the Secrets of the first.
	ports := freeport.MustGet(t, 4*fleetReplicas)
	renders := make([][]*unstructured.Unstructured, fleetReplicas)
	for i := range fleetReplicas {
		renders[i] = render(t, fleetRelease, ns, "-f", valuesFile(t, map[string]any{
			"cluster": map[string]any{"id": fleetCluster, "vpcID": fleetVPC},
			"bce": map[string]any{"region": "bj", "endpoint": simURL, "rate": 60, "burst": 30,
				"credentials": map[string]any{"accessKeyID": fleetAK, "secretAccessKey": fleetSK}},
			"listenAddress": "127.0.0.1",
			// One replica binds the CNI endpoint to its pod IP only (grpc.bindPodIP).
			"grpc":       map[string]any{"port": ports[4*i], "bindPodIP": i == 1},
			"metrics":    map[string]any{"port": ports[4*i+1]},
			"memberlist": map[string]any{"port": ports[4*i+2]},
			"webhook":    map[string]any{"port": ports[4*i+3]},
			// Short periods, so that a short test sees ENI syncs and GC passes.
			"ipam": map[string]any{"eniSyncPeriod": "3s", "gcPeriod": "2s"},
		}))
	}

	// 2. RBAC and ServiceAccount from the chart; a token of the ServiceAccount.
	kubeconfig := applyRBACAndGetKubeconfig(t, ctx, ns, renders[0])

	replicas := make([]*replica, fleetReplicas)
	joinAddr := "127.0.0.1:" + strconv.Itoa(ports[2])
	for i := range fleetReplicas {
		replicas[i] = startReplica(t, i, ns, renders[i], renders[0], joinAddr, kubeconfig)
	}
	t.Run("rendered args start ready replicas", func(t *testing.T) {
		readyCtx, readyCancel := context.WithTimeout(ctx, 2*time.Minute)
		defer readyCancel()
		for _, r := range replicas {
			eventually(t, readyCtx, 250*time.Millisecond, r.proc.Name()+" /readyz", func() error {
				if err := alive(r.proc); err != nil {
					readyCancel() // a dead replica will not get ready
					return err
				}
				return httpStatus("http://" + r.metricsAddr + "/readyz")
			})
		}
		// The chart's fencing policy is in place, and the replicas see it.
		for _, r := range replicas {
			body, err := httpGet("http://" + r.metricsAddr + "/shard/status")
			if err != nil || !strings.Contains(strings.ReplaceAll(body, " ", ""), `"fencingPolicy":"ok"`) {
				t.Errorf("%s /shard/status does not report the fencing policy in place: %v %s", r.proc.Name(), err, body)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	// 3. Pods through the replicas.
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	t.Run("the replicas share one webhook Secret and keep the caBundles", func(t *testing.T) {
		webhookCtx, webhookCancel := context.WithTimeout(ctx, time.Minute)
		defer webhookCancel()
		eventually(t, webhookCtx, 250*time.Millisecond, "caBundles equal to the webhook Secret's ca.crt", func() error {
			s, err := kube.CoreV1().Secrets(ns).Get(ctx, fleetRelease+"-cce-ipam-webhook-certs", metav1.GetOptions{})
			if err != nil {
				return err
			}
			m, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, fleetRelease+"-cce-ipam", metav1.GetOptions{})
			if err != nil {
				return err
			}
			v, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, fleetRelease+"-cce-ipam", metav1.GetOptions{})
			if err != nil {
				return err
			}
			ca := string(s.Data["ca.crt"])
			if ca == "" || string(m.Webhooks[0].ClientConfig.CABundle) != ca || string(v.Webhooks[0].ClientConfig.CABundle) != ca {
				return fmt.Errorf("caBundles not (yet) the Secret's ca.crt")
			}
			return nil
		})
	})
	t.Run("the replicas created one key Secret and gossip under it", func(t *testing.T) {
		// Started together, as the chart's ServiceAccount: the first create
		// won, the others read it, and so all join one encrypted ring.
		s, err := kube.CoreV1().Secrets(ns).Get(ctx, fleetRelease+"-cce-ipam-keys", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := membership.ParseGossipKey(s.Data[membership.KeySecretGossip]); err != nil {
			t.Errorf("gossip key: %v", err)
		}
		if _, err := membership.ParseGossipKey(s.Data[membership.KeySecretForward]); err != nil {
			t.Errorf("forward key: %v", err)
		}
		ringCtx, ringCancel := context.WithTimeout(ctx, 30*time.Second)
		defer ringCancel()
		for _, r := range replicas {
			if !strings.Contains(logText(r.proc), `"encrypted":true`) {
				t.Errorf("%s does not log encrypted gossip", r.proc.Name())
			}
			want := fmt.Sprintf("cce_ipam_membership_members %d", fleetReplicas)
			eventually(t, ringCtx, 250*time.Millisecond, r.proc.Name()+" sees every replica in its gossip ring", func() error {
				body, err := httpGet("http://" + r.metricsAddr + "/metrics")
				if err != nil {
					return err
				}
				if !strings.Contains(body, want+"\n") {
					return fmt.Errorf("no %q in /metrics", want)
				}
				return nil
			})
		}
	})
	cs := cceclient.NewForConfigOrDie(cp.Config)
	var grpcAddrs []string
	for _, r := range replicas {
		grpcAddrs = append(grpcAddrs, r.grpcAddr)
	}
	for k := range fleetPods {
		createPod(t, ctx, kube, ns, fmt.Sprintf("web-%d", k))
	}
	startKubelet(t, ctx, ns, simURL, grpcAddrs, kube, cs)
	createGhostIPPool(t, ctx, cs)
	churnDone := make(chan struct{})
	var churn sync.WaitGroup
	t.Run("pods get IPs through the chart's replicas", func(t *testing.T) {
		podsCtx, podsCancel := context.WithTimeout(ctx, 2*time.Minute)
		defer podsCancel()
		eventually(t, podsCtx, 500*time.Millisecond, "all pods Running with an IP", func() error {
			n, err := runningWithIP(ctx, kube, ns)
			if err != nil {
				return err
			}
			if n < fleetPods {
				return fmt.Errorf("%d of %d pods Running with an IP", n, fleetPods)
			}
			return nil
		})
	})
	if t.Failed() {
		t.FailNow()
	}
	// Keep allocating and releasing while Prometheus scrapes.
	churn.Go(func() { churnPods(ctx, kube, ns, churnDone) })
	defer func() { close(churnDone); churn.Wait() }()

	// 4. Prometheus over the three replicas.
	promURL := startPrometheus(t, promBin, replicas)
	exprs := dashboardQueries(t)
	t.Run("every dashboard query returns data", func(t *testing.T) {
		queryCtx, queryCancel := context.WithTimeout(ctx, 90*time.Second)
		defer queryCancel()
		var empty []string
		eventually(t, queryCtx, 2*time.Second, "dashboard queries with data", func() error {
			empty = empty[:0]
			for _, q := range exprs {
				n, err := promQuery(ctx, promURL, q.expr)
				if err != nil {
					return fmt.Errorf("panel %q: %w", q.panel, err)
				}
				if n == 0 {
					empty = append(empty, fmt.Sprintf("%s: %s", q.panel, q.expr))
				}
			}
			if len(empty) > 0 {
				return fmt.Errorf("%d of %d queries return no data:\n  %s", len(empty), len(exprs), strings.Join(empty, "\n  "))
			}
			return nil
		})
		// The event-driven series, for the log: how much margin the run had.
		for _, q := range []string{`sum by (outcome) (cce_ipam_shard_owner_waits_total)`,
			`sum by (reason) (cce_ipam_shard_handovers_total)`,
			`sum by (result) (cce_ipam_shard_forwarded_requests_total)`, `sum by (operation) (cce_ipam_cloud_api_throttled_total)`,
			`sum by (kind) (cce_ipam_gc_actions_total)`, `sum by (method, hop) (cce_ipam_cni_requests_total)`} {
			t.Logf("%s = %s", q, promRaw(ctx, promURL, q))
		}
		// Three replicas, scraped, and each answering for its own shard.
		for _, q := range []string{`count(up{job="cce-ipam"} == 1) == 3`, `count(cce_ipam_shard_owned_partitions > 0) == 3`} {
			if n, err := promQuery(ctx, promURL, q); err != nil || n == 0 {
				t.Errorf("%s: no result (%v)", q, err)
			}
		}
	})
	t.Run("promtool check metrics", func(t *testing.T) {
		for _, r := range replicas {
			body, err := httpGet("http://" + r.metricsAddr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = strings.NewReader(body)
			out, err := cmd.CombinedOutput()
			if err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("promtool check metrics on %s: %v\n%s", r.proc.Name(), err, out)
			}
		}
	})
	t.Run("no forbidden in any replica log", func(t *testing.T) {
		for _, r := range replicas {
			for _, line := range strings.Split(logText(r.proc), "\n") {
				if strings.Contains(strings.ToLower(line), "forbidden") {
					t.Errorf("%s: %s", r.proc.Name(), line)
				}
			}
			if err := alive(r.proc); err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("the RBAC grants exactly the verbs the replicas used", func(t *testing.T) {
		// The IPPool status is written (get, then update) by an ENI sync,
		// which this fleet throttles hard (ListENIs 1/s over three
		// replicas): under load, no sync may have completed yet. Wait for
		// one that wrote a pool's ENIs, so that the audit sees the verbs
		// the replicas use, not how fast their syncs got through.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		eventually(t, wctx, time.Second, "an ENI sync wrote an IPPool's status.eni.enis", func() error {
			pools, err := cs.CceV1alpha1().IPPools(cce.IPPoolNamespace).List(wctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, p := range pools.Items {
				if len(p.Status.ENI.ENIs) > 0 {
					return nil
				}
			}
			return fmt.Errorf("none of %d IPPools has ENIs in its status yet", len(pools.Items))
		})
		// Graceful stops first: the leave (hand-over, Lease release) is part
		// of what the replicas do.
		for _, r := range replicas {
			if err := r.proc.Stop(30 * time.Second); err != nil {
				t.Errorf("%s: %v", r.proc.Name(), err)
			}
		}
		checkRBACUsed(t, renders[0], "system:serviceaccount:"+ns+":"+fleetRelease+"-cce-ipam", notExercised)
	})
}

// notExercised are the permissions the chart grants that a fleet run may not
// use, each with the code that needs it (the chart README's RBAC table names
// the same): the fleet has no PSTS objects, no exclusive subnets, no
// StatefulSet and no certificate renewal. Every other granted permission
// must show up in the audit log.
var notExercised = map[string]string{
	"admissionregistration.k8s.io mutatingwebhookconfigurations list":   informerList,
	"admissionregistration.k8s.io validatingwebhookconfigurations list": informerList,
	"apps statefulsets list":                             informerList,
	"cce.io podsubnettopologyspreads list":               informerList,
	"cce.io podsubnettopologyspreadtables list":          informerList,
	"cce.io subnets list":                                informerList,
	"cce.io ipclaims list":                               informerList,
	"coordination.k8s.io leases list":                    informerList,
	"core nodes list":                                    informerList,
	"core secrets list":                                  informerList,
	"apps statefulsets get":                              "ipam/gc.go: fixed-IP GC reads a StatefulSet missing from the cache",
	"cce.io ipclaims create":                             ipclaimLedger,
	"cce.io ipclaims get":                                ipclaimLedger,
	"cce.io ipclaims update":                             ipclaimLedger,
	"cce.io ipclaims delete":                             ipclaimLedger,
	"cce.io podsubnettopologyspreads get":                "ipam/psts.go: a PSTS missing from the cache (no PSTS in the fleet)",
	"cce.io podsubnettopologyspreads create":             "spread/table.go: the PSTT controller keeps a table's PSTS objects",
	"cce.io podsubnettopologyspreads update":             "spread/table.go: the PSTT controller keeps a table's PSTS objects",
	"cce.io podsubnettopologyspreads delete":             "spread/table.go: the PSTT controller keeps a table's PSTS objects",
	"cce.io podsubnettopologyspreads/status update":      "spread: the PSTS status (no PSTS in the fleet)",
	"cce.io podsubnettopologyspreadtables/status update": "spread/table.go: the PSTT status (no PSTT in the fleet)",
	"cce.io workloadendpoints patch":                     "ipam/fencing.go stampKnownWEP: a fixed-IP wep kept on release (no StatefulSet in the fleet)",
	"core events create": "the event recorder (CreateNewENI, AllocateIPFailed, GC events), asynchronous: " +
		"a short run may stop before one is sent; the operator calls' Events (package operator, no ipamctl in the fleet)",
	"core events patch":   "client-go's event recorder: a repeated event's count",
	"core secrets update": "webhook certificate renewal; completing a key Secret without forward-key",
}

const (
	informerList  = "informer's initial list: this client-go lists through a streaming watch, and lists where the API server cannot stream"
	ipclaimLedger = "ipclaim: the exclusive-subnet address ledger (no PSTS Fixed, Manual or Custom in the fleet)"
)

// checkRBACUsed compares the requests the API server recorded for user (its
// audit log) with the rendered ClusterRoles and Roles: every request was
// authorized (an admission refusal, such as the fence probes' by design, is
// not an RBAC matter), every granted (group, resource, verb) was used or is
// in notExercised. The replicas' render has one ClusterRole and one Role;
// the helm test hook's (renderTestHook) only a Role, checked with no
// exemptions.
func checkRBACUsed(t *testing.T, objs []*unstructured.Unstructured, user string, notExercised map[string]string) {
	t.Helper()
	events, err := cp.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	key := func(group, resource, verb string) string {
		return choose(group == "", "core", group) + " " + resource + " " + verb
	}
	used := map[string]int{}
	beforeAuthz := 0
	for _, e := range events {
		if e.User != user || e.Resource == "" {
			continue
		}
		// Answered before the authorizer ran: API Priority and Fairness
		// rejects (429) and timeouts come ahead of authorization in the API
		// server's handler chain, so such a request carries no decision. Not
		// an RBAC matter (the client retries it); seen under load ~10 on two
		// cores.
		if e.Decision == "" && (e.Code == http.StatusTooManyRequests || e.Code >= 500) {
			beforeAuthz++
			continue
		}
		res := e.Resource
		if e.Subresource != "" {
			res += "/" + e.Subresource
		}
		k := key(e.Group, res, e.Verb)
		used[k]++
		if e.Decision != "allow" {
			t.Errorf("not authorized (%q): %s %s/%s", e.Decision, k, e.Namespace, e.Name)
		}
	}
	if len(used) == 0 {
		t.Fatalf("no request of %s in the audit log", user)
	}
	granted := map[string]bool{}
	var roles []*unstructured.Unstructured
	for _, kind := range []string{"ClusterRole", "Role"} {
		roles = append(roles, find(objs, kind)...)
	}
	if len(roles) == 0 {
		t.Fatal("no ClusterRole or Role rendered")
	}
	for _, role := range roles {
		for _, r := range typed[rbacv1.ClusterRole](t, role).Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						granted[key(g, res, v)] = true
					}
				}
			}
		}
	}
	var unused, stale []string
	for k := range granted {
		if _, exempt := notExercised[k]; used[k] == 0 && !exempt {
			unused = append(unused, k)
		}
	}
	for k := range notExercised {
		if !granted[k] {
			stale = append(stale, k+" (not granted)")
		}
	}
	sort.Strings(unused)
	sort.Strings(stale)
	t.Logf("used: %v (and %d requests answered before authorization: 429 or 5xx)", used, beforeAuthz)
	if len(unused) > 0 {
		t.Errorf("granted but not used by the fleet (remove it, or name the code in notExercised): %v", unused)
	}
	if len(stale) > 0 {
		t.Errorf("notExercised lists permissions the chart does not grant: %v", stale)
	}
}

// startBCESim runs bce-sim with the fleet's world; ListENIs is limited hard
// so that throttling (429 RateLimit) really happens and its panel has data.
func startBCESim(t *testing.T) string {
	t.Helper()
	p := startProcess(t, "bce-sim", bin(t, "bce-sim"), []string{"--listen", "127.0.0.1:0",
		"--credential", fleetAK + ":" + fleetSK, "--vpc", fleetVPC,
		"--subnet", fleetSubnet + "," + fleetZone + ",10.40.0.0/16", "--security-group", fleetGroup,
		"--attach-delay", "200ms", "--rate-limit", "ListENIs=1:1", "--log-level", "warn"}, nil)
	select {
	case line := <-p.FirstLine():
		line = strings.TrimSpace(line)
		if _, _, err := net.SplitHostPort(strings.TrimPrefix(line, "http://")); err != nil {
			t.Fatalf("bce-sim printed %q, want its address", line)
		}
		if !strings.HasPrefix(line, "http://") {
			line = "http://" + line
		}
		return line
	case <-time.After(30 * time.Second):
		t.Fatal("bce-sim printed no address within 30s")
	}
	return ""
}

// applyRBACAndGetKubeconfig creates the rendered ServiceAccount, roles and
// bindings, and returns a kubeconfig with a token of that ServiceAccount.
func applyRBACAndGetKubeconfig(t *testing.T, ctx context.Context, ns string, objs []*unstructured.Unstructured) string {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cp.Config)))
	var sa string
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		o := one(t, objs, kind)
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatal(err)
		}
		ri := dynamic.ResourceInterface(dyn.Resource(m.Resource))
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: "charttest",
			Force:        new(true),
		}); err != nil {
			t.Fatalf("apply %s %s: %v", kind, o.GetName(), err)
		}
		if o.GetNamespace() == "" { // cluster-scoped: outlives the namespace
			name := o.GetName()
			t.Cleanup(func() {
				if err := ri.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete %s %s: %v", kind, name, err)
				}
			})
		}
		if kind == "ServiceAccount" {
			sa = o.GetName()
		}
	}
	// The wep fencing policies and their bindings (cluster-scoped): the
	// replicas' wep writes go through them. And the webhook configurations,
	// whose caBundle the replicas keep (the pod webhook skips the release
	// namespace, where this test's pods are).
	applied := 0
	for _, o := range objs {
		kind := o.GetKind()
		switch kind {
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
			"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		default:
			continue
		}
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatal(err)
		}
		ri := dyn.Resource(m.Resource)
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: "charttest",
			Force:        new(true),
		}); err != nil {
			t.Fatalf("apply %s %s: %v", kind, o.GetName(), err)
		}
		name := o.GetName()
		t.Cleanup(func() {
			if err := ri.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s %s: %v", kind, name, err)
			}
		})
		applied++
	}
	if applied == 0 {
		t.Fatal("the render has no wep fencing policy")
	}
	if n := len(find(objs, "MutatingWebhookConfiguration")) + len(find(objs, "ValidatingWebhookConfiguration")); n != 2 {
		t.Fatalf("the render has %d webhook configurations, want 2", n)
	}
	if d := deployment(t, objs); d.Spec.Template.Spec.ServiceAccountName != sa {
		t.Fatalf("pods run as %q, the chart's ServiceAccount is %q", d.Spec.Template.Spec.ServiceAccountName, sa)
	}
	tok, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{
		Server:               cp.Config.Host,
		CertificateAuthority: cp.Config.CAFile,
	}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["sa"] = &clientcmdapi.Context{
		Cluster:   "local",
		AuthInfo:  sa,
		Namespace: ns,
	}
	cfg.CurrentContext = "sa"
	path := filepath.Join(t.TempDir(), "sa.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

type replica struct {
	proc                  *supervisor.Process
	grpcAddr, metricsAddr string
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand does what the kubelet does to args and env values: $(VAR) becomes
// the variable's value when it is defined, $$ becomes $.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// startReplica runs bin/cce-ipam as the kubelet would run the rendered
// container, with only the substitutions described on the test.
func startReplica(t *testing.T, i int, ns string, objs, secretsFrom []*unstructured.Unstructured, joinAddr, kubeconfig string) *replica {
	t.Helper()
	d := deployment(t, objs)
	c := container(t, d)
	if len(c.Command) > 0 {
		t.Fatalf("the container overrides the image entrypoint with %v; this test runs bin/cce-ipam", c.Command)
	}
	podName := fmt.Sprintf("%s-6c9d8f7b5d-r%d", d.Name, i)

	env := map[string]string{}
	var envList []string
	for _, e := range c.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = expand(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			v = map[string]string{"metadata.name": podName, "metadata.namespace": ns,
				"status.podIP": "127.0.0.1"}[e.ValueFrom.FieldRef.FieldPath]
			if v == "" {
				t.Fatalf("env %s: fieldRef %s is not supplied by this test", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			v = strconv.FormatInt(c.Resources.Limits.Memory().Value(), 10)
		default:
			t.Fatalf("env %s: source %+v is not supplied by this test", e.Name, e.ValueFrom)
		}
		env[e.Name] = v
		envList = append(envList, e.Name+"="+v)
	}

	// Secret volumes: the rendered Secrets' items, written where the pod would see them.
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		var vol *corev1.Volume
		for k := range d.Spec.Template.Spec.Volumes {
			if d.Spec.Template.Spec.Volumes[k].Name == m.Name {
				vol = &d.Spec.Template.Spec.Volumes[k]
			}
		}
		if vol == nil || vol.Secret == nil {
			t.Fatalf("volume mount %s: only Secret volumes are supported here", m.Name)
		}
		secret := typed[corev1.Secret](t, one(t, secretsFrom, "Secret", vol.Secret.SecretName))
		dir := filepath.Join(t.TempDir(), m.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, item := range vol.Secret.Items {
			data, ok := secret.Data[item.Key]
			if !ok {
				t.Fatalf("Secret %s has no key %s", secret.Name, item.Key)
			}
			if err := os.WriteFile(filepath.Join(dir, item.Path), data, 0o400); err != nil {
				t.Fatal(err)
			}
		}
		mounts[m.MountPath] = dir
	}

	peers := ""
	for _, s := range find(objs, "Service") {
		if s.GetLabels()["app.kubernetes.io/component"] == "peers" {
			peers = s.GetName()
		}
	}
	var args []string
	var grpcAddr, metricsAddr string
	joinSeen := false
	for _, a := range c.Args {
		a = expand(a, env)
		for mountPath, dir := range mounts {
			a = strings.ReplaceAll(a, mountPath, dir)
		}
		name, value, _ := strings.Cut(a, "=")
		switch name {
		case "--memberlist-join-dns":
			want := fmt.Sprintf("%s.%s.svc.cluster.local:", peers, ns)
			if !strings.HasPrefix(value, want) {
				t.Fatalf("%s = %q, want the headless Service %s…", name, value, want)
			}
			a, joinSeen = name+"="+joinAddr, true
		case "--grpc-listen":
			grpcAddr = value
		case "--metrics-listen":
			metricsAddr = value
		case "--kubeconfig":
			t.Fatal("the chart passes --kubeconfig; pods use the in-cluster config")
		}
		args = append(args, a)
	}
	if !joinSeen || grpcAddr == "" || metricsAddr == "" {
		t.Fatalf("rendered args lack the join DNS name, the gRPC or the metrics listener: %q", c.Args)
	}
	args = append(args, "--kubeconfig="+kubeconfig)
	t.Logf("replica %d: cce-ipam %s", i, strings.Join(args, " "))
	return &replica{
		proc:     startProcess(t, fmt.Sprintf("replica-%d", i), bin(t, "cce-ipam"), args, envList),
		grpcAddr: grpcAddr, metricsAddr: metricsAddr,
	}
}

// startKubelet registers the simulated nodes and runs the kubelet
// simulator, which spreads its CNI calls over every replica.
func startKubelet(t *testing.T, ctx context.Context, ns, simURL string, grpcAddrs []string, kube kubernetes.Interface,
	cs cceclient.Interface) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = simURL
	bceCfg.AccessKeyID = fleetAK
	bceCfg.SecretAccessKey = fleetSK
	bceCfg.Rate = 200
	bceCfg.Burst = 50
	client, err := cloud.New(bceCfg,
		log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	cfg := kubeletsim.DefaultConfig()
	cfg.Name, cfg.CNIEndpoints, cfg.Namespace = "charttest", grpcAddrs, ns
	cfg.CNITimeout, cfg.RetryMax = 30*time.Second, 2*time.Second
	cfg.ClusterID, cfg.VPCID, cfg.SubnetID, cfg.Zone = fleetCluster, fleetVPC, fleetSubnet, fleetZone
	cfg.SecurityGroupIDs = []string{fleetGroup}
	cfg.InstanceMemoryGB, cfg.IPPool = 64, true
	sim, err := kubeletsim.New(cfg, kubeletsim.Deps{
		Kube:      kube,
		CCE:       cs,
		Instances: kubeletsim.AdminInstances(simURL, &http.Client{Timeout: 30 * time.Second}),
		ENIs:      client,
	},
		log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	simCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sim.Run(simCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && simCtx.Err() == nil {
			t.Errorf("kubelet simulator: %v", err)
		}
	})
	select {
	case <-sim.Synced():
	case err := <-done:
		t.Fatalf("kubelet simulator stopped: %v", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	// The simulator runs before the nodes exist, so the waiting pods are
	// bound to each node as it appears, and their CNI calls race the
	// replicas' first rebuild of it: calls wait for an owner, as they do in
	// a hand-over (the dashboard's owner-wait panel needs that data).
	names := kubeletsim.NodeNames("chart", 0, fleetNodes)
	t.Cleanup(func() {
		bg := context.Background()
		for _, n := range names {
			_ = kube.CoreV1().Nodes().Delete(bg, n, metav1.DeleteOptions{})
			_ = cs.CceV1alpha1().IPPools(cce.IPPoolNamespace).Delete(bg, cce.IPPoolName(n), metav1.DeleteOptions{})
		}
	})
	if _, err := sim.RegisterNodes(ctx, names); err != nil {
		t.Fatal(err)
	}
}

// createGhostIPPool leaves the node agent's IPPool of a node that no longer
// exists, as a removed node does; the leader's GC deletes it (a GC action).
func createGhostIPPool(t *testing.T, ctx context.Context, cs cceclient.Interface) {
	t.Helper()
	const node = "chart-removed-node"
	_, err := cs.CceV1alpha1().IPPools(cce.IPPoolNamespace).Create(ctx, &cce.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: cce.IPPoolName(node)},
		Spec: cce.IPPoolSpec{
			NodeSelector:   "kubernetes.io/hostname=" + node,
			CreationSource: cce.IPPoolCreationSourceCNI,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CceV1alpha1().IPPools(cce.IPPoolNamespace).Delete(context.Background(), cce.IPPoolName(node), metav1.DeleteOptions{})
	})
}

func createPod(t testing.TB, ctx context.Context, kube kubernetes.Interface, ns, name string) {
	t.Helper()
	if err := createPodErr(ctx, kube, ns, name); err != nil {
		t.Fatal(err)
	}
}

func createPodErr(ctx context.Context, kube kubernetes.Interface, ns, name string) error {
	_, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{"app": "web"},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "app",
			Image: "registry.k8s.io/pause:3.10",
		}},
			TerminationGracePeriodSeconds: new(int64(0))},
	}, metav1.CreateOptions{})
	return err
}

func runningWithIP(ctx context.Context, kube kubernetes.Interface, ns string) (int, error) {
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			n++
		}
	}
	return n, nil
}

// churnPods replaces three pods every second until done: ReleaseIP and
// AllocateIP keep flowing while Prometheus scrapes.
func churnPods(ctx context.Context, kube kubernetes.Interface, ns string, done <-chan struct{}) {
	next := fleetPods
	for victim := 0; ; {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		for range 3 {
			_ = kube.CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("web-%d", victim), metav1.DeleteOptions{})
			_ = createPodErr(ctx, kube, ns, fmt.Sprintf("web-%d", next))
			victim, next = victim+1, next+1
		}
	}
}

// startPrometheus runs a real Prometheus scraping every replica each second
// (runPrometheus) and returns its URL once it is ready.
func startPrometheus(t *testing.T, promBin string, replicas []*replica) string {
	t.Helper()
	var addrs []string
	for _, r := range replicas {
		addrs = append(addrs, r.metricsAddr)
	}
	return runPrometheus(t, promBin, addrs, "")
}

// runPrometheus runs a real Prometheus that scrapes the metrics addresses
// each second as job cce-ipam and, when ruleFile is not empty, evaluates
// its rules each second; it returns its URL once it is ready.
func runPrometheus(t *testing.T, promBin string, metricsAddrs []string, ruleFile string) string {
	t.Helper()
	var targets []string
	for _, a := range metricsAddrs {
		targets = append(targets, strconv.Quote(a))
	}
	dir := t.TempDir()
	rules := ""
	if ruleFile != "" {
		rules = "rule_files: [" + strconv.Quote(ruleFile) + "]\n"
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
%sscrape_configs:
  - job_name: cce-ipam
    static_configs:
      - targets: [%s]
`, rules, strings.Join(targets, ", "))
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeport.Addr(t)
	p := startProcess(t, "prometheus", promBin, []string{"--config.file=" + configPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"), "--web.listen-address=" + addr, "--log.level=warn"},
		[]string{"HOME=" + dir})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eventually(t, ctx, 200*time.Millisecond, "prometheus ready", func() error {
		if err := alive(p); err != nil {
			cancel()
			return err
		}
		return httpStatus("http://" + addr + "/-/ready")
	})
	return "http://" + addr
}

type dashboardQuery struct{ panel, expr string }

// grafanaVars are what Grafana substitutes before a query reaches Prometheus:
// the job of the test's scrape config, every replica, every cluster (the
// "All" of the cluster variable, which also matches the test's series without
// a cluster label), a rate window that spans a few scrapes.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$__range", "5m",
	"${job}", "cce-ipam", "$job", "cce-ipam", "${instance}", ".*", "$instance", ".*",
	"${cluster}", ".*", "$cluster", ".*")

// dashboardQueries returns every PromQL expression of the dashboard: panel
// targets (rows included) and template variable queries (label_values(m, l)
// needs m to exist), with Grafana's variables substituted.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "cce-ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string  `json:"title"`
		Type    string  `json:"type"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var dash struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var out []dashboardQuery
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q has an empty query", p.Title)
					continue
				}
				out = append(out, dashboardQuery{p.Title, grafanaVars.Replace(tg.Expr)})
			}
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		sub := labelValues.FindStringSubmatch(strings.TrimSpace(q))
		if sub == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, q)
			continue
		}
		out = append(out, dashboardQuery{"variable " + v.Name, grafanaVars.Replace(fmt.Sprintf("count by (%s) (%s)", sub[2], sub[1]))})
	}
	if len(out) < 40 {
		t.Fatalf("only %d queries found in the dashboard", len(out))
	}
	for _, q := range out {
		if strings.Contains(q.expr, "$") {
			t.Fatalf("panel %q: unsubstituted variable in %s", q.panel, q.expr)
		}
	}
	return out
}

// promQuery runs an instant query and returns the number of result series
// (a scalar counts as one).
func promQuery(ctx context.Context, base, expr string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	if r.Data.ResultType == "scalar" || r.Data.ResultType == "string" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(r.Data.Result, &series); err != nil {
		return 0, err
	}
	return len(series), nil
}

// promRaw returns the result of an instant query as compact text, for logs.
func promRaw(ctx context.Context, base, expr string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return err.Error()
	}
	var parts []string
	for _, s := range r.Data.Result {
		parts = append(parts, fmt.Sprintf("%v=%v", s.Metric, s.Value[1]))
	}
	return strings.Join(parts, " ")
}

func httpStatus(u string) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func httpGet(u string) (string, error) {
	resp, err := http.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", u, resp.Status)
	}
	return string(body), err
}
