package datastore

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// benchStore builds one node with enis ENIs of perENI idle addresses
// each (a warm pool) plus other nodes, so map sizes are realistic.
func benchStore(b *testing.B, cfg Config, enis, perENI, otherNodes int) *Store {
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for n := range otherNodes + 1 {
		node := fmt.Sprintf("node-%d", n)
		must(b, s.AddNode(node))
		for e := range enis {
			k := [4]byte{10, byte(n), byte(e), 250}
			en := ENI{ID: fmt.Sprintf("eni-%d-%d", n, e), SubnetID: "sbn", PrimaryIP: netip.AddrFrom4(k)}
			must(b, s.AddENI(node, en))
			addrs := make([]netip.Addr, perENI)
			for j := range addrs {
				k[3] = byte(1 + j)
				addrs[j] = netip.AddrFrom4(k)
			}
			must(b, s.AddIPs(node, en.ID, addrs, t0))
		}
	}
	return s
}

// BenchmarkStore_AllocateRelease: one CNI ADD plus one CNI DEL on a node
// with a warm pool (ENIs x addresses), 10 pods already running, and 99
// other nodes. Cooling is on and time advances 1s per op, so the pool
// rotates through cooling addresses as in production.
func BenchmarkStore_AllocateRelease(b *testing.B) {
	for _, size := range []struct{ enis, perENI int }{{2, 15}, {8, 39}} {
		b.Run(fmt.Sprintf("%dx%d", size.enis, size.perENI), func(b *testing.B) {
			s := benchStore(b, DefaultConfig(), size.enis, size.perENI, 99)
			for i := range 10 {
				_, err := s.Allocate("node-0", Request{Owner: owner(fmt.Sprintf("run-%d", i), "c")}, t0)
				must(b, err)
			}
			o := owner("pod", "c0")
			now := t0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				now = now.Add(time.Second)
				got, err := s.Allocate("node-0", Request{Owner: o}, now)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Release("node-0", got.Addr, o.ContainerID, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStore_AllocateRelease_Parallel: ADD+DEL pairs on many nodes at once,
// to show nodes do not serialise on one lock.
func BenchmarkStore_AllocateRelease_Parallel(b *testing.B) {
	s := benchStore(b, Config{}, 2, 15, 63)
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		node := fmt.Sprintf("node-%d", next.Add(1)%64)
		o := owner("pod", "c0")
		for pb.Next() {
			got, err := s.Allocate(node, Request{Owner: o}, t0)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Release(node, got.Addr, o.ContainerID, t0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStore_Stats: the per-node read the pool planner makes.
func BenchmarkStore_Stats(b *testing.B) {
	s := benchStore(b, DefaultConfig(), 2, 15, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Stats("node-0", t0); err != nil {
			b.Fatal(err)
		}
	}
}
