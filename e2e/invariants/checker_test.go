package invariants

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"

	ccefake "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/fake"
)

type staticCloud []ENI

func (c staticCloud) ENIs(context.Context) ([]ENI, error) { return c, nil }

// changingCloud answers its reads in turn, then the last one.
type changingCloud struct{ reads [][]ENI }

func (c *changingCloud) ENIs(context.Context) ([]ENI, error) {
	r := c.reads[0]
	if len(c.reads) > 1 {
		c.reads = c.reads[1:]
	}
	return r, nil
}

// Check with (e) and (f) on fake clients: a live pod's wep off its node's
// ENIs is confirmed against fresh reads, and an owner whose datastore
// disagrees with the weps is reported.
func TestChecker_Check_WEPAddressesAndPools(t *testing.T) {
	s := healthy()
	// c is Pending (its ADD in progress) and its wep names an IP that n2's
	// ENI lacks.
	s.pods[2].Status.Phase, s.pods[2].Status.PodIP, s.pods[2].Status.PodIPs = corev1.PodPending, "", nil
	s.enis[1].IPs = []string{"10.0.1.2"}
	var kobjs, cobjs []runtime.Object
	for i := range s.nodes {
		kobjs = append(kobjs, &s.nodes[i])
	}
	for i := range s.pods {
		kobjs = append(kobjs, &s.pods[i])
	}
	for i := range s.weps {
		cobjs = append(cobjs, &s.weps[i])
	}
	assigned := map[string]int{"n1": 2, "n2": 0} // n2's owner lost c's address
	chk, err := New(Config{Namespaces: []string{"ns"}, WEPAddresses: true,
		Pools: func(_ context.Context, node string) (PoolCounts, error) {
			return PoolCounts{Assigned: assigned[node], Total: assigned[node] + 1}, nil
		}}, kubefake.NewSimpleClientset(kobjs...), ccefake.NewSimpleClientset(cobjs...), staticCloud(s.enis))
	if err != nil {
		t.Fatal(err)
	}
	vs, err := chk.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"DatastoreMismatch node=n2: the owner's datastore assigns 0 addresses", "WEPNotOnENI node=n2 pods=ns/c wep=ns/c ip=10.0.1.1"}
	if len(vs) != len(want) {
		t.Fatalf("want %d violations, got %s", len(want), vs)
	}
	for i, w := range want {
		if !strings.HasPrefix(vs[i].String(), w) {
			t.Errorf("violation %d: want prefix %q, got %q", i, w, vs[i])
		}
	}
	// The cloud has the address again, and the owner agrees.
	assigned["n2"] = 1
	chk.cloud = staticCloud(healthy().enis)
	if vs, err := chk.Check(context.Background()); err != nil || len(vs) != 0 {
		t.Fatalf("healthy again: %v %s", err, vs)
	}
	// A finding the confirming read no longer sees is dropped.
	chk.cloud = &changingCloud{reads: [][]ENI{s.enis, healthy().enis}}
	if vs, err := chk.Check(context.Background()); err != nil || len(vs) != 0 {
		t.Fatalf("address back by the confirming read: %v %s", err, vs)
	}
}
