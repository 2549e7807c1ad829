//go:build integration

package migration_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/invariants"
	"github.com/cce-ipam/sharded/e2e/kubeletsim"
	"github.com/cce-ipam/sharded/e2e/suites/suite"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

const (
	takeoverNodes = 3
	podsPerNode   = 4 // pods the reference served on each node
	idlePerNode   = 2 // addresses of its warm pool on each node
)

// cce-ipam (3 replicas) takes over a cluster the reference ran: its
// schema-less CRDs stay (the chart's crds/ only adds the missing ones), its
// weps, Subnets and IPPools are as it wrote them. Every pod keeps its IP, new
// pods allocate, deleted pods release, the invariants hold with the owners'
// datastores, and the reference's metric names answer from the chart's
// recording rules.
func TestTakeover_FromReference(t *testing.T) {
	referenceCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := cp.Namespace(t) // the replicas' Leases and the pods: the fleet fences this namespace's weps
	f := fleet.Start(t, fleet.Options{SharedCluster: cp, KeepCRDs: true, Name: "mig", NoReplicas: true, NoKubelet: true,
		LeaseNamespace: ns, IdleMin: 2, IdleMax: 6})
	start := time.Now()

	// The reference's world.
	nodes, err := f.AddNodes(ctx, takeoverNodes)
	if err != nil {
		t.Fatal(err)
	}
	checkNodesAsReferenceAgent(ctx, t, f, nodes)
	rc := f.CCE.CceV1alpha1().RESTClient()
	createRaw(ctx, t, rc, cce.IPPoolNamespace, "subnets", referenceSubnet(f.SubnetID, fleet.Zone, f.Options().SubnetCIDR, 60000))
	var old []refPod
	for _, node := range nodes {
		inst := kubeletsim.InstanceID(node)
		enis, err := f.Cloud.ListENIs(ctx, cloud.ListENIsOptions{VPCID: f.VPCID, InstanceID: inst, NamePrefix: f.ClusterID + "/"})
		if err != nil || len(enis) != 1 {
			t.Fatalf("ENIs of %s: %v, %v; want the one the node agent attached", node, enis, err)
		}
		eni := enis[0]
		ips, err := f.Cloud.BatchAddPrivateIPs(ctx, eni.ID, cloud.BatchAddRequest{Count: podsPerNode + idlePerNode})
		if err != nil {
			t.Fatal(err)
		}
		// The reference's IPAM writes the pool's status: the node's ENIs.
		mergePatchRaw(ctx, t, rc, cce.IPPoolNamespace, "ippools", cce.IPPoolName(node), map[string]any{
			"status": map[string]any{"eni": map[string]any{"enis": map[string]any{eni.ID: map[string]any{
				"id": eni.ID, "mac": eni.MACAddress, "availabilityZone": fleet.Zone, "subnet": f.SubnetID, "vpc": f.VPCID,
				"interfaceIndex": 1, "addresses": addresses(eni, ips),
			}}}},
		})
		for k, ip := range ips[:podsPerNode] {
			p := refPod{name: fmt.Sprintf("ref-%s-%d", node, k), node: node, ip: ip, containerID: fmt.Sprintf("%064x", len(old)+1),
				eniID: eni.ID, mac: eni.MACAddress, instanceID: inst, subnetID: f.SubnetID}
			pod, st := runningPod(ns, f, p)
			created, err := f.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			created.Status = st
			if _, err := f.Kube.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			createRaw(ctx, t, rc, ns, "workloadendpoints", referenceWEP(ns, p))
			old = append(old, p)
		}
	}
	t.Logf("reference world: %d nodes, %d pods with IPs, %d idle addresses (%s)", len(nodes), len(old),
		len(nodes)*idlePerNode, time.Since(start).Round(time.Millisecond))

	// The switch-over: the reference is gone (scaled to 0); three replicas start.
	start = time.Now()
	for range 3 {
		if _, err := f.AddReplica(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.RestartKubelet(); err != nil { // the kubelets were there all along; now they reach cce-ipam
		t.Fatal(err)
	}
	t.Logf("3 replicas ready in %s", time.Since(start).Round(time.Millisecond))

	t.Run("EveryPodKeepsItsIP", func(t *testing.T) {
		// CheckIP answers from the owner's datastore: the address is
		// adopted as this pod's, through whichever replica is asked.
		replicas := f.Live()
		for i, p := range old {
			r := replicas[i%len(replicas)]
			var reply *rpc.CheckIPReply
			err := waitFor(ctx, 30*time.Second, func() error {
				var err error
				reply, err = r.CNI().CheckIP(ctx, &rpc.CheckIPRequest{K8SPodName: p.name, K8SPodNamespace: ns,
					K8SPodInfraContainerID: p.containerID, K8SNodeName: p.node})
				switch {
				case err != nil:
					return err
				case !reply.IsSuccess:
					return fmt.Errorf("CheckIP: %s", reply.ErrMsg)
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s: %v", p.name, err)
				continue
			}
			if got := reply.GetENIMultiIP(); got.GetIP() != p.ip || got.GetENIID() != p.eniID || got.GetNode() != p.node {
				t.Errorf("%s: CheckIP says %+v, want %s on %s/%s as the reference left it", p.name, got, p.ip, p.node, p.eniID)
			}
		}
	})

	var fresh []corev1.Pod
	t.Run("NewPodsAllocate", func(t *testing.T) {
		for k := range 6 {
			if _, err := f.Kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("new-%d", k), Labels: map[string]string{"app": "new"}},
				Spec:       suite.PodSpec(f),
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		fresh = suite.WaitPods(ctx, t, f.Kube, ns, "app=new", 6)
		oldIPs := map[string]bool{}
		for _, p := range old {
			oldIPs[p.ip] = true
		}
		for name, ip := range suite.IPs(t, fresh) {
			if oldIPs[ip] {
				t.Errorf("new pod %s got %s, an address a reference pod still holds", name, ip)
			}
		}
	})

	t.Run("DeletedPodsRelease", func(t *testing.T) {
		gone := old[:len(old)/2]
		for _, p := range gone {
			if err := f.Kube.CoreV1().Pods(ns).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				t.Fatal(err)
			}
		}
		err := waitFor(ctx, time.Minute, func() error {
			for _, p := range gone {
				if _, err := f.CCE.CceV1alpha1().WorkloadEndpoints(ns).Get(ctx, p.name, metav1.GetOptions{}); err == nil {
					return fmt.Errorf("wep %s still exists", p.name)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("the deleted reference pods' weps: %v", err)
		}
		// Their addresses are named by no wep (no pod was created since, so
		// none may have been handed out again); the invariant checker below
		// compares the owners' datastores with the weps.
		weps, err := f.CCE.CceV1alpha1().WorkloadEndpoints(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range weps.Items {
			if slices.ContainsFunc(gone, func(p refPod) bool { return p.ip == w.Spec.IP }) {
				t.Errorf("wep %s names %s, released with its reference pod", w.Name, w.Spec.IP)
			}
		}
		old = old[len(old)/2:]
	})

	t.Run("Invariants", func(t *testing.T) {
		chk, err := f.Checker(invariants.Config{Namespaces: []string{ns}, OrphanGrace: 30 * time.Second,
			WEPAddresses: true, GhostGrace: 30 * time.Second, Pools: f.NodePool})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if vs, err := chk.WaitClean(wctx, 2*time.Second); err != nil {
			t.Fatalf("invariants: %v\n%s", err, vs)
		}
		// The survivors still hold the IPs the reference gave them.
		pods, err := f.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=ref"})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, p := range pods.Items {
			got[p.Name] = p.Status.PodIP
		}
		for _, p := range old {
			w, err := f.CCE.CceV1alpha1().WorkloadEndpoints(ns).Get(ctx, p.name, metav1.GetOptions{})
			if err != nil || got[p.name] != p.ip || w.Spec.IP != p.ip {
				t.Errorf("%s: pod IP %q, wep %v (%v); want %s", p.name, got[p.name], w, err, p.ip)
			}
		}
	})

	t.Run("ReferenceMetricNames", func(t *testing.T) { referenceMetricsAnswer(ctx, t, f) })
}

// checkNodesAsReferenceAgent: the simulated nodes carry what the reference's
// node agent writes and the reference's IPAM reads (BCC instance type, the
// capacity annotations, a cce:// provider ID).
func checkNodesAsReferenceAgent(ctx context.Context, t *testing.T, f *fleet.Fleet, nodes []string) {
	t.Helper()
	for _, name := range nodes {
		n, err := f.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if it := n.Labels["beta.kubernetes.io/instance-type"]; !slices.Contains([]string{"BCC", "GPU", "DCC"}, it) {
			t.Errorf("node %s: beta.kubernetes.io/instance-type %q, want a BCC node", name, it)
		}
		for _, a := range []string{cce.AnnotationMaxENINum, cce.AnnotationMaxIPPerENI, cce.AnnotationWarmIPTarget, cce.AnnotationPreAttachedENINum} {
			if n.Annotations[a] == "" {
				t.Errorf("node %s lacks the node agent's annotation %s", name, a)
			}
		}
		if n.Spec.ProviderID != "cce://"+kubeletsim.InstanceID(name) {
			t.Errorf("node %s: providerID %q", name, n.Spec.ProviderID)
		}
	}
}

// addresses is an ENI's address list as IPPool status.eni.enis holds it.
func addresses(eni cloud.ENI, added []string) []any {
	var out []any
	for _, ip := range eni.PrivateIPs {
		out = append(out, map[string]any{"isPrimary": ip.Primary, "privateIPAddress": ip.Address})
	}
	for _, ip := range added {
		out = append(out, map[string]any{"isPrimary": false, "privateIPAddress": ip})
	}
	return out
}

// waitFor polls cond until it returns nil or the timeout ends (e2e: the
// replicas act asynchronously).
func waitFor(ctx context.Context, timeout time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	for {
		if err = cond(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (after %s)", err, timeout)
		case <-time.After(300 * time.Millisecond):
		}
	}
}
