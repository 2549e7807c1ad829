package pool_test

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// A node whose pool ran dry: plan growth, carry it out against the
// datastore (the cloud call is elided), and see that the pool is warm.
func Example() {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s, _ := datastore.New(datastore.DefaultConfig())
	_ = s.AddNode("node-a")
	_ = s.AddENI("node-a", datastore.ENI{ID: "eni-1", SubnetID: "sbn-1", PrimaryIP: netip.MustParseAddr("10.0.1.2"), Capacity: 8})

	capc, err := pool.CapacityFromAnnotations(map[string]string{pool.AnnotationMaxIPPerENI: "8"}, pool.DefaultCapacity())
	fmt.Println("capacity:", capc, err)

	cfg := pool.DefaultConfig()
	snap, _ := s.Snapshot("node-a")
	plan := pool.PlanGrow(cfg, capc, pool.StateFromSnapshot(snap, nil), nil, now)
	fmt.Printf("need %d, adds %v, new eni %v (%s)\n", plan.Need, plan.Adds, plan.NewENI, plan.ENIReason)

	for _, add := range plan.Adds {
		var got []netip.Addr // what BatchAddPrivateIP would return
		for i := range add.Count {
			got = append(got, netip.AddrFrom4([4]byte{10, 0, 1, byte(10 + i)}))
		}
		_ = s.AddIPs("node-a", add.ENIID, got, now)
	}
	snap, _ = s.Snapshot("node-a")
	plan = pool.PlanGrow(cfg, capc, pool.StateFromSnapshot(snap, nil), nil, now)
	fmt.Printf("need %d\n", plan.Need)
	// Output:
	// capacity: {8 8 4 1 false} <nil>
	// need 4, adds [{eni-1 4}], new eni false (attached enis have enough room)
	// need 0
}
