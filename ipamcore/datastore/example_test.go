package datastore_test

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// The life of one address: restored on takeover, allocated by a CNI ADD,
// guarded against a stale DEL, released, cooling, then reused.
func Example() {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s, _ := datastore.New(datastore.DefaultConfig())
	eni := datastore.ENI{ID: "eni-1", SubnetID: "sbn-1", SubnetCIDR: netip.MustParsePrefix("10.0.1.0/24"),
		PrimaryIP: netip.MustParseAddr("10.0.1.2"), Capacity: 8}
	rep, _ := s.Restore("node-a", datastore.RestoreInput{
		ENIs: []datastore.RestoreENI{{ENI: eni, IPs: []netip.Addr{netip.MustParseAddr("10.0.1.10")}}},
	}, now)
	fmt.Println("restored idle:", rep.Idle, "conflicts:", len(rep.Conflicts))

	web := datastore.Owner{Namespace: "default", Name: "web", ContainerID: "sandbox-1"}
	ip, _ := s.Allocate("node-a", datastore.Request{Owner: web}, now)
	fmt.Println("web got", ip.Addr, "on", ip.ENIID)

	_, err := s.Release("node-a", ip.Addr, "sandbox-0", now)
	fmt.Println("stale DEL refused:", errors.Is(err, datastore.ErrContainerMismatch))

	_, _ = s.Release("node-a", ip.Addr, "sandbox-1", now)
	other := datastore.Owner{Namespace: "default", Name: "api", ContainerID: "c"}
	_, err = s.Allocate("node-a", datastore.Request{Owner: other}, now.Add(time.Second))
	var cooling *datastore.CoolingError
	if errors.As(err, &cooling) {
		fmt.Println("cooling until", cooling.ReadyAt.Format(time.TimeOnly))
	}
	ip, _ = s.Allocate("node-a", datastore.Request{Owner: other}, cooling.ReadyAt)
	fmt.Println("api got", ip.Addr)
	// Output:
	// restored idle: 1 conflicts: 0
	// web got 10.0.1.10 on eni-1
	// stale DEL refused: true
	// cooling until 12:00:05
	// api got 10.0.1.10
}
