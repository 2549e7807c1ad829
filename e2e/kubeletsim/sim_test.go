package kubeletsim

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// scriptedCNI is a CNI backend that fails the first failAdds ADDs (and the
// first failDels DELs) of every pod and records every call.
type scriptedCNI struct {
	rpc.UnimplementedCNIBackendServer
	failAdds, failDels int

	mu    sync.Mutex
	adds  map[string][]string // pod → container IDs, in call order
	dels  map[string][]string
	nodes map[string]string // pod → K8sNodeName of the last ADD
	next  int
}

func newScriptedCNI(failAdds, failDels int) *scriptedCNI {
	return &scriptedCNI{failAdds: failAdds, failDels: failDels,
		adds: map[string][]string{}, dels: map[string][]string{}, nodes: map[string]string{}}
}

func (c *scriptedCNI) AllocateIP(_ context.Context, r *rpc.AllocateIPRequest) (*rpc.AllocateIPReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := r.K8SPodNamespace + "/" + r.K8SPodName
	c.adds[k] = append(c.adds[k], r.K8SPodInfraContainerID)
	c.nodes[k] = r.K8SNodeName
	if len(c.adds[k]) <= c.failAdds {
		return &rpc.AllocateIPReply{ErrMsg: "no idle IP on the node"}, nil
	}
	c.next++
	return &rpc.AllocateIPReply{IsSuccess: true, NetworkInfo: &rpc.AllocateIPReply_ENIMultiIP{
		ENIMultiIP: &rpc.ENIMultiIPReply{IP: fmt.Sprintf("10.0.0.%d", c.next)}}}, nil
}

func (c *scriptedCNI) ReleaseIP(_ context.Context, r *rpc.ReleaseIPRequest) (*rpc.ReleaseIPReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := r.K8SPodNamespace + "/" + r.K8SPodName
	c.dels[k] = append(c.dels[k], r.K8SPodInfraContainerID)
	if len(c.dels[k]) <= c.failDels {
		return &rpc.ReleaseIPReply{ErrMsg: "IPAM is busy"}, nil
	}
	return &rpc.ReleaseIPReply{IsSuccess: true}, nil
}

func (c *scriptedCNI) calls(pod string) (adds, dels []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.adds[pod]...), append([]string(nil), c.dels[pod]...)
}

// fixture runs a Simulator against a fake clientset (whose pods/binding
// sets spec.nodeName, as the API server does) and a scripted CNI server on
// 127.0.0.1.
type fixture struct {
	t    *testing.T
	kube *fake.Clientset
	cni  *scriptedCNI
	sim  *Simulator
}

func newFixture(t *testing.T, cni *scriptedCNI, nodes ...string) *fixture {
	t.Helper()
	return newFixtureWith(t, cni, func(*Config) {}, nodes...)
}

func newFixtureWith(t *testing.T, cni *scriptedCNI, mutate func(*Config), nodes ...string) *fixture {
	t.Helper()
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   n,
			Labels: map[string]string{LabelSimulator: "unit"},
		}})
	}
	kube := fake.NewClientset(objs...)
	kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := ca.GetObject().(*corev1.Binding)
		obj, err := kube.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		pod.Spec.NodeName = b.Target.Name
		return true, b, kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, b.Namespace)
	})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.RegisterCNIBackendServer(gs, cni)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-served
	})

	cfg := DefaultConfig()
	cfg.Name, cfg.CNIEndpoint, cfg.Workers = "unit", lis.Addr().String(), 4
	cfg.RetryBase, cfg.RetryMax = 5*time.Millisecond, 40*time.Millisecond
	mutate(&cfg)
	sim, err := New(cfg, Deps{Kube: kube}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-sim.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("simulator did not sync")
	}
	return &fixture{
		t:    t,
		kube: kube,
		cni:  cni,
		sim:  sim,
	}
}

func (f *fixture) createPod(name, node string) {
	f.t.Helper()
	_, err := f.kube.CoreV1().Pods("ns").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: "ns",
			UID:       types.UID("uid-ns-" + name),
		},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name:  "c",
				Image: "i",
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) pod(name string) *corev1.Pod {
	p, err := f.kube.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return p
}

