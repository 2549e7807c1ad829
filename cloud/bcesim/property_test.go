package bcesim_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/baidubce/bce-sdk-go/bce"
	"github.com/baidubce/bce-sdk-go/services/eni"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

func propertySeed(t *testing.T) uint64 {
	if s := os.Getenv("BCESIM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// TestProperty_ConcurrentSDKOps runs thousands of random operations from
// several goroutines through the real SDK over HTTP, with injected 5xx before
// and after mutations, and then checks from the outside (the dump) and the
// inside (World.Check) that no address is held twice in a subnet, availableIp
// equals the free addresses, and every cap holds.
func TestProperty_ConcurrentSDKOps(t *testing.T) {
	seed := propertySeed(t)
	t.Logf("seed %d (replay with BCESIM_SEED=%d)", seed, seed)
	w := startWorld(t, bcesim.Config{World: bcesim.WorldConfig{Seed: seed, AttachDelay: 20 * time.Millisecond, MaxUnattachedENIsPerVPC: 40}})
	if err := w.srv.SetFaults(bcesim.Faults{
		ErrorRate:         map[bcesim.Op]float64{"*": 0.03},
		FailAfterMutation: map[bcesim.Op]int{bcesim.OpBatchAddPrivateIP: 15, bcesim.OpCreateENI: 5, bcesim.OpBatchDeletePrivateIP: 10},
	}); err != nil {
		t.Fatal(err)
	}
	insts := []string{w.small, w.big, w.tiny}
	subnets := []string{w.subnet, w.subnet2}
	const workers, opsPerWorker = 4, 600
	var (
		mu       sync.Mutex
		outcomes = map[string]int{}
		wg       sync.WaitGroup
		fatal    = make(chan error, workers)
	)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			c := newSDK(t, w.url, testAK, testSK)
			var mine []string
			pick := func() string {
				if len(mine) == 0 {
					return "eni-none"
				}
				return mine[rng.IntN(len(mine))]
			}
			for i := range opsPerWorker {
				var err error
				switch rng.IntN(10) {
				case 0:
					var res *eni.CreateEniResult
					res, err = c.eni.CreateEni(&eni.CreateEniArgs{Name: fmt.Sprintf("c-p/%d/%d", g, i), SubnetId: subnets[rng.IntN(2)],
						SecurityGroupIds: []string{w.sg}, PrivateIpSet: []eni.PrivateIp{{Primary: true}}})
					if err == nil {
						mine = append(mine, res.EniId)
					}
				case 1:
					inst := insts[rng.IntN(len(insts))]
					err = c.eni.AttachEniInstance(&eni.EniInstance{EniId: pick(), InstanceId: &inst})
				case 2:
					inst := insts[rng.IntN(len(insts))]
					err = c.eni.DetachEniInstance(&eni.EniInstance{EniId: pick(), InstanceId: &inst})
				case 3:
					id := pick()
					if err = c.eni.DeleteEni(&eni.DeleteEniArgs{EniId: id}); err == nil {
						mine = slices.DeleteFunc(mine, func(s string) bool { return s == id })
					}
				case 4, 5:
					if rng.IntN(2) == 0 {
						_, err = c.eni.BatchAddPrivateIp(&eni.EniBatchPrivateIpArgs{EniId: pick(), PrivateIpAddressCount: 1 + rng.IntN(10)})
					} else {
						_, err = c.eni.AddPrivateIp(&eni.EniPrivateIpArgs{EniId: pick(), PrivateIpAddress: fmt.Sprintf("10.0.0.%d", rng.IntN(256))})
					}
				case 6, 7:
					id := pick()
					var got *eni.Eni
					if got, err = c.eni.GetEniDetail(id); err == nil && len(got.PrivateIpSet) > 1 {
						var rel []string
						for _, ip := range got.PrivateIpSet {
							if !ip.Primary && rng.IntN(2) == 0 {
								rel = append(rel, ip.PrivateIpAddress)
							}
						}
						if len(rel) == 1 {
							err = c.eni.DeletePrivateIp(&eni.EniPrivateIpArgs{EniId: id, PrivateIpAddress: rel[0]})
						} else if len(rel) > 1 {
							err = c.eni.BatchDeletePrivateIp(&eni.EniBatchPrivateIpArgs{EniId: id, PrivateIpAddresses: rel})
						}
					}
				case 8:
					_, err = c.eni.ListEni(&eni.ListEniArgs{InstanceId: insts[rng.IntN(len(insts))]})
				case 9:
					_, err = c.vpc.GetSubnetDetail(subnets[rng.IntN(2)])
				}
				code := "ok"
				if err != nil {
					var se *bce.BceServiceError
					if !errors.As(err, &se) {
						fatal <- fmt.Errorf("worker %d op %d: not a service error: %w", g, i, err)
						return
					}
					code = se.Code
				}
				mu.Lock()
				outcomes[code]++
				mu.Unlock()
				if i%100 == 0 {
					if err := w.srv.Check(); err != nil {
						fatal <- fmt.Errorf("worker %d op %d: %w", g, i, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(fatal)
	for err := range fatal {
		t.Fatalf("seed %d: %v", seed, err)
	}
	t.Logf("seed %d outcomes: %v", seed, outcomes)
	if err := w.srv.Check(); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	checkDump(t, w.srv.Dump())
	if outcomes["ok"] < workers*opsPerWorker/4 {
		t.Fatalf("too few successful operations to mean anything: %v", outcomes)
	}
}

// checkDump re-derives the invariants from the public dump alone.
func checkDump(t *testing.T, d bcesim.WorldDump) {
	t.Helper()
	held := map[string]map[string]bool{}
	prefix := map[string]netip.Prefix{}
	for _, sn := range d.Subnets {
		held[sn.SubnetID] = map[string]bool{}
		prefix[sn.SubnetID] = netip.MustParsePrefix(sn.CIDR)
	}
	take := func(subnet, ip, who string) {
		if held[subnet][ip] {
			t.Fatalf("%s holds %s in %s, which is already held", who, ip, subnet)
		}
		if !prefix[subnet].Contains(netip.MustParseAddr(ip)) {
			t.Fatalf("%s holds %s outside %s", who, ip, subnet)
		}
		held[subnet][ip] = true
	}
	mem := map[string]int{}
	cpu := map[string]int{}
	for _, in := range d.Instances {
		take(in.SubnetID, in.InternalIP, in.ID)
		mem[in.ID], cpu[in.ID] = in.MemoryCapacityInGB, in.CPUCount
	}
	perInst := map[string]int{}
	for _, e := range d.ENIs {
		for _, ip := range e.PrivateIPSet {
			sn := e.SubnetID
			if ip.SubnetID != "" {
				sn = ip.SubnetID
			}
			take(sn, ip.PrivateIPAddress, e.ENIID)
		}
		if e.InstanceID != "" {
			perInst[e.InstanceID]++
			if limit := bcesim.MaxIPsPerENI(mem[e.InstanceID]); len(e.PrivateIPSet) > limit {
				t.Fatalf("%s holds %d addresses on %s, cap %d", e.ENIID, len(e.PrivateIPSet), e.InstanceID, limit)
			}
		}
	}
	for inst, n := range perInst {
		if n > bcesim.MaxENIsPerInstance(cpu[inst]) {
			t.Fatalf("%s has %d enis", inst, n)
		}
	}
	for _, sn := range d.Subnets {
		size := 1 << (32 - prefix[sn.SubnetID].Bits())
		if want := size - 3 - len(held[sn.SubnetID]); sn.AvailableIP != want {
			t.Fatalf("subnet %s availableIp %d, free addresses %d", sn.SubnetID, sn.AvailableIP, want)
		}
	}
}
