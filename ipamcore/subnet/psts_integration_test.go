//go:build integration

package subnet_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/freeport"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/subnet"
)

// world is bce-sim with one VPC, zone, security group and instance, a
// cloud client for it, and API clients.
type world struct {
	t        *testing.T
	ctx      context.Context
	sim      *bcesim.Server
	provider cloud.Provider
	cs       versioned.Interface
	kube     kubernetes.Interface
	sg, inst string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if err := cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	sim, err := bcesim.New(bcesim.Config{Credentials: map[string]string{"ak": "sk"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Start(freeport.Addr(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	cfg := cloud.DefaultConfig()
	cfg.OpLimits = nil
	cfg.Endpoint = sim.URL()
	cfg.AccessKeyID, cfg.SecretAccessKey = "ak", "sk"
	cfg.Rate, cfg.Burst = 1000, 1000
	provider, err := cloud.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { provider.Close() })
	w := &world{t: t, ctx: ctx, sim: sim, provider: provider,
		cs: versioned.NewForConfigOrDie(cp.Config), kube: kubernetes.NewForConfigOrDie(cp.Config)}
	base := w.subnet("base", "10.200.0.0/24")
	if w.sg, err = sim.AddSecurityGroup(bcesim.SecurityGroupSpec{ID: "g", VPCID: "vpc"}); err != nil {
		t.Fatal(err)
	}
	if w.inst, err = sim.AddInstance(bcesim.InstanceSpec{ID: "i-1", SubnetID: base, CPUCount: 8,
		MemoryGB: 64, SecurityGroupIDs: []string{w.sg}}); err != nil {
		t.Fatal(err)
	}
	return w
}

// subnet adds a cloud subnet named after the test and deletes its Subnet
// resource when the test ends.
func (w *world) subnet(suffix, cidr string) string {
	w.t.Helper()
	id := "sbn-" + strings.ToLower(strings.ReplaceAll(w.t.Name(), "_", "-")) + "-" + suffix
	if _, err := w.sim.AddSubnet(bcesim.SubnetSpec{ID: id, Name: suffix, ZoneName: "z", CIDR: cidr, VPCID: "vpc"}); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		_ = w.cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Delete(context.Background(), id, metav1.DeleteOptions{})
	})
	return id
}

func (w *world) get(id string) (*cce.Subnet, error) {
	return w.cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(w.ctx, id, metav1.GetOptions{})
}

// eventually polls cond until it holds (the deadline only stops a test
// that never converges).
func (w *world) eventually(what string, cond func() (bool, string)) {
	w.t.Helper()
	var last string
	if err := wait.PollUntilContextTimeout(w.ctx, 50*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		ok, desc := cond()
		last = desc
		return ok, nil
	}); err != nil {
		w.t.Fatalf("%s: never happened; last: %s", what, last)
	}
}

func (w *world) run(c *subnet.Controller) {
	runCtx, stop := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	w.t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			w.t.Errorf("Run returned %v", err)
		}
	})
}

func strategy(t cce.IPAllocType) cce.SubnetAllocation {
	return cce.SubnetAllocation{IPAllocationStrategy: cce.IPAllocationStrategy{Type: t}}
}

// A PSTS subnet without a Subnet resource gets one from the cloud,
// exclusive when its strategy picks addresses itself; a subnet an IPPool
// lists is never made exclusive; an existing Subnet keeps its exclusivity;
// IDs no Subnet can have are not asked for.
func TestController_PSTSSubnetsCreatedExclusive(t *testing.T) {
	w := newWorld(t)
	fixed, manual, custom := w.subnet("fixed", "10.71.0.0/24"), w.subnet("manual", "10.72.0.0/24"), w.subnet("custom", "10.73.0.0/24")
	elastic, pooled, existing := w.subnet("elastic", "10.74.0.0/24"), w.subnet("pooled", "10.75.0.0/24"), w.subnet("existing", "10.76.0.0/24")
	if _, err := w.cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Create(w.ctx, &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: existing, Namespace: cce.SubnetNamespace},
		Spec:       cce.SubnetSpec{ID: existing, CIDR: "10.76.0.0/24"},
		Status:     cce.SubnetStatus{Enable: true},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spreads := []*cce.PodSubnetTopologySpread{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}, Spec: cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{
			fixed: strategy(cce.IPAllocTypeFixed), custom: strategy(cce.IPAllocTypeCustom), elastic: {},
			pooled: strategy(cce.IPAllocTypeFixed), existing: strategy(cce.IPAllocTypeFixed), "Not_An_ID": strategy(cce.IPAllocTypeFixed),
		}}},
		// The global strategy overrides the subnet's.
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns"}, Spec: cce.PodSubnetTopologySpreadSpec{
			Strategy: &cce.IPAllocationStrategy{Type: cce.IPAllocTypeManual},
			Subnets:  map[string]cce.SubnetAllocation{manual: strategy(cce.IPAllocTypeElastic)},
		}},
	}
	pools := []*cce.IPPool{{ObjectMeta: metav1.ObjectMeta{Name: "ippool-x"}, Spec: cce.IPPoolSpec{ENI: cce.ENISpec{Subnets: []string{pooled}}}}}
	c := subnet.NewController(subnet.DefaultConfig(), w.cs, w.provider, nil, prometheus.NewRegistry())
	c.Sync(w.ctx, pools, spreads)
	for id, want := range map[string]bool{fixed: true, manual: true, custom: true, elastic: false, pooled: false, existing: false} {
		s, err := w.get(id)
		if err != nil {
			t.Fatalf("Subnet %s: %v", id, err)
		}
		if s.Spec.Exclusive != want || !s.Status.Enable || s.Spec.ID != id || s.Status.AvailableIPNum <= 0 {
			t.Errorf("Subnet %s = %+v %+v, want exclusive %v", id, s.Spec, s.Status, want)
		}
	}
	if _, err := w.get("Not_An_ID"); !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err) {
		t.Errorf("Subnet for an invalid ID: %v", err)
	}
}

