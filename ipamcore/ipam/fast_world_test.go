package ipam_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	ccefake "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/fake"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// The fast fixture runs the IPAM's allocation, release, rollback,
// repeated-ADD and GC paths under a plain `go test`, in milliseconds: the
// real cloud client against an in-process bce-sim on 127.0.0.1, fake
// clientsets for pods, nodes, StatefulSets and WorkloadEndpoints, and a fake
// clock that the test steps past cooldowns and grace periods. What depends
// on the API server's semantics (field selectors, finalizers,
// resourceVersion conflicts, admission) stays in the integration tests.

const (
	fastAK      = "AKFASTTEST"
	fastSK      = "SKfastTestSecret"
	fastVPC     = "vpc-fast"
	fastZone    = "cn-bj-a"
	fastCluster = "cce-fasttest"
	fastNS      = "default"
	fastMemGB   = 128
)

// fastWorld is one test's world: one node backed by a bce-sim instance with
// one attached ENI (as the node agent leaves it), served by a running IPAM.
type fastWorld struct {
	t        *testing.T
	ctx      context.Context
	clock    *clocktesting.FakeClock
	sim      *bcesim.Server
	cloud    *cloud.Client
	kube     *kubefake.Clientset
	cce      *ccefake.Clientset
	ipam     *ipam.IPAM
	node     string
	instance string
	subnet   netip.Prefix
}

// fastConfig is the IPAM config of the fast tests: the defaults with a small
// pool, and periods long enough that only the test's clock steps fire them.
func fastConfig() ipam.Config {
	c := ipam.DefaultConfig()
	c.IdleMin = 2
	c.IdleMax = 4
	c.BatchAdd = 2
	c.PoolCheckPeriod = time.Hour
	c.AllocateWait = time.Hour
	c.ENISyncPeriod = time.Hour
	c.LeakedENIAge = time.Hour
	c.GCPeriod = time.Hour
	return c
}

func newFastWorld(t *testing.T, cfg ipam.Config) *fastWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &fastWorld{
		t:     t,
		ctx:   ctx,
		clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		kube:  kubefake.NewClientset(),
		cce:   ccefake.NewSimpleClientset(),
		node:  "fast-node-0",
	}
	w.startCloud()
	w.addNode()
	cfg.ClusterID, cfg.VPCID = fastCluster, fastVPC
	w.startIPAM(cfg)
	return w
}

// startCloud starts bce-sim with a subnet, a security group and an instance
// with one attached ENI, and the real cloud client in front of it.
func (w *fastWorld) startCloud() {
	t := w.t
	sim, err := bcesim.New(bcesim.Config{Credentials: map[string]string{fastAK: fastSK}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	w.sim = sim
	w.subnet = netip.MustParsePrefix("10.1.0.0/24")
	subnet, err := sim.AddSubnet(bcesim.SubnetSpec{
		ID:       "sbn-fast",
		ZoneName: fastZone,
		CIDR:     w.subnet.String(),
		VPCID:    fastVPC,
	})
	if err != nil {
		t.Fatal(err)
	}
	sg, err := sim.AddSecurityGroup(bcesim.SecurityGroupSpec{
		ID:    "g-fast",
		VPCID: fastVPC,
	})
	if err != nil {
		t.Fatal(err)
	}
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = sim.URL()
	bceCfg.AccessKeyID = fastAK
	bceCfg.SecretAccessKey = fastSK
	bceCfg.Rate = 1e6
	bceCfg.Burst = 1e6
	bceCfg.SDKRetryBase = time.Millisecond
	bceCfg.ThrottleBackoff = time.Millisecond
	w.cloud, err = cloud.New(bceCfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.cloud.Close)
	w.instance, err = sim.AddInstance(bcesim.InstanceSpec{
		ID:               "i-fast-0",
		SubnetID:         subnet,
		CPUCount:         16,
		MemoryGB:         fastMemGB,
		SecurityGroupIDs: []string{sg},
	})
	if err != nil {
		t.Fatal(err)
	}
	eni, err := w.cloud.CreateENI(w.ctx, cloud.CreateENIRequest{
		Name:             fastCluster + "/" + w.instance + "/" + w.node + "/000000",
		SubnetID:         subnet,
		SecurityGroupIDs: []string{sg},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cloud.AttachENI(w.ctx, eni, w.instance); err != nil {
		t.Fatal(err)
	}
}

// addNode creates the Node object of the instance.
func (w *fastWorld) addNode() {
	_, err := w.kube.CoreV1().Nodes().Create(w.ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: w.node,
			Annotations: map[string]string{
				cce.AnnotationMaxIPPerENI: strconv.Itoa(bcesim.MaxIPsPerENI(fastMemGB)),
			},
		},
		Spec: corev1.NodeSpec{ProviderID: "cce://" + w.instance},
	}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
}

// startIPAM runs the IPAM and serves the node; the test's end stops it.
func (w *fastWorld) startIPAM(cfg ipam.Config) {
	t := w.t
	deps := ipam.Deps{
		Kube:  w.kube,
		CCE:   w.cce,
		Cloud: w.cloud,
		Clock: w.clock,
	}
	ip, err := ipam.New(cfg, deps, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- ip.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("ipam Run: %v", err)
		}
	})
	if err := ip.ServeNode(ctx, w.node); err != nil {
		t.Fatalf("serve %s: %v", w.node, err)
	}
	w.ipam = ip
}

// createPod creates a pod bound to the node, as the scheduler leaves it,
// and waits until the node's pod watch has it.
func (w *fastWorld) createPod(name string) podip.PodRef {
	w.t.Helper()
	return w.createPodObject(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name:      name,
		Namespace: fastNS,
	}})
}

