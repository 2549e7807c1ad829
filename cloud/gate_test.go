package cloud_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// A closed gate sends nothing: the call fails with class Canceled and the
// simulator sees no request. Reopened, calls go through again.
func TestGate_ClosedSendsNothing(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	before := e.srv.Stats().Ops[bcesim.OpListENIs].Calls
	fenced := errors.New("lease at risk")
	e.client.SetGate(func() error { return fenced })
	_, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC})
	if cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, fenced) {
		t.Fatalf("gated call: %v (class %v), want Canceled wrapping the gate's reason", err, cloud.ClassOf(err))
	}
	if got := e.srv.Stats().Ops[bcesim.OpListENIs].Calls; got != before {
		t.Fatalf("a gated call reached the cloud: %d calls, want %d", got, before)
	}
	e.client.SetGate(nil)
	if _, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
		t.Fatal(err)
	}
}

// Per-operation limits hold on top of the shared bucket and scale to the
// replica's share of the cluster's operations.
func TestOpLimits_ScaleWithShare(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{Rate: 100, Burst: 50,
		OpLimits: map[string]cloud.OpLimit{"ListENIs": {Rate: 0.1, Burst: 2}}}})
	ctx := context.Background()
	// Two tokens of burst, then one per ten seconds: the third call waits
	// (here, past its deadline) although the shared bucket is full.
	for range 2 {
		if _, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC}); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := e.client.ListENIs(short, cloud.ListENIsOptions{VPCID: testVPC}); cloud.ClassOf(err) != cloud.ClassCanceled {
		t.Fatalf("third ListENIs: %v, want it cut short waiting for its operation's token", err)
	}
	if _, err := e.client.GetENI(ctx, "eni-none"); cloud.ClassOf(err) == cloud.ClassCanceled {
		t.Fatalf("another operation waited on ListENIs' bucket: %v", err)
	}
	// A quarter of the cluster's operations: the limit is quartered.
	if err := e.client.SetOpShare(0.25); err != nil {
		t.Fatal(err)
	}
	if r, b := e.client.OpRate("ListENIs"); r != 0.025 || b != 1 {
		t.Fatalf("ListENIs share = %v/%v, want 0.025/s burst 1 (a quarter; never below one token)", r, b)
	}
}
