package bcesim_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baidubce/bce-sdk-go/services/eni"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// BenchmarkServer_AddDeleteIP measures simulator throughput for the IPAM's
// hot calls over real HTTP with the real SDK (signing and verification
// included): each iteration adds one address to an ENI and deletes it again,
// i.e. two API calls. Reported as ops/s (API calls per second).
func BenchmarkServer_AddDeleteIP(b *testing.B) {
	w := startWorld(b, bcesim.Config{})
	if _, err := w.srv.AddSubnet(bcesim.SubnetSpec{ID: "sbn-bench", ZoneName: testZone, CIDR: "10.8.0.0/16", VPCID: testVPC}); err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := newSDK(b, w.url, testAK, testSK)
		res, err := c.eni.CreateEni(&eni.CreateEniArgs{Name: fmt.Sprintf("bench-%d", n.Add(1)), SubnetId: "sbn-bench",
			SecurityGroupIds: []string{w.sg}, PrivateIpSet: []eni.PrivateIp{{Primary: true}}})
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			ip, err := c.eni.AddPrivateIp(&eni.EniPrivateIpArgs{EniId: res.EniId})
			if err != nil {
				b.Error(err)
				return
			}
			if err := c.eni.DeletePrivateIp(&eni.EniPrivateIpArgs{EniId: res.EniId, PrivateIpAddress: ip.PrivateIpAddress}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "ops/s")
	if err := w.srv.Check(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkWorld_AddDeleteIP is the same work on the pure model, without
// HTTP: the ceiling the HTTP layer is measured against.
func BenchmarkWorld_AddDeleteIP(b *testing.B) {
	w := bcesim.NewWorld(bcesim.WorldConfig{})
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	sn, _ := w.AddSubnet(now, bcesim.SubnetSpec{ZoneName: "a", CIDR: "10.8.0.0/16", VPCID: "vpc"})
	sg, _ := w.AddSecurityGroup(now, bcesim.SecurityGroupSpec{VPCID: "vpc"})
	id, err := w.CreateENI(now, bcesim.CreateENIInput{Name: "b", SubnetID: sn, SecurityGroupIDs: []string{sg}, PrivateIPs: []bcesim.IPRequest{{Primary: true}}})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		ips, err := w.AddIPs(now, id, bcesim.AddIPsInput{Count: 1})
		if err != nil {
			b.Fatal(err)
		}
		if err := w.RemoveIPs(now, 0, id, ips); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkWorld_ListENIsByInstance lists one node's ENIs in a region of
// 3,000 instances with two ENIs each: the per-node sync call at scale.
func BenchmarkWorld_ListENIsByInstance(b *testing.B) {
	w := bcesim.NewWorld(bcesim.WorldConfig{MaxUnattachedENIsPerVPC: 100_000})
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	sn, _ := w.AddSubnet(now, bcesim.SubnetSpec{ZoneName: "a", CIDR: "10.0.0.0/16", VPCID: "vpc"})
	sg, _ := w.AddSecurityGroup(now, bcesim.SecurityGroupSpec{VPCID: "vpc"})
	var insts []string
	for i := range 3000 {
		id, err := w.AddInstance(now, bcesim.InstanceSpec{ID: fmt.Sprintf("i-%d", i), SubnetID: sn, CPUCount: 8, MemoryGB: 32})
		if err != nil {
			b.Fatal(err)
		}
		insts = append(insts, id)
		for range 2 {
			e, err := w.CreateENI(now, bcesim.CreateENIInput{Name: "c/" + id, SubnetID: sn, SecurityGroupIDs: []string{sg}, PrivateIPs: []bcesim.IPRequest{{Primary: true}}})
			if err != nil {
				b.Fatal(err)
			}
			if err := w.AttachENI(now, e, id); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for i := range b.N {
		page, err := w.ListENIs(now, 0, bcesim.ENIFilter{InstanceID: insts[i%len(insts)]}, "", 1000)
		if err != nil || len(page.ENIs) != 2 {
			b.Fatalf("%v %d", err, len(page.ENIs))
		}
	}
}
