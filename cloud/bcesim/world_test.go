package bcesim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

func codeOf(err error) string {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func TestIPPool_ExactAccounting(t *testing.T) {
	p, err := newIPPool(netip.MustParsePrefix("10.0.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	if p.free != 5 {
		t.Fatalf("a /29 has %d free, want 8-3=5", p.free)
	}
	if err := p.allocExact(netip.MustParseAddr("10.0.0.1")); !errors.Is(err, errInUse) {
		t.Fatalf("gateway allocatable: %v", err)
	}
	if err := p.allocExact(netip.MustParseAddr("10.0.1.1")); !errors.Is(err, errOutOfRange) {
		t.Fatalf("out of range: %v", err)
	}
	seen := map[netip.Addr]bool{}
	for range 5 {
		a, err := p.allocAny()
		if err != nil || seen[a] || a == netip.MustParseAddr("10.0.0.7") || a == netip.MustParseAddr("10.0.0.0") {
			t.Fatalf("alloc %v %v", a, err)
		}
		seen[a] = true
	}
	if _, err := p.allocAny(); !errors.Is(err, errExhausted) || p.free != 0 {
		t.Fatalf("exhausted pool: %v free=%d", err, p.free)
	}
	if !p.release(netip.MustParseAddr("10.0.0.4")) || p.release(netip.MustParseAddr("10.0.0.4")) || p.release(netip.MustParseAddr("10.0.0.1")) {
		t.Fatal("release accounting")
	}
	if a, _ := p.allocAny(); a != netip.MustParseAddr("10.0.0.4") || p.free != 0 {
		t.Fatalf("realloc = %v", a)
	}
	for _, bad := range []string{"10.0.0.0/8", "10.0.0.0/31", "fd00::/64"} {
		if _, err := newIPPool(netip.MustParsePrefix(bad)); err == nil {
			t.Errorf("pool %s accepted", bad)
		}
	}
}

// newTestWorld: one VPC, subnets A (/24) and B (/28) in zone a, subnet C in
// zone b, and instances of several sizes.
func newTestWorld(t testing.TB, seed uint64) (*World, []string, []string) {
	w := NewWorld(WorldConfig{Seed: seed, AttachDelay: 2 * time.Second, MaxUnattachedENIsPerVPC: 30})
	mustID := func(id string, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	subnets := []string{
		mustID(w.AddSubnet(t0, SubnetSpec{ID: "sbn-a", ZoneName: "a", CIDR: "10.0.0.0/24", VPCID: "vpc"})),
		mustID(w.AddSubnet(t0, SubnetSpec{ID: "sbn-b", ZoneName: "a", CIDR: "10.0.1.0/28", VPCID: "vpc"})),
		mustID(w.AddSubnet(t0, SubnetSpec{ID: "sbn-c", ZoneName: "b", CIDR: "10.0.2.0/28", VPCID: "vpc"})),
	}
	mustID(w.AddSecurityGroup(t0, SecurityGroupSpec{ID: "g", VPCID: "vpc"}))
	var insts []string
	for i, sz := range [][2]int{{1, 1}, {2, 4}, {4, 16}, {16, 128}, {2, 8}} {
		sn := subnets[0]
		if i == 4 {
			sn = subnets[2]
		}
		insts = append(insts, mustID(w.AddInstance(t0, InstanceSpec{ID: fmt.Sprintf("i-%d", i), SubnetID: sn, CPUCount: sz[0], MemoryGB: sz[1]})))
	}
	return w, subnets, insts
}

func TestWorld_CapsAndStates(t *testing.T) {
	w, sn, insts := newTestWorld(t, 1)
	id, err := w.CreateENI(t0, CreateENIInput{Name: "n", SubnetID: sn[0], SecurityGroupIDs: []string{"g"}, PrivateIPs: []IPRequest{{Primary: true}}})
	if err != nil {
		t.Fatal(err)
	}
	// i-0 has 1 GB: 2 addresses per ENI. Fill to 3, then attach must refuse.
	if _, err := w.AddIPs(t0, id, AddIPsInput{Count: 2}); err != nil {
		t.Fatal(err)
	}
	if err := w.AttachENI(t0, id, insts[0]); codeOf(err) != CodeVMMemoryIPCap {
		t.Fatalf("attach over the memory cap: %v", err)
	}
	if err := w.AttachENI(t0, id, insts[4]); codeOf(err) != CodeVPCMismatch {
		t.Fatalf("attach across zones: %v", err)
	}
	if err := w.AttachENI(t0, id, insts[1]); err != nil {
		t.Fatal(err)
	}
	if err := w.DeleteENI(t0, id); codeOf(err) != CodeENIState {
		t.Fatalf("delete while attaching: %v", err)
	}
	if v, _ := w.GetENI(t0.Add(time.Second), 0, id); v.Status != StatusAttaching {
		t.Fatalf("status %s before the delay", v.Status)
	}
	if v, _ := w.GetENI(t0.Add(2*time.Second), 0, id); v.Status != StatusInUse {
		t.Fatalf("status %s after the delay", v.Status)
	}
	// i-1 has 2 vCPUs: a second ENI fits, a third does not.
	now := t0.Add(3 * time.Second)
	id2, _ := w.CreateENI(now, CreateENIInput{Name: "n2", SubnetID: sn[0], SecurityGroupIDs: []string{"g"}, PrivateIPs: []IPRequest{{Primary: true}}})
	id3, _ := w.CreateENI(now, CreateENIInput{Name: "n3", SubnetID: sn[0], SecurityGroupIDs: []string{"g"}, PrivateIPs: []IPRequest{{Primary: true}}})
	if err := w.AttachENI(now, id2, insts[1]); err != nil {
		t.Fatal(err)
	}
	if err := w.AttachENI(now, id3, insts[1]); codeOf(err) != CodeInstanceENICap {
		t.Fatalf("third ENI on 2 vCPUs: %v", err)
	}
	// Primary cannot go; batch over 10 is refused; explicit + count refused.
	v, _ := w.GetENI(now, 0, id)
	if err := w.RemoveIPs(now, 0, id, []string{v.PrivateIPSet[0].PrivateIPAddress}); codeOf(err) != CodePrimaryIPRelease {
		t.Fatalf("release primary: %v", err)
	}
	if _, err := w.AddIPs(now, id3, AddIPsInput{Count: 11}); codeOf(err) != CodeInvalidParameter {
		t.Fatalf("11 in one batch: %v", err)
	}
	if _, err := w.AddIPs(now, id3, AddIPsInput{Count: 1, IPs: []IPRequest{{Addr: "10.0.0.50"}}}); codeOf(err) != CodeInvalidParameter {
		t.Fatalf("count and list: %v", err)
	}
	if _, err := w.AddIPs(now, id3, AddIPsInput{IPs: []IPRequest{{Addr: "10.0.9.9"}}}); codeOf(err) != CodeIPOutsideSubnet {
		t.Fatalf("address outside the subnet: %v", err)
	}
	if _, err := w.AddIPs(now, id3, AddIPsInput{IPs: []IPRequest{{Addr: "10.0.1.5", Subnet: sn[1]}}}); err != nil {
		t.Fatalf("cross-subnet add: %v", err)
	}
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestWorld_ReplicaLag(t *testing.T) {
	w, sn, _ := newTestWorld(t, 2)
	lag := 3 * time.Second
	w.SetRetention(lag)
	id, _ := w.CreateENI(t0, CreateENIInput{Name: "n", SubnetID: sn[0], SecurityGroupIDs: []string{"g"}, PrivateIPs: []IPRequest{{Primary: true}}})
	if _, err := w.GetENI(t0.Add(time.Second), lag, id); codeOf(err) != CodeEniID {
		t.Fatalf("a lagged read sees an ENI created 1s ago: %v", err)
	}
	now := t0.Add(4 * time.Second)
	ips, _ := w.AddIPs(now, id, AddIPsInput{Count: 1})
	if err := w.RemoveIPs(now.Add(time.Second), lag, id, ips); codeOf(err) != CodePrivateIPNotExist {
		t.Fatalf("release of a 1s-old address under 3s lag: %v", err)
	}
	if v, _ := w.GetENI(now.Add(time.Second), lag, id); len(v.PrivateIPSet) != 1 {
		t.Fatalf("lagged read shows %d addresses, want only the primary", len(v.PrivateIPSet))
	}
	now = now.Add(lag)
	if err := w.RemoveIPs(now, lag, id, ips); err != nil {
		t.Fatal(err)
	}
	if v, _ := w.GetENI(now.Add(time.Second), lag, id); len(v.PrivateIPSet) != 2 {
		t.Fatalf("lagged read after release shows %d addresses, want the released one still", len(v.PrivateIPSet))
	}
	if err := w.DeleteENI(now, id); err != nil {
		t.Fatal(err)
	}
	if page, _ := w.ListENIs(now.Add(time.Second), lag, ENIFilter{}, "", 10); len(page.ENIs) != 1 {
		t.Fatalf("lagged list after delete shows %d enis, want 1", len(page.ENIs))
	}
	if page, _ := w.ListENIs(now.Add(lag), lag, ENIFilter{}, "", 10); len(page.ENIs) != 0 {
		t.Fatalf("list after the lag shows %d enis, want 0", len(page.ENIs))
	}
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestWorld_RandomOpsKeepInvariants applies thousands of random operations
// and checks every invariant after each one. The seed is logged; rerun a
// failure with BCESIM_SEED.
func TestWorld_RandomOpsKeepInvariants(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	w, sn, insts := newTestWorld(t, seed)
	w.SetRetention(time.Second)
	now := t0
	var enis []string
	counts := map[string]int{}
	for step := range 5000 {
		now = now.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
		var err error
		op := rng.IntN(8)
		pick := func() string {
			if len(enis) == 0 {
				return "eni-none"
			}
			return enis[rng.IntN(len(enis))]
		}
		lag := time.Duration(rng.IntN(2)) * time.Second
		switch op {
		case 0:
			var id string
			id, err = w.CreateENI(now, CreateENIInput{Name: "n", SubnetID: sn[rng.IntN(len(sn))], SecurityGroupIDs: []string{"g"},
				PrivateIPs: []IPRequest{{Primary: true}}})
			if err == nil {
				enis = append(enis, id)
			}
		case 1:
			err = w.AttachENI(now, pick(), insts[rng.IntN(len(insts))])
		case 2:
			err = w.DetachENI(now, pick(), "")
		case 3:
			id := pick()
			if err = w.DeleteENI(now, id); err == nil {
				for i, e := range enis {
					if e == id {
						enis = append(enis[:i], enis[i+1:]...)
						break
					}
				}
			}
		case 4, 5:
			in := AddIPsInput{Count: 1 + rng.IntN(MaxBatchIPs)}
			if rng.IntN(3) == 0 {
				in = AddIPsInput{IPs: []IPRequest{{Addr: fmt.Sprintf("10.0.%d.%d", rng.IntN(3), rng.IntN(256))}}}
			}
			_, err = w.AddIPs(now, pick(), in)
		case 6, 7:
			id := pick()
			v, gerr := w.GetENI(now, 0, id)
			if gerr != nil || len(v.PrivateIPSet) < 2 {
				continue
			}
			var rel []string
			for _, ip := range v.PrivateIPSet[1:] {
				if rng.IntN(2) == 0 {
					rel = append(rel, ip.PrivateIPAddress)
				}
			}
			if len(rel) == 0 {
				rel = append(rel, "10.0.0.1") // not on the ENI
			}
			err = w.RemoveIPs(now, lag, id, rel)
		}
		var ae *APIError
		if err != nil && !errors.As(err, &ae) {
			t.Fatalf("seed %d step %d: non-API error %v", seed, step, err)
		}
		if err != nil {
			counts[ae.Code]++
		} else {
			counts["ok"]++
		}
		if cerr := w.Check(); cerr != nil {
			t.Fatalf("seed %d step %d op %d: %v", seed, step, op, cerr)
		}
	}
	t.Logf("seed %d outcomes: %v", seed, counts)
	if counts["ok"] < 1000 || counts[CodeSubnetNoMoreIP]+counts[CodeVMMemoryIPCap] == 0 {
		t.Fatalf("random walk too shallow to test caps: %v", counts)
	}
}

func TestWorld_CreateENI_SecurityGroupKinds(t *testing.T) {
	w, sn, _ := newTestWorld(t, 1)
	primary := []IPRequest{{Primary: true}}
	id, err := w.CreateENI(t0, CreateENIInput{Name: "esg", SubnetID: sn[0], EnterpriseSecurityGroupIDs: []string{"esg-1"}, PrivateIPs: primary})
	if err != nil {
		t.Fatalf("enterprise security groups only: %v", err)
	}
	if got := w.enis[id].EnterpriseSGs; !slices.Equal(got, []string{"esg-1"}) || len(w.enis[id].SecurityGroups) != 0 {
		t.Fatalf("stored groups: enterprise %v, ordinary %v", got, w.enis[id].SecurityGroups)
	}
	for name, in := range map[string]CreateENIInput{
		"both":            {Name: "both", SubnetID: sn[0], SecurityGroupIDs: []string{"g"}, EnterpriseSecurityGroupIDs: []string{"esg-1"}, PrivateIPs: primary},
		"neither":         {Name: "neither", SubnetID: sn[0], PrivateIPs: primary},
		"not an esg ID":   {Name: "bad", SubnetID: sn[0], EnterpriseSecurityGroupIDs: []string{"g"}, PrivateIPs: primary},
		"empty esg token": {Name: "bad", SubnetID: sn[0], EnterpriseSecurityGroupIDs: []string{"esg-"}, PrivateIPs: primary},
	} {
		if _, err := w.CreateENI(t0, in); err == nil {
			t.Errorf("%s: created, want a refusal", name)
		}
	}
}
