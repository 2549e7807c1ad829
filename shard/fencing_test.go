package shard

import (
	"context"
	"errors"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

// Every claim CAS moves the claim's epoch (spec.leaseTransitions) on: a
// claim, a takeover, a reclaim and a release. The fencing token of a
// partition names the epoch this replica wrote, and only while it serves.
func TestCoordinator_ClaimEpochMovesOnEveryCAS(t *testing.T) {
	c, _ := newTestCoordinator(t)
	ctx := context.Background()
	const node = "node-a"
	p := PartitionOf(c.cfg.Ring.Partitions, node)
	leases := c.kube.CoordinationV1().Leases("ns")
	read := func() *coordv1.Lease {
		t.Helper()
		l, err := leases.Get(ctx, PartitionLeaseName(p), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	won, cl, _ := c.claimIO(ctx, p, Claim{})
	if !won || cl.Epoch != 1 || ptr.Deref(read().Spec.LeaseTransitions, 0) != 1 {
		t.Fatalf("first claim: won=%v claim=%+v lease transitions %v, want epoch 1", won, cl, read().Spec.LeaseTransitions)
	}
	// Another replica's claim, taken over (r1 has never been seen: expired).
	l := read()
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("r1"), ptr.To(int32(7))
	l.ResourceVersion = "5" // the fake clientset keeps versions as written
	l, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	won, cl, reason := c.claimIO(ctx, p, Claim{Holder: "r1", Version: l.ResourceVersion, Epoch: 7})
	if !won || reason != "takeover" || cl.Epoch != 8 || ptr.Deref(read().Spec.LeaseTransitions, 0) != 8 {
		t.Fatalf("takeover: won=%v reason=%s claim=%+v, want epoch 8", won, reason, cl)
	}

	// Serving: the token names the claim as written.
	renew(t, c)
	c.written[p] = writtenClaim{claim: cl, replaced: l.ResourceVersion}
	serveByHand(t, c, p)
	tok, _, err := c.FenceToken(node)
	if err != nil || tok != (ipam.FenceToken{Partition: p, Holder: "r0", Epoch: 8}) {
		t.Fatalf("FenceToken = %+v, %v; want partition %d, r0, epoch 8", tok, err, p)
	}

	// The watch shows someone else's claim: no token.
	delete(c.written, p)
	c.claims = make([]Claim, c.cfg.Ring.Partitions)
	c.claims[p] = Claim{Holder: "r2", Version: "x", Epoch: 9}
	c.publish()
	if _, _, err := c.FenceToken(node); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("FenceToken on a claim naming another replica: %v, want ErrNotOwner", err)
	}

	// The release moves it on too.
	c.claims[p] = Claim{Holder: "r0", Version: read().ResourceVersion, Epoch: 8}
	c.publish()
	c.release(ctx, p, read().ResourceVersion)
	if got := read(); ptr.Deref(got.Spec.HolderIdentity, "x") != "" || ptr.Deref(got.Spec.LeaseTransitions, 0) != 9 {
		t.Fatalf("after the release: holder %v transitions %v, want \"\" and 9", got.Spec.HolderIdentity, got.Spec.LeaseTransitions)
	}
	<-c.results
}

// A claim CAS waits until the API server's policy has seen it: a takeover
// until the old holder's token is refused, a free claim until ours is
// accepted; without the policy it does not probe at all.
func TestCoordinator_AwaitFenceProbesUntilCaughtUp(t *testing.T) {
	c, _ := newTestCoordinator(t)
	c.clock = clock.RealClock{} // the probe loop sleeps between probes
	ctx := context.Background()
	var probes []ipam.FenceToken
	caughtUpAfter := 3
	c.fenceProbe = func(_ context.Context, tok ipam.FenceToken) (bool, error) {
		probes = append(probes, tok)
		seen := len(probes) >= caughtUpAfter
		// The API server's view: the old claim until it has seen the CAS.
		if tok.Holder == "r1" {
			return seen, nil // the old holder's token: refused once seen
		}
		return !seen, nil // ours: accepted once seen
	}
	c.awaitFence(ctx, 7, Claim{Holder: "r1", Epoch: 4}, Claim{Holder: "r0", Epoch: 5})
	if len(probes) != 0 {
		t.Fatalf("probed %d times without the policy", len(probes))
	}
	c.policy.set("")
	c.awaitFence(ctx, 7, Claim{Holder: "r1", Epoch: 4}, Claim{Holder: "r0", Epoch: 5})
	if len(probes) != 3 || probes[0] != (ipam.FenceToken{Partition: 7, Holder: "r1", Epoch: 4}) {
		t.Fatalf("takeover probes = %+v, want 3 under the old token", probes)
	}
	probes = nil
	c.awaitFence(ctx, 7, Claim{Epoch: 5}, Claim{Holder: "r0", Epoch: 6})
	if len(probes) != 3 || probes[2] != (ipam.FenceToken{Partition: 7, Holder: "r0", Epoch: 6}) {
		t.Fatalf("free-claim probes = %+v, want 3 under our new token", probes)
	}
}

// The replica reports whether the fencing policies and bindings exist, and
// with RequireFencingPolicy claims nothing while they do not.
func TestCoordinator_ChecksFencingPolicy(t *testing.T) {
	c, _ := newTestCoordinator(t)
	ctx := context.Background()
	c.cfg.FencingPolicy, c.cfg.RequireFencingPolicy = "fp", true
	if got := c.FencingPolicy(); got != "not checked yet" {
		t.Fatalf("before a check: %q", got)
	}
	c.checkPolicy(ctx)
	if got := c.FencingPolicy(); !strings.Contains(got, "missing") {
		t.Fatalf("without the objects: %q, want missing", got)
	}
	if v := gaugeValue(c.metrics.policyPresent); v != 0 {
		t.Fatalf("cce_ipam_fencing_policy_present = %v, want 0", v)
	}
	claims := make([]Claim, c.cfg.Ring.Partitions)
	hold := c.view(c.clock.Now(), nil, claims, nil).PolicyHold
	if !strings.Contains(hold, "fencing policy missing") {
		t.Fatalf("hold reason with the policy required and missing: %q", hold)
	}
	adm := c.kube.AdmissionregistrationV1()
	for _, n := range []string{"fp-g0", "fp-g16", "fp-token"} {
		if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"fp-token", "fp-0", "fp-270"} {
		if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.checkPolicy(ctx)
	if got := c.FencingPolicy(); got != "" {
		t.Fatalf("with the objects: %q, want \"\"", got)
	}
	if v := gaugeValue(c.metrics.policyPresent); v != 1 {
		t.Fatalf("cce_ipam_fencing_policy_present = %v, want 1", v)
	}
	hold = c.view(c.clock.Now(), nil, claims, nil).PolicyHold
	if strings.Contains(hold, "fencing") {
		t.Fatalf("hold reason with the policy present: %q", hold)
	}
}

func gaugeValue(g interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}
