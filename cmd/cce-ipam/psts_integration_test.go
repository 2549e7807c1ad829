//go:build integration

package main_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// Three replicas give PSTS pods on the nodes each serves addresses of ONE
// exclusive subnet at the same time (PSTS.md, I7): over 1,000 allocations
// in waves, no address is ever held by two pods, every address lies in the
// allowed ranges and is a usable one, and its IPClaim names its pod. The
// same waves over three subnets give the throughput to compare with
// (logged): one busy subnet must not serialise the cluster.
func TestSharding_PSTSExclusiveSubnetAcrossReplicas(t *testing.T) {
	e := startShards(t, fleet.Options{
		Name:            "psts",
		Replicas:        3,
		NoSimRateLimits: true,
		// The waves' cloud calls are not what is measured.
		ReplicaArgs: []string{"--bce-rate", "400", "--bce-burst", "100", "--bce-op-limits",
			"BatchAddPrivateIPCrossSubnet=400:100,DeletePrivateIP=400:100,BatchAddPrivateIP=50:20,ListENIs=5:5"},
	}, 24)
	e.settle(90 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	const perNode = 15
	// The allowed ranges leave each subnet's first /25 out. Three waves
	// from the one subnet, one from the three for comparison.
	one := e.pstsCase(ctx, "one", map[string][]string{
		"10.30.0.0/21": {"10.30.0.128/25", "10.30.1.0/24", "10.30.2.0/23", "10.30.4.0/22"},
	}, 3, perNode)
	three := e.pstsCase(ctx, "three", map[string][]string{
		"10.31.0.0/23": {"10.31.0.128/25", "10.31.1.0/24"},
		"10.32.0.0/23": {"10.32.0.128/25", "10.32.1.0/24"},
		"10.33.0.0/23": {"10.33.0.128/25", "10.33.1.0/24"},
	}, 1, perNode)
	t.Logf("PSTS Manual allocations by 3 replicas: one exclusive subnet %d in %s (%.0f/s), three subnets %d in %s (%.0f/s)",
		one.n, one.took.Round(time.Millisecond), float64(one.n)/one.took.Seconds(),
		three.n, three.took.Round(time.Millisecond), float64(three.n)/three.took.Seconds())
	if one.n < 1000 {
		t.Errorf("only %d allocations from the one subnet, want at least 1,000", one.n)
	}
}

type pstsRun struct {
	n    int
	took time.Duration // the ADD waves only
}

// pstsCase runs waves of ADDs (perNode pods on every node, through the
// replicas in turn, so that most are forwarded) and DELs for a Manual PSTS
// over the subnets, checking each wave.
func (e *shardFleet) pstsCase(ctx context.Context, name string, cidrs map[string][]string, waves, perNode int) pstsRun {
	t := e.t
	subnets := map[string]cce.SubnetAllocation{}
	var (
		ranges   []netip.Prefix
		subnetOf = map[netip.Prefix]netip.Prefix{}
		k        int
	)
	for cidr, allowed := range cidrs {
		id := fmt.Sprintf("sbn-psts-%s-%d", name, k)
		k++
		e.pstsSubnet(ctx, id, cidr)
		subnets[id] = cce.SubnetAllocation{
			IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeManual},
			IPv4Range:            allowed,
		}
		for _, r := range allowed {
			ranges = append(ranges, netip.MustParsePrefix(r))
			subnetOf[netip.MustParsePrefix(r)] = netip.MustParsePrefix(cidr)
		}
	}
	if _, err := e.CCE.CceV1alpha1().PodSubnetTopologySpreads(e.ns).Create(ctx, &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cce.PodSubnetTopologySpreadSpec{Name: name, Subnets: subnets,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"psts": name}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inRanges := func(ip string) bool {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return false
		}
		for _, r := range ranges {
			if r.Contains(a) && psts.Usable(subnetOf[r], a, psts.DefaultAvailableIndex) {
				return true
			}
		}
		return false
	}
	replicas := e.Replicas()
	var run pstsRun
	for w := range waves {
		var pods []string
		nodeOf := map[string]string{}
		for _, n := range e.Nodes() {
			for k := range perNode {
				pod := fmt.Sprintf("%s-w%d-%s-%d", name, w, n, k)
				pods = append(pods, pod)
				nodeOf[pod] = n
			}
		}
		inParallel(t, pods, func(pod string) error {
			_, err := e.Kube.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: pod, Labels: map[string]string{"psts": name},
					Annotations: map[string]string{cce.AnnotationPodSubnetTopologySpread: name}},
				Spec: corev1.PodSpec{NodeName: nodeOf[pod], Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
			}, metav1.CreateOptions{})
			return err
		})
		var (
			mu      sync.Mutex
			byIP    = map[string]string{}
			results []result
			next    atomic.Int64
			wg      sync.WaitGroup
		)
		start := time.Now()
		for range 16 {
			wg.Go(func() {
				for {
					k := int(next.Add(1)) - 1
					if k >= len(pods) {
						return
					}
					pod := pods[k]
					r := replicas[k%len(replicas)]
					var ip string
					var err error
					// Retried as kubelet would: "busy" (the concurrency
					// limit) and a pool refilling are passing answers.
					for attempt := 0; attempt < 100; attempt++ {
						if ip, err = e.allocate(ctx, r, pod); err == nil {
							break
						}
						time.Sleep(100 * time.Millisecond)
					}
					mu.Lock()
					if err != nil {
						t.Errorf("ADD %s via %s: %v", pod, via(r), err)
					} else {
						if other, dup := byIP[ip]; dup {
							t.Errorf("DUPLICATE %s: %s and %s", ip, other, pod)
						}
						byIP[ip] = pod
						results = append(results, result{pod: pod, node: nodeOf[pod], ip: ip, via: via(r)})
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		run.took += time.Since(start)
		run.n += len(results)
		for _, r := range results {
			if !inRanges(r.ip) {
				t.Errorf("pod %s got %s, outside the allowed ranges %v or not usable", r.pod, r.ip, ranges)
			}
		}
		e.checkIPs(ctx, results)
		e.checkClaims(ctx, results)
		if t.Failed() {
			t.FailNow()
		}
		// DEL everything, through the replicas in turn, then delete the pods.
		var turn atomic.Int64
		inParallel(t, pods, func(pod string) error {
			r := replicas[int(turn.Add(1))%len(replicas)]
			if rr, err := e.release(ctx, r, pod); err != nil || !rr.IsSuccess {
				return fmt.Errorf("DEL %s via %s = %v: %w", pod, via(r), rr, err)
			}
			return e.Kube.CoreV1().Pods(e.ns).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
		for ip, pod := range byIP {
			if c, err := e.CCE.CceV1alpha1().IPClaims().Get(ctx, cce.ClaimName(netip.MustParseAddr(ip)), metav1.GetOptions{}); err != nil ||
				c.Spec.Holder != nil {
				t.Fatalf("after the DEL of %s the claim of %s is %+v, %v; want free", pod, ip, c, err)
			}
		}
	}
	return run
}

// inParallel runs fn for every item on 16 goroutines and fails the test on
// the first error.
func inParallel(t *testing.T, items []string, fn func(string) error) {
	t.Helper()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 16 {
		wg.Go(func() {
			for k := int(next.Add(1)) - 1; k < len(items); k = int(next.Add(1)) - 1 {
				if err := fn(items[k]); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d failed, the first: %v", len(errs), len(items), errs[0])
	}
}

// pstsSubnet creates an exclusive subnet in bce-sim and its Subnet
// resource, as the validating webhook leaves them.
func (e *shardFleet) pstsSubnet(ctx context.Context, id, cidr string) {
	e.t.Helper()
	if err := e.AddSubnet(ctx, id, cidr); err != nil {
		e.t.Fatal(err)
	}
	p := netip.MustParsePrefix(cidr)
	_, err := e.CCE.CceV1alpha1().Subnets(cce.SubnetNamespace).Create(ctx, &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: cce.SubnetNamespace},
		Spec:       cce.SubnetSpec{ID: id, Name: id, AvailabilityZone: fleet.Zone, CIDR: cidr, Exclusive: true},
		Status:     cce.SubnetStatus{Enable: true, AvailableIPNum: int32(1<<(32-p.Bits())) - 3},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.CCE.CceV1alpha1().Subnets(cce.SubnetNamespace).Delete(context.Background(), id, metav1.DeleteOptions{})
	})
}

// checkClaims: every allocated address's IPClaim is held by its pod.
func (e *shardFleet) checkClaims(ctx context.Context, results []result) {
	e.t.Helper()
	claims, err := e.CCE.CceV1alpha1().IPClaims().List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	holder := map[string]string{}
	for _, c := range claims.Items {
		if c.Spec.Holder != nil {
			holder[c.Spec.IP] = c.Spec.Holder.Namespace + "/" + c.Spec.Holder.Name
		}
	}
	for _, r := range results {
		if want := e.ns + "/" + r.pod; holder[r.ip] != want {
			e.t.Errorf("claim of %s held by %q, want %s", r.ip, holder[r.ip], want)
		}
	}
}
