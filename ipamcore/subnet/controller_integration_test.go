//go:build integration

package subnet_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/cluster"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/subnet"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

// Subnets listed by IPPools get Subnet resources; exhaustion is declared
// (which the reference never did); an unchanged subnet is not rewritten.
func TestController_SyncCreatesAndDeclaresExhaustion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	sim, err := bcesim.New(bcesim.Config{Credentials: map[string]string{"ak": "sk"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	big, _ := sim.AddSubnet(bcesim.SubnetSpec{ID: "sbn-big", ZoneName: "z", CIDR: "10.5.0.0/24", VPCID: "vpc"})
	tiny, _ := sim.AddSubnet(bcesim.SubnetSpec{ID: "sbn-tiny", ZoneName: "z", CIDR: "10.6.0.0/29", VPCID: "vpc"})
	sg, _ := sim.AddSecurityGroup(bcesim.SecurityGroupSpec{ID: "g", VPCID: "vpc"})
	inst, _ := sim.AddInstance(bcesim.InstanceSpec{ID: "i-1", SubnetID: big, CPUCount: 8, MemoryGB: 64, SecurityGroupIDs: []string{sg}})
	bceCfg := cloud.DefaultConfig()
	bceCfg.OpLimits = nil // no per-operation limits: only the rate above
	bceCfg.Endpoint = sim.URL()
	bceCfg.AccessKeyID = "ak"
	bceCfg.SecretAccessKey = "sk"
	bceCfg.Rate = 1000
	bceCfg.Burst = 1000
	provider, err := cloud.New(bceCfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer provider.Close()

	cs := versioned.NewForConfigOrDie(cp.Config)
	pools := []*cce.IPPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "ippool-a"}, Spec: cce.IPPoolSpec{ENI: cce.ENISpec{Subnets: []string{big, tiny}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "ippool-b"}, Spec: cce.IPPoolSpec{ENI: cce.ENISpec{Subnets: []string{big}}}},
	}
	reg := prometheus.NewRegistry()
	c := subnet.NewController(subnet.DefaultConfig(), cs, provider, nil, reg)
	c.Sync(ctx, pools, nil)
	for _, id := range []string{big, tiny} {
		s, err := cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Subnet %s not created: %v", id, err)
		}
		want, _ := provider.DescribeSubnet(ctx, id)
		if !s.Status.Enable || s.Status.HasNoMoreIP || int(s.Status.AvailableIPNum) != want.AvailableIP || s.Spec.CIDR != want.CIDR {
			t.Fatalf("Subnet %s = %+v %+v, cloud says %+v", id, s.Spec, s.Status, want)
		}
		t.Cleanup(func() {
			_ = cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Delete(context.Background(), id, metav1.DeleteOptions{})
		})
	}
	writes := counterValue(t, reg, "cce_ipam_subnet_writes_total")
	c.Sync(ctx, pools, nil)
	if again := counterValue(t, reg, "cce_ipam_subnet_writes_total"); again != writes {
		t.Fatalf("an unchanged sync wrote %v times", again-writes)
	}

	// Use up the tiny subnet.
	eni, err := provider.CreateENI(ctx, cloud.CreateENIRequest{Name: "x/eni", SubnetID: tiny, SecurityGroupIDs: []string{sg}})
	if err != nil {
		t.Fatal(err)
	}
	if err := provider.AttachENI(ctx, eni, inst); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := provider.AddPrivateIP(ctx, eni, ""); err != nil {
			break
		}
	}
	c.Sync(ctx, pools, nil)
	s, err := cs.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(ctx, tiny, metav1.GetOptions{})
	if err != nil || !s.Status.HasNoMoreIP || s.Status.AvailableIPNum != 0 {
		t.Fatalf("exhausted subnet = %+v (err %v), want hasNoMoreIP", s.Status, err)
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