func (w *fastWorld) createPodObject(pod *corev1.Pod) podip.PodRef {
	w.t.Helper()
	pod.Spec = corev1.PodSpec{
		NodeName:   w.node,
		Containers: []corev1.Container{{Name: "c", Image: "pause"}},
	}
	if _, err := w.kube.CoreV1().Pods(fastNS).Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	w.waitFor("the node's pod watch to see "+pod.Name, func() bool {
		_, ok := w.ipam.PodFromCache(w.node, fastNS, pod.Name)
		return ok
	})
	return podip.PodRef{
		Namespace:   fastNS,
		Name:        pod.Name,
		ContainerID: sandboxID(pod.Name, 1),
		Node:        w.node,
	}
}

// createStsPod creates a fixed-IP pod of a StatefulSet with `replicas`.
func (w *fastWorld) createStsPod(sts string, ordinal int, replicas int32) podip.PodRef {
	w.t.Helper()
	set, err := w.kube.AppsV1().StatefulSets(fastNS).Create(w.ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{
			Name:      sts,
			Namespace: fastNS,
			UID:       types.UID("uid-" + sts),
		},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(replicas)},
	}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return w.createPodObject(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name:        sts + "-" + strconv.Itoa(ordinal),
		Namespace:   fastNS,
		Annotations: map[string]string{cce.AnnotationStsEnableFixIP: cce.EnableFixIPTrue},
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1",
			Kind:       "StatefulSet",
			Name:       sts,
			UID:        set.UID,
			Controller: ptr.To(true),
		}},
	}})
}

// deletePod deletes the pod and waits until the node's watch no longer has it.
func (w *fastWorld) deletePod(name string) {
	w.t.Helper()
	if err := w.kube.CoreV1().Pods(fastNS).Delete(w.ctx, name, metav1.DeleteOptions{}); err != nil {
		w.t.Fatal(err)
	}
	w.waitFor("the node's pod watch to drop "+name, func() bool {
		_, ok := w.ipam.PodFromCache(w.node, fastNS, name)
		return !ok
	})
}

// sandboxID is the infra container ID of a pod's n-th sandbox.
func sandboxID(pod string, n int) string {
	return fmt.Sprintf("%s-sandbox-%d", pod, n)
}

