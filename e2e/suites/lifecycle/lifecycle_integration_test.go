//go:build integration

package lifecycle_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
)

var env *suite.Env

func TestMain(m *testing.M) { os.Exit(suite.Main(m, &env, false)) }

// One fleet serves every step, as one cluster serves a user's day; the
// invariant checker runs after the ordinary steps (with pool bounds) and
// again after the exhaustion step.
func TestLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	replicas := 1
	f := env.Fleet(t, fleet.Options{Name: "life", Nodes: 4, Replicas: replicas})
	top := t
	var namespaces []string
	ns := func(t *testing.T) string {
		n := suite.Namespace(t, f.Kube)
		namespaces = append(namespaces, n)
		return n
	}

	t.Run("DeploymentScaledUpAndDown", func(t *testing.T) {
		ns := ns(t)
		suite.CreateDeployment(ctx, t, f, ns, "web", 20)
		suite.IPs(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 20))
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "web", 40)
		suite.IPs(t, suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 40))
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "web", 5)
		pods := suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 5)
		weps := suite.WaitWEPs(ctx, t, f.CCE, ns, 5)
		for _, p := range pods {
			if w, ok := weps[p.Name]; !ok || w.Spec.IP != p.Status.PodIP {
				t.Errorf("pod %s has IP %s, its WorkloadEndpoint %+v", p.Name, p.Status.PodIP, w.Spec)
			}
		}
		suite.ScaleDeployment(ctx, t, f.Kube, ns, "web", 0)
		suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 0)
		suite.WaitWEPs(ctx, t, f.CCE, ns, 0)
	})

	t.Run("StatefulSetFixedIP", func(t *testing.T) {
		ns := ns(t)
		suite.CreateStatefulSet(ctx, t, f, ns, "db", 3, true)
		before := suite.WaitPods(ctx, t, f.Kube, ns, "app=db", 3)
		ips := suite.IPs(t, before)
		uids := map[string]string{}
		for _, p := range before {
			uids[p.Name] = string(p.UID)
		}
		suite.RolloutRestartStatefulSet(ctx, t, f.Kube, ns, "db")
		after := suite.WaitPods(ctx, t, f.Kube, ns, "app=db", 3, func(ps []corev1.Pod) bool {
			for _, p := range ps {
				if uids[p.Name] == string(p.UID) {
					return false // not replaced yet
				}
			}
			return true
		})
		for name, ip := range suite.IPs(t, after) {
			if ips[name] != ip {
				t.Errorf("%s came back with %s after a rolling restart, want its fixed IP %s", name, ip, ips[name])
			}
		}
		t.Logf("rolling restart kept %v", ips)

		suite.ScaleStatefulSet(ctx, t, f.Kube, ns, "db", 1)
		suite.WaitPods(ctx, t, f.Kube, ns, "app=db", 1)
		weps := suite.WaitWEPs(ctx, t, f.CCE, ns, 1) // the scaled-down pods' reservations are released
		if w, ok := weps["db-0"]; !ok || w.Spec.IP != ips["db-0"] {
			t.Errorf("db-0's WorkloadEndpoint %+v, want IP %s", w.Spec, ips["db-0"])
		}
		if err := f.Kube.AppsV1().StatefulSets(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		suite.WaitPods(ctx, t, f.Kube, ns, "app=db", 0)
		suite.WaitWEPs(ctx, t, f.CCE, ns, 0)
	})

	t.Run("NodeDeleted", func(t *testing.T) {
		ns := ns(t)
		nodes, err := f.AddNodes(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		node := nodes[0]
		for _, name := range []string{"n-0", "n-1", "n-2"} {
			spec := suite.PodSpec(f)
			spec.NodeName = node
			if _, err := f.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "pinned"}}, Spec: spec,
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		suite.WaitPods(ctx, t, f.Kube, ns, "app=pinned", 3)
		// The node goes away with its kubelet: no CNI DEL ever comes. Its
		// pods are force-deleted, as the pod GC controller does for pods of
		// a node that no longer exists; the IPAM must collect their
		// WorkloadEndpoints by itself.
		if err := f.DeleteNode(ctx, node); err != nil {
			t.Fatal(err)
		}
		if err := f.Kube.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
			metav1.ListOptions{LabelSelector: "app=pinned"}); err != nil {
			t.Fatal(err)
		}
		// GC runs every 5s here; two minutes is generous on a loaded machine.
		start := time.Now()
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer gcancel()
		suite.WaitWEPs(gctx, t, f.CCE, ns, 0)
		t.Logf("WorkloadEndpoints of the deleted node's pods collected in %s", time.Since(start).Round(time.Second))
	})

	t.Run("PSTS", func(t *testing.T) { lifecyclePSTS(ctx, t, top, f, ns) })

	check := func(t *testing.T, pool *invariants.PoolBounds) {
		chk, err := f.Checker(invariants.Config{Namespaces: namespaces, OrphanGrace: 30 * time.Second, Pool: pool,
			Claims: true, ClaimGrace: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if vs, err := chk.WaitClean(wctx, 2*time.Second); err != nil {
			t.Fatalf("invariants: %v\n%s", err, vs)
		}
	}
	t.Run("InvariantsWithPoolBounds", func(t *testing.T) {
		o := f.Options()
		check(t, &invariants.PoolBounds{Min: o.IdleMin, Max: o.IdleMax})
	})

	t.Run("PoolExhaustedEvent", func(t *testing.T) {
		ns := ns(t)
		// A /28 subnet: 16 addresses, a few reserved, one the node's ENI's
		// primary. 20 pods cannot all fit.
		if err := f.AddSubnet(ctx, "sbn-life-tiny", "10.99.0.0/28"); err != nil {
			t.Fatal(err)
		}
		nodes, err := f.AddNodesIn(ctx, 1, "sbn-life-tiny")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			spec := suite.PodSpec(f)
			spec.NodeName = nodes[0]
			if _, err := f.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "tiny-" + string(rune('a'+i)), Labels: map[string]string{"app": "tiny"}}, Spec: spec,
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		ectx, ecancel := context.WithTimeout(ctx, 3*time.Minute)
		defer ecancel()
		var failed *corev1.Event
		for failed == nil {
			list, err := f.Kube.CoreV1().Events(ns).List(ectx, metav1.ListOptions{FieldSelector: "reason=AllocateIPFailed"})
			if err == nil && len(list.Items) > 0 {
				failed = &list.Items[0]
				break
			}
			select {
			case <-ectx.Done():
				t.Fatalf("no AllocateIPFailed event for 20 pods on a /28 subnet: %v", ectx.Err())
			case <-time.After(time.Second):
			}
		}
		t.Logf("event on %s: %s: %s", failed.InvolvedObject.Name, failed.Reason, failed.Message)
		if !strings.Contains(failed.Message, "no idle IP") {
			t.Errorf("the AllocateIPFailed event does not say the pool is empty: %q", failed.Message)
		}
		// The kubelet side says it too, as kubelet would.
		suite.WaitEvent(ctx, t, f.Kube, ns, failed.InvolvedObject.Name, "FailedCreatePodSandBox")
		pods, err := f.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=tiny"})
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for i := range pods.Items {
			if suite.Running(&pods.Items[i]) {
				running++
			}
		}
		t.Logf("%d of 20 pods run on the /28 subnet's node", running)
		if running >= 16 {
			t.Errorf("%d pods Running on a subnet of 16 addresses", running)
		}
		if err := f.Kube.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=tiny"}); err != nil {
			t.Fatal(err)
		}
		suite.WaitWEPs(ctx, t, f.CCE, ns, 0)
	})

	t.Run("InvariantsAtEnd", func(t *testing.T) { check(t, nil) })
	ks := f.Kubelet().Stats()
	t.Logf("kubelet-sim: %d pods started, %d allocations (%d failed), %d releases; allocate p50 %s p99 %s",
		ks.PodsStarted, ks.Allocations, ks.AllocationErrors, ks.Releases, ks.AllocateLatency.P50, ks.AllocateLatency.P99)
}