func (f *fixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s; stats %+v", what, f.sim.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fixture) events(reason string) int {
	evs, err := f.kube.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Reason == reason {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// Every failed ADD uses a fresh sandbox whose network is torn down with the
// same container ID; the pod runs after the failures, with an event for each.
func TestSimulator_Sync_FailedAddsRetryInFreshSandboxes(t *testing.T) {
	f := newFixture(t, newScriptedCNI(3, 0), "n1")
	f.createPod("web", "") // unscheduled: bound to n1, the only node
	f.eventually("pod Running", func() bool {
		p := f.pod("web")
		return p != nil && p.Status.Phase == corev1.PodRunning
	})
	p := f.pod("web")
	adds, dels := f.cni.calls("ns/web")
	if len(adds) != 4 || len(dels) != 3 {
		t.Fatalf("ADDs %d, DELs %d; want 4 and 3", len(adds), len(dels))
	}
	seen := map[string]bool{}
	for i, id := range adds {
		if seen[id] || len(id) != 64 {
			t.Fatalf("ADD %d reused or malformed container ID %q", i, id)
		}
		seen[id] = true
		if i < 3 && dels[i] != id {
			t.Errorf("failed sandbox %d: ADD %s but DEL %s", i, id, dels[i])
		}
	}
	if p.Spec.NodeName != "n1" || f.cni.nodes["ns/web"] != "n1" {
		t.Errorf("pod on %q, ADD named node %q", p.Spec.NodeName, f.cni.nodes["ns/web"])
	}
	if p.Status.PodIP == "" || p.Status.ContainerStatuses[0].ContainerID != containerIDPrefix+adds[3] {
		t.Errorf("status %+v does not carry the last sandbox %s", p.Status, adds[3])
	}
	f.eventually("3 FailedCreatePodSandBox events", func() bool { return f.events("FailedCreatePodSandBox") >= 3 })
	if s := f.sim.Stats(); s.AllocationErrors != 3 || s.Allocations != 1 || s.Releases != 3 || s.Binds != 1 || s.Sandboxes != 1 {
		t.Errorf("stats %+v", s)
	}
}

// A deleted pod gets a DEL with its sandbox's container ID, retried (with a
// FailedKillPod event) until it succeeds, and only then is removed.
func TestSimulator_Sync_DeletionReleasesThenRemoves(t *testing.T) {
	f := newFixture(t, newScriptedCNI(0, 2), "n1")
	f.createPod("db", "n1")
	f.eventually("pod Running", func() bool {
		p := f.pod("db")
		return p != nil && p.Status.Phase == corev1.PodRunning
	})
	// Graceful deletion as the API server records it for a bound pod.
	p := f.pod("db")
	now := metav1.Now()
	p.DeletionTimestamp = &now
	if _, err := f.kube.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("pod removed", func() bool { return f.pod("db") == nil })
	adds, dels := f.cni.calls("ns/db")
	if len(adds) != 1 || len(dels) != 3 || dels[0] != adds[0] || dels[2] != adds[0] {
		t.Fatalf("ADDs %v, DELs %v: want 3 DELs of the one sandbox", adds, dels)
	}
	f.eventually("FailedKillPod events", func() bool { return f.events("FailedKillPod") >= 2 })
	f.eventually("state dropped", func() bool {
		s := f.sim.Stats()
		return s.Sandboxes == 0 && s.PodsDeleted == 1 && f.sim.NodeLoad("n1") == 0
	})
}

// Pods on other kubelets' nodes are left alone; pods bound to a node the
// simulator learns about later are picked up then.
func TestSimulator_Sync_OnlyOwnNodes(t *testing.T) {
	f := newFixture(t, newScriptedCNI(0, 0), "n1")
	f.createPod("other", "real-node")
	f.createPod("late", "n2")
	time.Sleep(100 * time.Millisecond)
	if adds, _ := f.cni.calls("ns/other"); len(adds) != 0 {
		t.Fatalf("ADD for a pod on another kubelet's node")
	}
	if adds, _ := f.cni.calls("ns/late"); len(adds) != 0 {
		t.Fatalf("ADD for a pod on an unknown node")
	}
	_, err := f.kube.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "n2",
			Labels: map[string]string{LabelSimulator: "unit"},
		}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.eventually("late pod Running", func() bool {
		p := f.pod("late")
		return p.Status.Phase == corev1.PodRunning
	})
	if p := f.pod("other"); p.Status.Phase != "" {
		t.Fatalf("pod of another node touched: %+v", p.Status)
	}
}

// With a lease period, every simulated node's heartbeat Lease is created,
// held by the node, and renewed; other nodes get none.
func TestSimulator_Run_RenewsNodeLeases(t *testing.T) {
	f := newFixtureWith(t, newScriptedCNI(0, 0), func(c *Config) { c.NodeLeasePeriod = 20 * time.Millisecond }, "n1", "n2")
	_, err := f.kube.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "real"}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leases := f.kube.CoordinationV1().Leases("kube-node-lease")
	var first time.Time
	f.eventually("leases renewed", func() bool {
		l, err := leases.Get(context.Background(), "n2", metav1.GetOptions{})
		if err != nil {
			return false
		}
		if first.IsZero() {
			first = l.Spec.RenewTime.Time
			if *l.Spec.HolderIdentity != "n2" || l.OwnerReferences[0].Kind != "Node" {
				t.Errorf("lease %+v", l)
			}
		}
		_, err = leases.Get(context.Background(), "n1", metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime.After(first)
	})
	if _, err := leases.Get(context.Background(), "real", metav1.GetOptions{}); err == nil {
		t.Fatal("lease written for a node the simulator does not play")
	}
}

// A pod for ManualScheduler is left unbound, for the test to place; once
// bound it runs like any other.
func TestSimulator_Sync_ManualSchedulerIsNotBound(t *testing.T) {
	f := newFixture(t, newScriptedCNI(0, 0), "n1")
	_, err := f.kube.CoreV1().Pods("ns").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "sts-0",
			Namespace: "ns",
			UID:       types.UID("uid-ns-sts-0"),
		},
		Spec: corev1.PodSpec{
			SchedulerName: ManualScheduler,
			Containers: []corev1.Container{{
				Name:  "c",
				Image: "i",
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.createPod("web", "") // a control: bound
	f.eventually("control pod Running", func() bool {
		p := f.pod("web")
		return p != nil && p.Status.Phase == corev1.PodRunning
	})
	if p := f.pod("sts-0"); p.Spec.NodeName != "" || f.sim.Stats().Binds != 1 {
		t.Fatalf("manual pod bound to %q (binds %d)", p.Spec.NodeName, f.sim.Stats().Binds)
	}
	p := f.pod("sts-0")
	p.Spec.NodeName = "n1" // as pods/binding would
	if _, err := f.kube.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually("manual pod Running once bound", func() bool {
		p := f.pod("sts-0")
		return p != nil && p.Status.Phase == corev1.PodRunning
	})
}