// waitFor waits for the IPAM's own goroutines (a pod watch, the pool worker)
// to catch up with what the test just did. In process they take
// milliseconds; the bound only turns a hang into a failure. (10 s was once
// too short for a pod watch's delete on a machine at load 9, with the
// integration packages running beside this one.)
func (w *fastWorld) waitFor(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// allocate runs an ADD that must succeed.
func (w *fastWorld) allocate(ref podip.PodRef) podip.Endpoint {
	w.t.Helper()
	ep, err := w.ipam.Allocate(w.ctx, ref)
	if err != nil {
		w.t.Fatalf("allocate %s: %v", ref, err)
	}
	if addr, err := netip.ParseAddr(ep.IP); err != nil || !w.subnet.Contains(addr) {
		w.t.Fatalf("allocate %s: IP %q, want an address of %s", ref, ep.IP, w.subnet)
	}
	return ep
}

// release is a DEL, and waits until the release has finished (the DEL is
// answered once the wep's delete is marked; ReleaseSettledForTest).
func (w *fastWorld) release(ref podip.PodRef) (podip.Endpoint, bool, error) {
	w.t.Helper()
	ep, ok, err := w.ipam.Release(w.ctx, ref)
	w.ipam.ReleaseSettledForTest(ref.Namespace, ref.Name)
	return ep, ok, err
}

func (w *fastWorld) stats() datastore.NodeStats {
	w.t.Helper()
	st, err := w.ipam.Stats(w.node)
	if err != nil {
		w.t.Fatal(err)
	}
	return st
}

// wep returns the pod's WorkloadEndpoint, nil if there is none.
func (w *fastWorld) wep(name string) *cce.WorkloadEndpoint {
	w.t.Helper()
	got, err := w.cce.CceV1alpha1().WorkloadEndpoints(fastNS).Get(w.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return got
}

// record returns the datastore's record of an address; it must be on the node.
func (w *fastWorld) record(ip string) datastore.IPInfo {
	w.t.Helper()
	info, err := w.ipam.StoreForTest().LookupIP(netip.MustParseAddr(ip))
	if err != nil {
		w.t.Fatalf("look up %s: %v", ip, err)
	}
	if info.Node != w.node {
		w.t.Fatalf("%s is recorded on node %q, want %q", ip, info.Node, w.node)
	}
	return info
}

// verify checks the datastore's invariants (no address twice, counts add up).
func (w *fastWorld) verify() {
	w.t.Helper()
	if err := w.ipam.StoreForTest().Verify(); err != nil {
		w.t.Fatalf("datastore invariants: %v", err)
	}
}

// waitIdle waits until the pool worker has filled the pool to at least n idle
// addresses (it grows at once when the node is served, and when poked).
func (w *fastWorld) waitIdle(n int) {
	w.t.Helper()
	w.waitFor(fmt.Sprintf("%d idle addresses", n), func() bool {
		st, err := w.ipam.Stats(w.node)
		return err == nil && st.Idle-st.Cooling >= n
	})
}

// cloudHas reports whether the cloud lists ip on the ENI.
func (w *fastWorld) cloudHas(eniID, ip string) bool {
	w.t.Helper()
	eni, err := w.cloud.GetENI(w.ctx, eniID)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, p := range eni.PrivateIPs {
		if p.Address == ip {
			return true
		}
	}
	return false
}

func netipOf(ip string) netip.Addr { return netip.MustParseAddr(ip) }

// deleteNow deletes an object at once (the fake clientset has no grace
// periods; the option says what the test means).
var deleteNow = metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}

// heldAs returns the node's addresses held for reason why.
func (w *fastWorld) heldAs(why datastore.HoldReason) []netip.Addr {
	w.t.Helper()
	snap, err := w.ipam.StoreForTest().Snapshot(w.node)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []netip.Addr
	for _, es := range snap.ENIs {
		for _, ip := range es.IPs {
			if ip.State == datastore.StateHeld && ip.HoldReason == why {
				out = append(out, ip.Addr)
			}
		}
	}
	return out
}

// cloudCount is the number of secondary addresses the cloud lists on the ENI.
func (w *fastWorld) cloudCount(eniID string) int {
	w.t.Helper()
	eni, err := w.cloud.GetENI(w.ctx, eniID)
	if err != nil {
		w.t.Fatal(err)
	}
	n := 0
	for _, p := range eni.PrivateIPs {
		if !p.Primary {
			n++
		}
	}
	return n
}
