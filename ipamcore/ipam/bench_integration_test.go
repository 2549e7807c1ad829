//go:build integration

package ipam_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// BenchmarkAllocateWarmPool measures one allocation from a warm pool: gRPC
// in, datastore, WorkloadEndpoint created on the real API server, reply out.
// Pod creation and release are outside the timer. Compare with
// BenchmarkBareWEPCreate, the floor set by the API server (run both in one
// `go test -bench` invocation).
func BenchmarkAllocateWarmPool(b *testing.B) {
	e := newEnv(b, "bench", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 10
		c.IdleMax = 30
		c.Cooldown = time.Millisecond
		c.PoolCheckPeriod = 100 * time.Millisecond
	}))
	eventually(b, 20*time.Second, "warm pool", func() bool { return e.stats(e.nodes[0]).Idle >= 10 })
	b.ReportAllocs()
	b.ResetTimer()
	for k := 0; b.Loop(); k++ {
		b.StopTimer()
		p := podRef{name: fmt.Sprintf("b-%d", k), node: e.nodes[0], containerID: fmt.Sprintf("%064x", k+1)}
		if _, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec:       corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
		}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		reply, err := e.cni.AllocateIP(e.ctx, &rpc.AllocateIPRequest{
			K8SPodName:             p.name,
			K8SPodNamespace:        e.ns,
			K8SPodInfraContainerID: p.containerID,
		})
		b.StopTimer()
		if err != nil || !reply.IsSuccess {
			b.Fatalf("allocate: %v %v", reply, err)
		}
		if r, err := e.release(p); err != nil || !r.IsSuccess {
			b.Fatalf("release: %v %v", r, err)
		}
		b.StartTimer()
	}
}

// BenchmarkBareWEPCreate is the floor: creating one WorkloadEndpoint on the
// same API server, nothing else.
func BenchmarkBareWEPCreate(b *testing.B) {
	e := newEnv(b, "floor", 1, ipam.DefaultConfig())
	client := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns)
	b.ReportAllocs()
	for k := 0; b.Loop(); k++ {
		_, err := client.Create(e.ctx, &cce.WorkloadEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("floor-%d", k)},
			Spec:       cce.WorkloadEndpointSpec{IP: "10.9.0.1", Node: e.nodes[0], ContainerID: "x"},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAddDelPairs is one ADD and one DEL of a pod's sandbox through a
// replica's whole CNI path (gRPC service, shard router, IPAM) against the
// real API server, 8 pods at a time: the per-call cost of issue #28 (run
// with -cpuprofile and -memprofile; allocs/op and the profile are the
// replica's side, the API server runs in its own process). Each worker owns
// its pods, which exist and are in the node's pod watch before the timer.
func BenchmarkAddDelPairs(b *testing.B) {
	e := newEnv(b, "pairs", 1, testConfig(func(c *ipam.Config) {
		c.IdleMin = 12
		c.IdleMax = 40
		c.Cooldown = time.Millisecond
		c.PoolCheckPeriod = 100 * time.Millisecond
	}))
	eventually(b, 20*time.Second, "warm pool", func() bool { return e.stats(e.nodes[0]).Idle >= 12 })
	const workers = 8
	pods := e.createPods("pair", workers)
	for _, p := range pods {
		eventually(b, 10*time.Second, "the pod watch", func() bool {
			_, ok := e.ipam.PodFromCache(p.node, e.ns, p.name)
			return ok
		})
	}
	srv := routedCNIServer(b, e.ipam)
	var next atomic.Int32
	b.ReportAllocs()
	b.SetParallelism(max(1, workers/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := pods[int(next.Add(1)-1)%len(pods)]
		for k := 0; pb.Next(); k++ {
			ref := podip.PodRef{Namespace: e.ns, Name: p.name, ContainerID: fmt.Sprintf("%s-%d", p.containerID, k), Node: p.node}
			add, err := srv.AllocateIP(context.Background(), &rpc.AllocateIPRequest{
				K8SPodName: ref.Name, K8SPodNamespace: ref.Namespace, K8SPodInfraContainerID: ref.ContainerID, K8SNodeName: ref.Node,
			})
			if err != nil || !add.GetIsSuccess() {
				b.Errorf("ADD %s: %v %s", ref, err, add.GetErrMsg())
				return
			}
			del, err := srv.ReleaseIP(context.Background(), &rpc.ReleaseIPRequest{
				K8SPodName: ref.Name, K8SPodNamespace: ref.Namespace, K8SPodInfraContainerID: ref.ContainerID, K8SNodeName: ref.Node,
			})
			if err != nil || !del.GetIsSuccess() {
				b.Errorf("DEL %s: %v %s", ref, err, del.GetErrMsg())
				return
			}
		}
	})
}
