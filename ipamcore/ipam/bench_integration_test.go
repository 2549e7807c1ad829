//go:build integration

package ipam_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
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
