//go:build integration

package main_test

import (
	"context"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/e2e/fleet"
)

// hopCounts are the CNI and API-server request counts of a fleet, summed
// over its replicas.
type hopCounts struct {
	entry, forwarded, all       float64 // cce_ipam_cni_requests_total by hop, and over every hop
	kubePOST, kubePOSTLatencies float64
}

func (e *shardFleet) hopCounts() hopCounts {
	e.t.Helper()
	var c hopCounts
	for _, r := range e.Replicas() {
		c.entry += e.metric(r, "cce_ipam_cni_requests_total", map[string]string{"hop": "entry"})
		c.forwarded += e.metric(r, "cce_ipam_cni_requests_total", map[string]string{"hop": "forwarded"})
		c.all += e.metric(r, "cce_ipam_cni_requests_total", nil)
		c.kubePOST += e.metric(r, "cce_ipam_kube_api_requests_total", map[string]string{"verb": "POST"})
		c.kubePOSTLatencies += e.metric(r, "cce_ipam_kube_api_request_duration_seconds_count", map[string]string{"verb": "POST"})
	}
	return c
}

// Under 3 replicas, CNI calls made at random replicas (so that most are
// forwarded to the node's owner) are counted once each as hop="entry",
// and the forwarded share once more as hop="forwarded" at the owner; the
// client-go REST metrics are exposed and grow with the calls (each
// allocation creates a wep). Before the hop label, the plain sum counted
// every forwarded call twice.
func TestReplicas_CNIMetricsCountEachCallOnce(t *testing.T) {
	e := startShards(t, fleet.Options{
		Name:     "hops",
		Replicas: 3,
	}, 9)
	holders, took := e.settle(90 * time.Second)
	t.Logf("3 replicas settled in %s", took)
	replicas, nodes := e.Replicas(), e.Nodes()
	owner := map[*fleet.Replica]string{}
	for _, r := range replicas {
		owner[r] = e.memberName(r)
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(uint64(seed), 0))
	pick := func() *fleet.Replica { return replicas[rnd.IntN(len(replicas))] }

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before := e.hopCounts()
	var calls, wantForwarded, allocated float64
	call := func(r *fleet.Replica, node string) {
		calls++
		if holders[node] != owner[r] {
			wantForwarded++
		}
	}
	pods := map[string]string{}
	for i := range 30 {
		node := nodes[i%len(nodes)]
		pod, err := e.newPod(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		r := pick()
		call(r, node)
		if _, err := e.allocate(ctx, r, pod); err != nil {
			t.Errorf("allocate %s on %s via %s: %v", pod, node, via(r), err)
			continue
		}
		allocated++
		pods[pod] = node
	}
	for pod, node := range pods {
		r := pick()
		call(r, node)
		if reply, err := e.release(ctx, r, pod); err != nil || !reply.GetIsSuccess() {
			t.Errorf("release %s via %s: %v, %v", pod, via(r), reply, err)
		}
	}
	if now, _ := e.settle(10 * time.Second); !maps.Equal(now, holders) {
		t.Fatalf("ownership changed during the test (the forwarded count cannot be predicted): %v, was %v", now, holders)
	}
	after := e.hopCounts()
	entry, forwarded, all := after.entry-before.entry, after.forwarded-before.forwarded, after.all-before.all
	t.Logf("%v calls made (%v to a replica not the owner): hop=entry %v, hop=forwarded %v, all hops %v",
		calls, wantForwarded, entry, forwarded, all)
	if entry != calls {
		t.Errorf("sum(cce_ipam_cni_requests_total{hop=\"entry\"}) grew by %v, want the %v calls made", entry, calls)
	}
	if forwarded == 0 || forwarded != wantForwarded {
		t.Errorf("sum(cce_ipam_cni_requests_total{hop=\"forwarded\"}) grew by %v, want the %v calls made to a replica that does not own the node",
			forwarded, wantForwarded)
	}
	if all != entry+forwarded {
		t.Errorf("sum(cce_ipam_cni_requests_total) grew by %v, want entry + forwarded = %v (no other hop)", all, entry+forwarded)
	}

	post, postLatencies := after.kubePOST-before.kubePOST, after.kubePOSTLatencies-before.kubePOSTLatencies
	t.Logf("API server POSTs during the calls: %v (%v latencies observed) for %v allocations", post, postLatencies, allocated)
	if post < allocated || postLatencies < allocated {
		t.Errorf("cce_ipam_kube_api_requests_total{verb=POST} grew by %v and its latency count by %v, want ≥ %v (a wep created per allocation)",
			post, postLatencies, allocated)
	}
	for _, r := range replicas {
		if v := e.metric(r, "cce_ipam_kube_api_rate_limiter_duration_seconds_count", nil); v == 0 {
			t.Errorf("%s observed no client-side rate-limiter wait (its lease client has a limiter)", via(r))
		}
	}
}
