//go:build integration

package membership

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cce-ipam/sharded/e2e/cluster"
)

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
}

// candidate is one Elector running against the real API server.
type candidate struct {
	el      *Elector
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
	stopped atomic.Int32 // OnStoppedLeading calls
}

// TestElector_OneLeaderThenQuickHandover: two candidates on one Lease;
// exactly one leads (its duty never overlaps the other's), and cancelling the
// leader releases the Lease so the other takes over well before the lease
// duration would have expired.
func TestElector_OneLeaderThenQuickHandover(t *testing.T) {
	ns := cp.Namespace(t)
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	cfg := LeaderConfig{Namespace: ns, Name: "cce-ipam-leader", LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: 200 * time.Millisecond}

	var (
		mu       sync.Mutex
		active   int      // duties running now
		overlaps int      // times a duty started while another ran
		starts   []string // identities, in the order their duties started
	)
	newCandidate := func(identity string) *candidate {
		c := &candidate{reg: prometheus.NewRegistry(), done: make(chan error, 1)}
		el, err := NewElector(cfg, cs, identity, LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				mu.Lock()
				active++
				if active > 1 {
					overlaps++
				}
				starts = append(starts, identity)
				mu.Unlock()
				<-ctx.Done()
				time.Sleep(300 * time.Millisecond) // a duty that takes a moment to stop
				mu.Lock()
				active--
				mu.Unlock()
			},
			OnStoppedLeading: func() { c.stopped.Add(1) },
		}, nil, c.reg)
		if err != nil {
			t.Fatal(err)
		}
		c.el = el
		ctx, cancel := context.WithCancel(context.Background())
		c.cancel = cancel
		go func() { c.done <- el.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-c.done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("Run of %s: %v", identity, err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Run of %s did not return", identity)
			}
		})
		return c
	}
	a := newCandidate("ipam-a-0001")
	b := newCandidate("ipam-b-0002")

	eventually(t, 20*time.Second, "one candidate leads", func() bool { return a.el.IsLeader() || b.el.IsLeader() })
	// For a few renewals, exactly one leads and the Lease names it.
	for range 10 {
		if a.el.IsLeader() == b.el.IsLeader() {
			t.Fatalf("leaders: a=%v b=%v", a.el.IsLeader(), b.el.IsLeader())
		}
		time.Sleep(100 * time.Millisecond)
	}
	leader, other := a, b
	if b.el.IsLeader() {
		leader, other = b, a
	}
	lease, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), cfg.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := lease.Spec.HolderIdentity; got == nil || *got != leader.el.Identity() {
		t.Fatalf("Lease holder %v, want %s", got, leader.el.Identity())
	}
	if counter(leader.el.metrics.isLeader) != 1 || counter(other.el.metrics.isLeader) != 0 {
		t.Fatalf("is_leader gauges: leader %v, other %v", counter(leader.el.metrics.isLeader), counter(other.el.metrics.isLeader))
	}

	// Cancel the leader: it stops its duty, releases the Lease, and returns.
	began := time.Now()
	leader.cancel()
	select {
	case err := <-leader.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		leader.done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled leader's Run did not return")
	}
	if leader.el.IsLeader() || leader.stopped.Load() != 1 || counter(leader.el.metrics.isLeader) != 0 {
		t.Fatalf("after cancel: IsLeader=%v, OnStoppedLeading calls=%d", leader.el.IsLeader(), leader.stopped.Load())
	}
	eventually(t, cfg.LeaseDuration, "the other candidate takes over", other.el.IsLeader)
	took := time.Since(began)
	// Without the release the other would wait out the lease duration (6s).
	if took > cfg.LeaseDuration/2 {
		t.Errorf("takeover took %v, want well below the %v lease duration", took, cfg.LeaseDuration)
	}
	t.Logf("takeover after cancel: %v", took)

	lease, err = cs.CoordinationV1().Leases(ns).Get(context.Background(), cfg.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := lease.Spec.HolderIdentity; got == nil || *got != other.el.Identity() {
		t.Fatalf("Lease holder %v after takeover, want %s", got, other.el.Identity())
	}
	mu.Lock()
	defer mu.Unlock()
	if overlaps != 0 || len(starts) != 2 || starts[0] != leader.el.Identity() || starts[1] != other.el.Identity() {
		t.Fatalf("duties: starts %v, overlaps %d", starts, overlaps)
	}
}

// TestElector_IdentityIsMemberName: the member name of a Membership is a
// valid, unique Lease identity (what cmd wires together).
func TestElector_IdentityIsMemberName(t *testing.T) {
	ns := cp.Namespace(t)
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	m := start(t, fastConfig("cce-ipam-0"), true)
	led := make(chan struct{})
	el, err := NewElector(LeaderConfig{Namespace: ns, Name: "cce-ipam-leader", LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond},
		cs, m.m.Name(), LeaderCallbacks{OnStartedLeading: func(ctx context.Context) { close(led); <-ctx.Done() }}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	select {
	case <-led:
	case <-time.After(20 * time.Second):
		t.Fatal("a lone candidate did not lead")
	}
	lease, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "cce-ipam-leader", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != m.m.Name() {
		t.Fatalf("Lease %+v, %v; want holder %s", lease, err, m.m.Name())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lease, err = cs.CoordinationV1().Leases(ns).Get(context.Background(), "cce-ipam-leader", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Fatalf("Lease still held by %q after cancel (ReleaseOnCancel)", *h)
	}
}

// TestElector_LostLeaseStopsDutyAndCampaignsAgain: when another holder takes
// the Lease (here: written by hand), the leader stops its duty within the
// renew deadline, reports it, and campaigns again once that holder's lease
// has expired.
func TestElector_LostLeaseStopsDutyAndCampaignsAgain(t *testing.T) {
	ns := cp.Namespace(t)
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	cfg := LeaderConfig{Namespace: ns, Name: "lost", LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond}
	var terms, stopped atomic.Int32
	dutyEnded := make(chan struct{}, 4)
	el, err := NewElector(cfg, cs, "ipam-a-0001", LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) { terms.Add(1); <-ctx.Done(); dutyEnded <- struct{}{} },
		OnStoppedLeading: func() { stopped.Add(1) },
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Run did not return")
		}
	})
	eventually(t, 20*time.Second, "the candidate leads", el.IsLeader)

	// Someone else takes the Lease.
	leases := cs.CoordinationV1().Leases(ns)
	lease, err := leases.Get(context.Background(), cfg.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	intruder, secs, now := "intruder", int32(2), metav1.NowMicro()
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds = &intruder, &secs
	lease.Spec.AcquireTime, lease.Spec.RenewTime = &now, &now
	if _, err := leases.Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dutyEnded:
	case <-time.After(cfg.RenewDeadline + 3*time.Second):
		t.Fatal("the duty did not stop after the Lease was lost")
	}
	if el.IsLeader() {
		t.Fatal("IsLeader still true after the duty stopped")
	}
	// OnStoppedLeading follows the duty's return.
	eventually(t, 5*time.Second, "OnStoppedLeading is called", func() bool { return stopped.Load() == 1 })
	// The intruder never renews: the candidate leads again.
	eventually(t, 15*time.Second, "the candidate leads again", func() bool { return el.IsLeader() && terms.Load() == 2 })
	lease, err = leases.Get(context.Background(), cfg.Name, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "ipam-a-0001" {
		t.Fatalf("Lease after re-election: %+v, %v", lease.Spec, err)
	}
}
