//go:build integration

package main_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// The tests of the sharded replica as processes (sharding, fencing, fixed
// IP moves) run on e2e/fleet: bce-sim and several cce-ipam processes
// gossiping over loopback on the package's control plane. The tests make
// the CNI calls themselves (no kubelet simulator), to the replica of their
// choice; these are their shared steps and checks.

const (
	globalRate  = 20
	globalBurst = 10
)

// shardFleet is a fleet whose tests create their pods in ns: the namespace
// of the replicas' Leases, whose weps the fencing policy covers.
type shardFleet struct {
	*fleet.Fleet
	t  *testing.T
	ns string
}

// startShards starts a fleet on the package's control plane with o's
// name, replicas and extras, the budget globalRate/globalBurst, ENIs that
// attach at once and short membership and leader timings, then registers
// nodes nodes.
func startShards(t *testing.T, o fleet.Options, nodes int) *shardFleet {
	t.Helper()
	e := &shardFleet{
		t:  t,
		ns: cp.Namespace(t),
	}
	o.SharedCluster, o.LeaseNamespace, o.NoKubelet = cp, e.ns, true
	o.BCERate, o.BCEBurst, o.AttachDelay = globalRate, globalBurst, -1
	o.ReplicaArgs = append([]string{"--memberlist-rejoin-interval", "2s", "--leader-elect-lease-duration", "4s",
		"--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "1s"}, o.ReplicaArgs...)
	e.Fleet = fleet.Start(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.AddNodes(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	return e
}

// settle waits up to d for fleet.Settle and returns the holders and how
// long it took.
func (e *shardFleet) settle(d time.Duration) (map[string]string, time.Duration) {
	e.t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	holders, err := e.Settle(ctx)
	if err != nil {
		e.t.Fatalf("replicas did not settle within %s: %v", d, err)
	}
	return holders, time.Since(start)
}

// memberName is the replica's name in the ring (as holders name it).
func (e *shardFleet) memberName(r *fleet.Replica) string {
	e.t.Helper()
	st, err := r.ShardStatus(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Self
}

// metric sums the series of a metric whose labels include labels (0 when
// it has none).
func (e *shardFleet) metric(r *fleet.Replica, name string, labels map[string]string) float64 {
	e.t.Helper()
	ss, err := r.Metrics(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	v, _ := ss.Sum(name, labels)
	return v
}

var okResult = map[string]string{"result": "ok"}

// busiest returns the candidate holding the most nodes and those nodes. A
// fixed replica would hold none of 12 nodes in ~1 % of runs (the ring
// balances partitions, not nodes), so tests pick the one with the most.
func (e *shardFleet) busiest(holders map[string]string, candidates ...*fleet.Replica) (*fleet.Replica, []string) {
	e.t.Helper()
	var best *fleet.Replica
	var bestNodes []string
	for _, r := range candidates {
		name := e.memberName(r)
		var nodes []string
		for n, h := range holders {
			if h == name {
				nodes = append(nodes, n)
			}
		}
		if best == nil || len(nodes) > len(bestNodes) {
			best, bestNodes = r, nodes
		}
	}
	slices.Sort(bestNodes)
	return best, bestNodes
}

// except returns the replicas other than r.
func except(all []*fleet.Replica, r *fleet.Replica) []*fleet.Replica {
	return slices.DeleteFunc(slices.Clone(all), func(o *fleet.Replica) bool { return o == r })
}

var podSeq struct {
	sync.Mutex
	n int
}

// newPod creates a pod bound to node and returns its name.
func (e *shardFleet) newPod(ctx context.Context, node string) (string, error) {
	podSeq.Lock()
	podSeq.n++
	name := fmt.Sprintf("p-%d", podSeq.n)
	podSeq.Unlock()
	_, err := e.Kube.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name:  "c",
				Image: "pause",
			}},
		},
	}, metav1.CreateOptions{})
	return name, err
}

func (e *shardFleet) allocate(ctx context.Context, r *fleet.Replica, pod string) (string, error) {
	reply, err := r.CNI().AllocateIP(ctx, &rpc.AllocateIPRequest{K8SPodName: pod, K8SPodNamespace: e.ns,
		K8SPodInfraContainerID: "sandbox-" + pod, IPType: rpc.IPType_BCCMultiENIMultiIPType})
	if err != nil {
		return "", err
	}
	if !reply.IsSuccess {
		return "", fmt.Errorf("%s", reply.ErrMsg)
	}
	return reply.GetENIMultiIP().GetIP(), nil
}

func (e *shardFleet) release(ctx context.Context, r *fleet.Replica, pod string) (*rpc.ReleaseIPReply, error) {
	return r.CNI().ReleaseIP(ctx, &rpc.ReleaseIPRequest{K8SPodName: pod, K8SPodNamespace: e.ns,
		K8SPodInfraContainerID: "sandbox-" + pod, IPType: rpc.IPType_BCCMultiENIMultiIPType})
}

// result is one pod's allocation as the test saw it.
type result struct {
	pod, node, ip, via string
	start, done        time.Time
	attempts           int
}

func via(r *fleet.Replica) string { return "replica " + strconv.Itoa(r.Index()) }

// checkIPs: every pod's IP is unique, equals its wep's, and is attached in
// bce-sim to the ENI of the pod's node.
func (e *shardFleet) checkIPs(ctx context.Context, results []result) {
	e.t.Helper()
	byIP := map[string]string{}
	for _, r := range results {
		if r.ip == "" {
			continue
		}
		if other, dup := byIP[r.ip]; dup {
			e.t.Errorf("DUPLICATE IP %s: pods %s and %s", r.ip, other, r.pod)
		}
		byIP[r.ip] = r.pod
	}
	weps, err := e.CCE.CceV1alpha1().WorkloadEndpoints(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	wepIP := map[string]string{}
	for _, w := range weps.Items {
		wepIP[w.Name] = w.Spec.IP
	}
	// bce-sim's world through its admin API: a ListENIs would take a token
	// of the per-operation limit the replicas are using (and be throttled).
	world, err := e.SimWorld(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	onENI := map[string]string{}
	for _, en := range world.ENIs {
		if en.VPCID != e.VPCID {
			continue
		}
		for _, p := range en.PrivateIPSet {
			onENI[p.PrivateIPAddress] = en.InstanceID
		}
	}
	instance := map[string]string{}
	for _, r := range results {
		if r.ip == "" {
			continue
		}
		if wepIP[r.pod] != r.ip {
			e.t.Errorf("pod %s got %s but its wep says %q", r.pod, r.ip, wepIP[r.pod])
		}
		if _, known := instance[r.node]; !known {
			n, err := e.Kube.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
			if err != nil {
				e.t.Fatal(err)
			}
			instance[r.node] = strings.TrimPrefix(n.Spec.ProviderID, "cce://")
		}
		if inst := instance[r.node]; onENI[r.ip] != inst {
			e.t.Errorf("pod %s IP %s is on instance %q in bce-sim, want %s", r.pod, r.ip, onENI[r.ip], inst)
		}
	}
}
