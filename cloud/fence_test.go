package cloud_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// A call made for a node asks the node's permission
// before every HTTP attempt. A call answered 5xx whose permission ended
// before the retry is not retried: BCE sees one request, and the call fails
// Canceled, matching ErrFenced and the permission's reason.
func TestForNode_NotRetriedAfterPermissionEnds(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{
		SDKRetries:   3,
		SDKRetryBase: time.Millisecond,
	}})
	if err := e.srv.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpDeletePrivateIP: 1}}); err != nil {
		t.Fatal(err)
	}
	calls := func() int64 { return e.srv.Stats().Ops[bcesim.OpDeletePrivateIP].Calls }
	before := calls()
	lost := errors.New("partition 7 moved away")
	asked := 0
	ctx := cloud.ForNode(context.Background(), "node-a", func() (time.Time, error) {
		asked++
		if calls() > before {
			return time.Time{}, lost // ends once the first attempt reached BCE
		}
		return time.Now().Add(time.Minute), nil
	})
	err := e.client.DeletePrivateIP(ctx, "eni-x", "10.0.0.5")
	if n := calls() - before; n != 1 {
		t.Fatalf("the node's permission ended after the first attempt (a 5xx), yet BCE saw %d requests (err %v)", n, err)
	}
	if cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, cloud.ErrFenced) || !errors.Is(err, lost) {
		t.Fatalf("retry after the permission ended: %v (class %v), want Canceled matching ErrFenced and the reason", err,
			cloud.ClassOf(err))
	}
	if asked < 2 {
		t.Fatalf("permission asked %d times, want before the attempt and again before the retry", asked)
	}
}

// A call whose permission is already refused sends nothing; so does one
// nested in a second node's permission (a fixed IP moving between nodes
// acts for both) when either refuses.
func TestForNode_RefusedSendsNothing(t *testing.T) {
	e := newEnv(t, envOpts{})
	calls := func() int64 { return e.srv.Stats().Ops[bcesim.OpBatchAddPrivateIP].Calls }
	before := calls()
	ok := func() (time.Time, error) { return time.Time{}, nil }
	no := func() (time.Time, error) { return time.Time{}, errors.New("not the owner") }
	for name, ctx := range map[string]context.Context{
		"refused":       cloud.ForNode(context.Background(), "node-a", no),
		"outer refused": cloud.ForNode(cloud.ForNode(context.Background(), "node-a", no), "node-b", ok),
		"inner refused": cloud.ForNode(cloud.ForNode(context.Background(), "node-a", ok), "node-b", no),
	} {
		_, err := e.client.BatchAddPrivateIPs(ctx, "eni-x", cloud.BatchAddRequest{Count: 1})
		if cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, cloud.ErrFenced) {
			t.Errorf("%s: %v, want Canceled matching ErrFenced", name, err)
		}
	}
	if n := calls() - before; n != 0 {
		t.Fatalf("calls whose node permission was refused reached BCE %d times", n)
	}
}

// Every attempt ends at the permission's deadline: a delete held up at BCE
// past it is cut off (here bce-sim sees the client go and never applies
// it), rather than landing after another replica may have taken the node.
func TestForNode_AttemptEndsAtPermissionDeadline(t *testing.T) {
	e := newEnv(t, envOpts{})
	bg := context.Background()
	eniID, err := e.client.CreateENI(bg, cloud.CreateENIRequest{
		Name:             "c/i/n/0",
		SubnetID:         e.subnet,
		SecurityGroupIDs: []string{e.sg},
	})
	if err != nil {
		t.Fatal(err)
	}
	ips, err := e.client.BatchAddPrivateIPs(bg, eniID, cloud.BatchAddRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.srv.SetFaults(bcesim.Faults{LatencyMs: map[bcesim.Op]int{bcesim.OpDeletePrivateIP: 1500}}); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(300 * time.Millisecond)
	ctx := cloud.ForNode(bg, "node-a", func() (time.Time, error) { return until, nil })
	start := time.Now()
	err = e.client.DeletePrivateIP(ctx, eniID, ips[0])
	took := time.Since(start)
	if cloud.ClassOf(err) != cloud.ClassCanceled || took > time.Second {
		t.Fatalf("a delete held at BCE past its permission's deadline returned %v after %s, want Canceled at the deadline (300 ms)",
			err, took.Round(time.Millisecond))
	}
	time.Sleep(1500 * time.Millisecond)
	got, err := e.client.GetENI(bg, eniID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range got.PrivateIPs {
		if p.Address == ips[0] {
			return
		}
	}
	t.Fatalf("%s was deleted although the attempt was cut off at its permission's deadline", ips[0])
}
