package v1alpha1_test

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned/fake"
	"github.com/cce-ipam/sharded/ipamcore/generated/informers/externalversions"
)

// The generated fake clientset (for reconciler tests) stores the types and
// feeds the generated informers, and its label selectors work on the
// well-known labels.
func TestFakeClientset_FeedsInformers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := referenceFixtures()[1].want.(*v1.IPPool).DeepCopy()
	pool.Namespace = v1.IPPoolNamespace
	cs := fake.NewSimpleClientset(pool)

	factory := externalversions.NewSharedInformerFactory(cs, 0)
	weps := factory.Cce().V1alpha1().WorkloadEndpoints()
	pools := factory.Cce().V1alpha1().IPPools().Lister()
	added := make(chan string, 10)
	if _, err := weps.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { added <- obj.(*v1.WorkloadEndpoint).Name },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	defer func() {
		close(stop) // Shutdown waits for the informers, which stop on this.
		factory.Shutdown()
	}()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", typ)
		}
	}

	got, err := pools.IPPools(v1.IPPoolNamespace).Get(v1.IPPoolName("10.0.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.ENI.ENIs) != 2 {
		t.Errorf("cached pool has %d ENIs, want 2", len(got.Status.ENI.ENIs))
	}

	for _, w := range []*v1.WorkloadEndpoint{
		{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "ns", Labels: map[string]string{v1.LabelSubnetID: "sbn-1"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "hostnet", Namespace: "ns"}},
	} {
		if _, err := cs.CceV1alpha1().WorkloadEndpoints(w.Namespace).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case name := <-added:
			seen[name] = true
		case <-ctx.Done():
			t.Fatalf("informer saw only %v", seen)
		}
	}
	sel, err := labels.Parse(v1.LabelSubnetID)
	if err != nil {
		t.Fatal(err)
	}
	withSubnet, err := weps.Lister().List(sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(withSubnet) != 1 || withSubnet[0].Name != "web-0" {
		t.Errorf("weps with %s: %d, want only web-0", v1.LabelSubnetID, len(withSubnet))
	}
	if _, err := cs.CceV1alpha1().Subnets(v1.SubnetNamespace).Get(ctx, "sbn-missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get missing subnet: %v, want NotFound", err)
	}
}
