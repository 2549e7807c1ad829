//go:build integration

package kubeletsim_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/kubeletsim/stack"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

var (
	cp          *cluster.Cluster
	installCRDs sync.Once
	crdErr      error
)

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

func crds(t *testing.T) {
	t.Helper()
	installCRDs.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		crdErr = cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds"))
	})
	if crdErr != nil {
		t.Fatal(crdErr)
	}
}

// createPods creates n unscheduled pods, as a Deployment's ReplicaSet would.
func createPods(t *testing.T, st *stack.Stack, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	for k := range n {
		_, err := st.Kube.CoreV1().Pods(st.Opts.Namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name:   fmt.Sprintf("%s-%03d", prefix, k),
				Labels: map[string]string{"app": prefix},
			},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name:  "app",
				Image: "registry.local/web:1",
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func listPods(t *testing.T, st *stack.Stack) []corev1.Pod {
	t.Helper()
	pods, err := st.Kube.CoreV1().Pods(st.Opts.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// A Deployment-like set of 200 unscheduled pods over 10 nodes: every pod is
// bound, gets a unique IP from the IPAM and runs; deleting them releases
// every IP and removes every WorkloadEndpoint; the invariants hold
// throughout and the pools settle within their bounds.
func TestSimulator_Run_DeploymentLifecycle(t *testing.T) {
	crds(t)
	const nodes, pods = 10, 200
	start := time.Now()
	st := stack.Start(t, cp.Config, stack.Options{
		Name:      "deploy",
		Nodes:     nodes,
		Namespace: cp.Namespace(t),
	})
	t.Logf("stack with %d nodes up in %s", nodes, time.Since(start).Round(time.Millisecond))
	// The API server keeps the node agent's extended resource (8 ENIs × 30
	// IPs), which PSTS pods request.
	n, err := st.Kube.CoreV1().Nodes().Get(context.Background(), st.Nodes[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c, a := n.Status.Capacity[cce.ResourceIP], n.Status.Allocatable[cce.ResourceIP]; c.Value() != 240 || a.Value() != 240 {
		t.Errorf("node %s advertises %s capacity %s, allocatable %s; want 240", n.Name, cce.ResourceIP, c.String(), a.String())
	}
	chk := st.Checker(invariants.Config{
		Namespaces:  []string{st.Opts.Namespace},
		OrphanGrace: 10 * time.Second,
	})

	start = time.Now()
	createPods(t, st, "web", pods)
	stack.Eventually(t, 90*time.Second, "all pods Running", func() (bool, string) {
		running := 0
		for _, p := range listPods(t, st) {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && ready(&p) {
				running++
			}
		}
		return running == pods, fmt.Sprintf("%d/%d running; sim %+v", running, pods, st.Kubelet.Stats())
	})
	t.Logf("%d pods Running in %s; sim stats %+v", pods, time.Since(start).Round(time.Millisecond), st.Kubelet.Stats())

	// Unique IPs, spread evenly, each on a simulated node and matching its wep.
	byIP := map[string]string{}
	perNode := map[string]int{}
	for _, p := range listPods(t, st) {
		if other, dup := byIP[p.Status.PodIP]; dup {
			t.Errorf("pods %s and %s share %s", other, p.Name, p.Status.PodIP)
		}
		byIP[p.Status.PodIP] = p.Name
		perNode[p.Spec.NodeName]++
		wep, err := st.CCE.CceV1alpha1().WorkloadEndpoints(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("wep of %s: %v", p.Name, err)
			continue
		}
		if wep.Spec.IP != p.Status.PodIP || wep.Spec.Node != p.Spec.NodeName || len(wep.Spec.ContainerID) != 64 {
			t.Errorf("pod %s: %s on %s, wep %s on %s (container %q)", p.Name, p.Status.PodIP, p.Spec.NodeName,
				wep.Spec.IP, wep.Spec.Node, wep.Spec.ContainerID)
		}
		if !strings.HasPrefix(p.Status.ContainerStatuses[0].ContainerID, "kubelet-sim://"+wep.Spec.ContainerID) {
			t.Errorf("pod %s: container status %q does not name the sandbox %s", p.Name,
				p.Status.ContainerStatuses[0].ContainerID, wep.Spec.ContainerID)
		}
	}
	for _, n := range st.NodeNames() {
		if perNode[n] != pods/nodes {
			t.Errorf("node %s runs %d pods, want %d (least-loaded placement)", n, perNode[n], pods/nodes)
		}
	}
	stats := st.Kubelet.Stats()
	if stats.Binds != pods || stats.PodsStarted != pods || stats.Allocations < pods || stats.Sandboxes != pods {
		t.Errorf("stats after start: %+v", stats)
	}
	if stats.AllocateLatency.Count != int(stats.Allocations) || stats.AllocateLatency.Max <= 0 || stats.StartupLatency.Count != pods {
		t.Errorf("latency stats: %+v", stats)
	}
	if vs, err := chk.Check(context.Background()); err != nil || len(vs) > 0 {
		t.Fatalf("invariants while running: err=%v\n%s", err, vs)
	}

	// Delete as a Deployment scaled to zero would: graceful deletion; the
	// simulated kubelet must DEL and then remove each pod.
	start = time.Now()
	err = st.Kube.CoreV1().Pods(st.Opts.Namespace).DeleteCollection(context.Background(), metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	stack.Eventually(t, 90*time.Second, "pods and weps gone", func() (bool, string) {
		left := len(listPods(t, st))
		weps, err := st.CCE.CceV1alpha1().WorkloadEndpoints(st.Opts.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return left == 0 && len(weps.Items) == 0, fmt.Sprintf("%d pods, %d weps left", left, len(weps.Items))
	})
	t.Logf("%d pods released and removed in %s", pods, time.Since(start).Round(time.Millisecond))
	// The simulator counts a pod deleted (and stops counting it on its node)
	// when its informer reports the deletion, which may trail the List above
	// by a watch event.
	stack.Eventually(t, 10*time.Second, "simulator saw every deletion", func() (bool, string) {
		stats = st.Kubelet.Stats()
		return stats.PodsDeleted == pods, fmt.Sprintf("%d of %d deletions seen", stats.PodsDeleted, pods)
	})
	if stats.Releases < pods || stats.PodsDeleted != pods || stats.Sandboxes != 0 {
		t.Errorf("stats after delete: %+v", stats)
	}
	stack.Eventually(t, 10*time.Second, "simulator counts no pods", func() (bool, string) {
		var counted []string
		for _, n := range st.NodeNames() {
			if l := st.Kubelet.NodeLoad(n); l != 0 {
				counted = append(counted, fmt.Sprintf("%s=%d", n, l))
			}
		}
		return len(counted) == 0, "still counted: " + strings.Join(counted, ", ")
	})

	// Once the pools settle, every node holds only idle IPs within bounds.
	settled := st.Checker(invariants.Config{Namespaces: []string{st.Opts.Namespace},
		Pool: &invariants.PoolBounds{
			Min: st.IPAMConfig.IdleMin,
			Max: st.IPAMConfig.IdleMax,
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if vs, err := settled.WaitClean(ctx, 500*time.Millisecond); err != nil {
		t.Fatalf("pools did not settle: %v\n%s", err, vs)
	}
	if err := st.BCE.Check(); err != nil {
		t.Fatalf("bce-sim invariants: %v", err)
	}
}

// A pod whose ADD fails is retried with backoff, each attempt in a fresh
// sandbox whose network is torn down, with a FailedCreatePodSandBox event;
// once the IPAM serves the node the pod runs.
func TestSimulator_Run_RetriesFailedAdd(t *testing.T) {
	crds(t)
	st := stack.Start(t, cp.Config, stack.Options{Name: "retry", Nodes: 1, Namespace: cp.Namespace(t), NoServe: true,
		Kubelet: func(c *kubeletsim.Config) { c.RetryBase, c.RetryMax = 50*time.Millisecond, 400*time.Millisecond }})
	createPods(t, st, "late", 1)
	stack.Eventually(t, 30*time.Second, "failed ADDs and an event", func() (bool, string) {
		evs, err := st.Kube.CoreV1().Events(st.Opts.Namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("reason", "FailedCreatePodSandBox").String()})
		if err != nil {
			return false, err.Error()
		}
		s := st.Kubelet.Stats()
		ok := s.AllocationErrors >= 3 && len(evs.Items) > 0 && strings.Contains(evs.Items[0].Message, "not served")
		return ok, fmt.Sprintf("stats %+v, %d events", s, len(evs.Items))
	})
	before := st.Kubelet.Stats()
	if before.Releases < before.AllocationErrors-1 {
		t.Errorf("failed sandboxes were not torn down: %+v", before)
	}
	if p := listPods(t, st)[0]; p.Status.Phase == corev1.PodRunning {
		t.Fatalf("pod runs although its ADD failed: %+v", p.Status)
	}
	st.Serve()
	stack.Eventually(t, 30*time.Second, "pod Running once served", func() (bool, string) {
		p := listPods(t, st)[0]
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", string(p.Status.Phase)
	})
	chk := st.Checker(invariants.Config{Namespaces: []string{st.Opts.Namespace}})
	if vs, err := chk.Check(context.Background()); err != nil || len(vs) > 0 {
		t.Fatalf("invariants: err=%v\n%s", err, vs)
	}
}

// Small instances (8 GB: 8 IPs per ENI, the primary included) cannot hold
// a node's pods on the pre-attached ENI: the IPAM must create more ENIs
// from the IPPool the simulated node agent wrote, and every pod still runs.
func TestSimulator_Run_PodsBeyondOneENI(t *testing.T) {
	crds(t)
	const nodes, pods = 2, 24
	st := stack.Start(t, cp.Config, stack.Options{
		Name:      "small",
		Nodes:     nodes,
		Namespace: cp.Namespace(t),
		MemoryGB:  8,
	})
	createPods(t, st, "svc", pods)
	stack.Eventually(t, 90*time.Second, "all pods Running", func() (bool, string) {
		s := st.Kubelet.Stats()
		return s.PodsStarted == pods, fmt.Sprintf("%+v", s)
	})
	enis := map[string]int{}
	for _, e := range st.BCE.Dump().ENIs {
		if e.Status == "inuse" {
			enis[e.InstanceID]++
		}
	}
	for _, n := range st.Nodes {
		// 12 pods need at least two ENIs of 7 secondary IPs each.
		if enis[n.InstanceID] < 2 {
			t.Errorf("node %s has %d in-use ENIs, want ≥ 2", n.Name, enis[n.InstanceID])
		}
	}
	chk := st.Checker(invariants.Config{Namespaces: []string{st.Opts.Namespace}})
	if vs, err := chk.Check(context.Background()); err != nil || len(vs) > 0 {
		t.Fatalf("invariants: err=%v\n%s", err, vs)
	}
}