// Run creates the Subnet of a new PSTS at once, not a period later.
func TestController_RunReactsToNewPSTS(t *testing.T) {
	w := newWorld(t)
	id := w.subnet("new", "10.77.0.0/24")
	cfg := subnet.DefaultConfig()
	cfg.SyncPeriod = time.Hour
	w.run(subnet.NewController(cfg, w.cs, w.provider, nil, prometheus.NewRegistry()))
	ns, err := cp.CreateNamespace(w.ctx, "psts-subnet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteNamespace(context.Background(), ns) })
	if _, err := w.cs.CceV1alpha1().PodSubnetTopologySpreads(ns).Create(w.ctx, &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{id: strategy(cce.IPAllocTypeFixed)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.eventually("Subnet created exclusive", func() (bool, string) {
		s, err := w.get(id)
		if err != nil {
			return false, err.Error()
		}
		return s.Spec.Exclusive, fmt.Sprintf("%+v", s.Spec)
	})
}

// hasNoMoreIP follows the cloud both ways: set with a reason and a Warning
// event when the subnet runs out, cleared (also when the IPAM had declared
// it) with a Normal event once the cloud reports free addresses.
func TestController_ExhaustionSetAndCleared(t *testing.T) {
	w := newWorld(t)
	tiny := w.subnet("tiny", "10.78.0.0/29")
	cfg := subnet.DefaultConfig()
	cfg.SyncPeriod = 100 * time.Millisecond // the cloud's changes are not events
	reg := prometheus.NewRegistry()
	w.run(subnet.NewController(cfg, w.cs, w.provider, nil, reg, subnet.WithEvents(w.kube)))
	ns, err := cp.CreateNamespace(w.ctx, "psts-subnet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteNamespace(context.Background(), ns) })
	if _, err := w.cs.CceV1alpha1().PodSubnetTopologySpreads(ns).Create(w.ctx, &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{tiny: {}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	status := func(what string, check func(cce.SubnetStatus) bool) {
		t.Helper()
		w.eventually(what, func() (bool, string) {
			s, err := w.get(tiny)
			if err != nil {
				return false, err.Error()
			}
			return check(s.Status), fmt.Sprintf("%+v", s.Status)
		})
	}
	status("created with free addresses", func(s cce.SubnetStatus) bool { return s.AvailableIPNum > 0 && !s.HasNoMoreIP })

	eni, err := w.provider.CreateENI(w.ctx, cloud.CreateENIRequest{Name: "x/eni", SubnetID: tiny, SecurityGroupIDs: []string{w.sg}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.provider.AttachENI(w.ctx, eni, w.inst); err != nil {
		t.Fatal(err)
	}
	var added []string
	for {
		ip, err := w.provider.AddPrivateIP(w.ctx, eni, "")
		if err != nil {
			break
		}
		added = append(added, ip)
	}
	if len(added) == 0 {
		t.Fatal("no address added to the tiny subnet")
	}
	status("exhausted", func(s cce.SubnetStatus) bool {
		return s.HasNoMoreIP && s.AvailableIPNum == 0 && strings.Contains(s.Reason, "no available IP")
	})
	w.eventually("a Warning event on the Subnet", func() (bool, string) {
		msgs := eventsOf(w, tiny, subnet.ReasonSubnetExhausted)
		return len(msgs) > 0, fmt.Sprint(msgs)
	})

	if err := w.provider.DeletePrivateIP(w.ctx, eni, added[0]); err != nil {
		t.Fatal(err)
	}
	status("cleared", func(s cce.SubnetStatus) bool { return !s.HasNoMoreIP && s.AvailableIPNum == 1 && s.Reason == "" })
	w.eventually("a Normal event on the Subnet", func() (bool, string) {
		msgs := eventsOf(w, tiny, subnet.ReasonSubnetAvailable)
		return len(msgs) > 0, fmt.Sprint(msgs)
	})

	// The IPAM declares it exhausted (a SubnetHasNoMoreIpException) while
	// the cloud still reports a free address: cleared again.
	s, err := w.get(tiny)
	if err != nil {
		t.Fatal(err)
	}
	s.Status.HasNoMoreIP, s.Status.Reason = true, "declared by the IPAM"
	if _, err := w.cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Update(w.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	status("the IPAM's declaration cleared", func(s cce.SubnetStatus) bool { return !s.HasNoMoreIP && s.Reason == "" })
	if n := counterValue(t, reg, "cce_ipam_subnet_exhausted_total"); n != 1 {
		t.Fatalf("exhausted %v times, want once", n)
	}
}

func eventsOf(w *world, name, reason string) []string {
	list, err := w.kube.CoreV1().Events(cce.SubnetNamespace).List(w.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String(),
	})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Subnet" && (e.Type == corev1.EventTypeWarning) == (reason == subnet.ReasonSubnetExhausted) {
			out = append(out, e.Message)
		}
	}
	return out
}
