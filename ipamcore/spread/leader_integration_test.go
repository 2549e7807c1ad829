//go:build integration

package spread_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
	"github.com/cce-ipam/sharded/e2e/freeport"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/spread"
	"github.com/cce-ipam/sharded/ipamcore/subnet"
)

// simProvider starts bce-sim on a free port and a cloud client for it.
func simProvider(t *testing.T) (*bcesim.Server, cloud.Provider) {
	t.Helper()
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
	return sim, provider
}

// The leader's singletons together, as cmd/cce-ipam runs them: a Fixed
// PSTS admitted without its Subnet (the webhook was down) gets its Subnet
// from the cloud, exclusive, from the Subnet controller; an Elastic one a
// shared Subnet; and the PSTS status then shows both available.
func TestLeader_PSTSSubnetsCreatedAndAvailable(t *testing.T) {
	e := newEnv(t)
	sim, provider := simProvider(t)
	fixedID, err := sim.AddSubnet(bcesim.SubnetSpec{ID: "sbn-fx-" + e.ns, ZoneName: "zone-a", CIDR: "10.60.0.0/24", VPCID: "vpc"})
	if err != nil {
		t.Fatal(err)
	}
	elasticID, err := sim.AddSubnet(bcesim.SubnetSpec{ID: "sbn-el-" + e.ns, ZoneName: "zone-a", CIDR: "10.61.0.0/24", VPCID: "vpc"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{fixedID, elasticID} {
		t.Cleanup(func() {
			_ = e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Delete(context.Background(), id, metav1.DeleteOptions{})
		})
	}
	fixed := spreadOver("fixed", false, fixedID)
	fixed.Spec.Subnets[fixedID] = cce.SubnetAllocation{
		IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed, ReleaseStrategy: cce.ReleaseStrategyNever},
		IPv4Range:            []string{"10.60.0.64/28"},
	}
	e.createSpread(fixed)
	e.createSpread(spreadOver("elastic", false, elasticID, "sbn-unknown-to-the-cloud-"+e.ns))

	cfg := subnet.DefaultConfig()
	cfg.SyncPeriod = time.Hour // the informer events drive this test
	subnets := subnet.NewController(cfg, e.cce, provider, nil, prometheus.NewRegistry(), subnet.WithEvents(e.kube))
	runCtx, stop := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- subnets.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("subnet controller Run returned %v", err)
		}
	})
	e.start(spread.DefaultConfig())

	e.status("fixed", "the Fixed PSTS's subnet available", func(st cce.PodSubnetTopologySpreadStatus) string {
		if s, ok := st.AvailableSubnets[fixedID]; !ok || s.CIDR != "10.60.0.0/24" || s.AvailableIPNum <= 0 {
			return "not available"
		}
		return ""
	})
	e.status("elastic", "the Elastic PSTS's subnet available, the unknown one not", func(st cce.PodSubnetTopologySpreadStatus) string {
		if _, ok := st.AvailableSubnets[elasticID]; !ok || st.UnavailableSubnetsNum != 1 {
			return "not yet"
		}
		return ""
	})
	for id, exclusive := range map[string]bool{fixedID: true, elasticID: false} {
		s, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(e.ctx, id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Spec.Exclusive != exclusive || !s.Status.Enable || s.Spec.AvailabilityZone != "zone-a" {
			t.Errorf("Subnet %s = %+v %+v, want exclusive %v", id, s.Spec, s.Status, exclusive)
		}
	}
	if _, err := e.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(e.ctx, "sbn-unknown-to-the-cloud-"+e.ns,
		metav1.GetOptions{}); !isNotFound(err) {
		t.Fatalf("a Subnet for a subnet the cloud does not know: %v", fmt.Sprint(err))
	}
}
