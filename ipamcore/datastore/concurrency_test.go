package datastore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStore_Concurrent runs per-node workers (allocate/release), readers
// across nodes, a churn worker that drops and restores a node, and a mover
// that shifts addresses between nodes, all at once. Run it with -race. At
// the end the invariants must hold and every worker's own record of what
// it holds must match the store.
func TestStore_Concurrent(t *testing.T) {
	s, err := New(Config{Cooldown: 50 * time.Millisecond})
	must(t, err)
	var clock atomic.Int64 // fake time in ms, advanced by every worker
	now := func() time.Time { return t0.Add(time.Duration(clock.Add(1)) * time.Millisecond) }

	const workers, pods, iters = 4, 12, 1500
	for w := range workers {
		node := fmt.Sprintf("w%d", w)
		must(t, s.AddNode(node))
		for e := range 2 {
			k := byte(w*2 + e)
			en := ENI{ID: fmt.Sprintf("eni-%d-%d", w, e), SubnetID: "sbn", PrimaryIP: netip.AddrFrom4([4]byte{10, 1, k, 1})}
			must(t, s.AddENI(node, en))
			var addrs []netip.Addr
			for j := range 10 {
				addrs = append(addrs, netip.AddrFrom4([4]byte{10, 1, k, byte(10 + j)}))
			}
			must(t, s.AddIPs(node, en.ID, addrs, t0))
		}
	}

	var wg sync.WaitGroup
	errc := make(chan error, 16)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	held := make([]map[string]IPInfo, workers) // per worker: pod -> address it holds

	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := fmt.Sprintf("w%d", w)
			r := rand.New(rand.NewPCG(uint64(w), 1))
			mine := map[string]IPInfo{}
			for i := range iters {
				pod := fmt.Sprintf("p%d", r.IntN(pods))
				if got, ok := mine[pod]; ok {
					// a stale DEL first: must be refused
					if _, err := s.Release(node, got.Addr, "stale", now()); !errors.Is(err, ErrContainerMismatch) {
						report(fmt.Errorf("%s: stale release of %s: %w", node, got.Addr, err))
						return
					}
					if _, err := s.Release(node, got.Addr, got.Owner.ContainerID, now()); err != nil {
						report(fmt.Errorf("%s: release %s: %w", node, got.Addr, err))
						return
					}
					delete(mine, pod)
					continue
				}
				o := Owner{Namespace: "ns", Name: pod, ContainerID: fmt.Sprintf("c%d", i)}
				got, err := s.Allocate(node, Request{Owner: o}, now())
				switch {
				case errors.Is(err, ErrNoIdleIP):
				case err != nil:
					report(fmt.Errorf("%s: allocate: %w", node, err))
					return
				default:
					mine[pod] = got
				}
			}
			held[w] = mine
		}()
	}

	// Readers across all nodes.
	for rd := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(100+rd), 2))
			for range iters {
				node := fmt.Sprintf("w%d", r.IntN(workers))
				if _, err := s.Stats(node, now()); err != nil {
					report(err)
					return
				}
				if _, err := s.Snapshot(node); err != nil {
					report(err)
					return
				}
				a := netip.AddrFrom4([4]byte{10, 1, byte(r.IntN(2 * workers)), byte(10 + r.IntN(10))})
				if info, err := s.LookupIP(a); err != nil && !errors.Is(err, ErrUnknownIP) {
					report(err)
					return
				} else if err == nil && info.Addr != a {
					report(fmt.Errorf("lookup %s returned %s", a, info.Addr))
					return
				}
				_ = s.Nodes()
			}
		}()
	}

	// Churn: a node that comes and goes (shard hand-over), restored from a
	// snapshot, while the others keep working.
	wg.Add(1)
	go func() {
		defer wg.Done()
		en := ENI{ID: "eni-churn", SubnetID: "sbn", PrimaryIP: netip.MustParseAddr("10.2.0.1")}
		in := RestoreInput{ENIs: []RestoreENI{{ENI: en, IPs: []netip.Addr{
			netip.MustParseAddr("10.2.0.10"), netip.MustParseAddr("10.2.0.11")}}},
			Claims: []Claim{{Addr: netip.MustParseAddr("10.2.0.10"), Owner: owner("x", "c")}}}
		for i := range iters / 3 {
			rep, err := s.Restore("churn", in, now())
			if err != nil || rep.Assigned != 1 || rep.Idle != 1 || len(rep.Conflicts) != 0 {
				report(fmt.Errorf("restore churn: %+v %w", rep, err))
				return
			}
			if i%2 == 0 {
				if _, err := s.RemoveNode("churn"); err != nil {
					report(err)
					return
				}
			}
		}
	}()

	// Mover: an address travels between two nodes (a fixed IP moving with
	// its StatefulSet pod): remove from one, add on the other.
	wg.Add(1)
	go func() {
		defer wg.Done()
		a := netip.MustParseAddr("10.3.0.10")
		for n := range 2 {
			node := fmt.Sprintf("mv%d", n)
			if err := s.AddNode(node); err != nil {
				report(err)
				return
			}
			primary := netip.AddrFrom4([4]byte{10, 3, 0, byte(1 + n)})
			if err := s.AddENI(node, ENI{ID: "eni-" + node, SubnetID: "sbn", PrimaryIP: primary}); err != nil {
				report(err)
				return
			}
		}
		for i := range iters {
			from, to := fmt.Sprintf("mv%d", i%2), fmt.Sprintf("mv%d", (i+1)%2)
			o := owner("web-0", fmt.Sprintf("c%d", i))
			if i > 0 {
				// still on the old node: the new one must refuse it
				if _, err := s.AddAssignedIP(to, "eni-"+to, a, o, now()); !errors.Is(err, ErrIPExists) {
					report(fmt.Errorf("add on %s while on %s: %w", to, from, err))
					return
				}
				if _, err := s.RemoveIP(from, a); err != nil {
					report(err)
					return
				}
			}
			if _, err := s.AddAssignedIP(to, "eni-"+to, a, o, now()); err != nil {
				report(fmt.Errorf("add on %s: %w", to, err))
				return
			}
		}
	}()

	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	check(t, s)
	for w, mine := range held {
		node := fmt.Sprintf("w%d", w)
		st, err := s.Stats(node, now())
		must(t, err)
		if st.Assigned != len(mine) || st.Total != 20 {
			t.Fatalf("%s: stats %+v, worker holds %d", node, st, len(mine))
		}
		for pod, want := range mine {
			got, err := s.LookupPod(node, PodKey{"ns", pod})
			if err != nil || got.Addr != want.Addr || got.Owner != want.Owner {
				t.Fatalf("%s: pod %s: %+v %v, want %+v", node, pod, got, err, want)
			}
		}
	}
}

// TestStore_Verify_Concurrent: Verify sees a consistent state (no false
// alarms) while nodes change under it.
func TestStore_Verify_Concurrent(t *testing.T) {
	s, err := New(Config{})
	must(t, err)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 3 {
		node := fmt.Sprintf("v%d", w)
		must(t, s.AddNode(node))
		must(t, s.AddENI(node, ENI{ID: "eni-" + node, SubnetID: "s", PrimaryIP: netip.AddrFrom4([4]byte{10, 9, byte(w), 1})}))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a := netip.AddrFrom4([4]byte{10, 9, byte(w), byte(10 + i%50)})
				if err := s.AddIPs(node, "eni-"+node, []netip.Addr{a}, t0); err != nil {
					_, _ = s.RemoveIP(node, a)
				}
				_, _ = s.Allocate(node, Request{Owner: owner(fmt.Sprintf("p%d", i%7), "c")}, t0)
			}
		}()
	}
	for range 300 {
		if err := s.Verify(); err != nil {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
