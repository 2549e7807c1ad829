//go:build integration

package main_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/shard"
)

// A replica frozen after its fence check and right
// before its wep Create, resumed after another replica took the node over,
// must have the Create refused by the API server itself (the fencing
// ValidatingAdmissionPolicy), whatever its clock says. The failpoint models a
// write already on the wire: once released, the Create is sent without the
// lease deadline as its context deadline, so the client cannot recall it.
func TestSharding_FrozenWEPCreateRefusedByAPIServer(t *testing.T) {
	dir := t.TempDir()
	freeze := func(index int) string { return filepath.Join(dir, "freeze-"+strconv.Itoa(index)) }
	e := startShards(t, fleet.Options{
		Name:     "frozen",
		Replicas: 3,
		ReplicaEnvFunc: func(index int) []string {
			return []string{"CCE_IPAM_TEST_FAILPOINT=before-wep-create=" + freeze(index)}
		},
	}, 12)
	holders, _ := e.settle(90 * time.Second)
	victim, victimNodes := e.busiest(holders, e.Replicas()...)
	victimName := e.memberName(victim)
	if len(victimNodes) == 0 {
		t.Fatalf("%s holds no node: %v", victimName, holders)
	}
	others := except(e.Replicas(), victim)
	node := victimNodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Warm the node's pool.
	var results []result
	pod, err := e.newPod(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := e.allocate(ctx, victim, pod)
	if err != nil {
		t.Fatal(err)
	}
	results = append(results, result{
		pod:  pod,
		node: node,
		ip:   ip,
	})
	time.Sleep(2 * time.Second)

	// Arm the failpoint and send the call that will freeze before its Create.
	fp := freeze(victim.Index())
	if err := os.WriteFile(fp, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	frozenPod, err := e.newPod(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	type reply struct {
		ip  string
		err error
	}
	frozen := make(chan reply, 1)
	go func() {
		ip, err := e.allocate(ctx, victim, frozenPod)
		frozen <- reply{ip, err}
	}()
	hit := fp + ".hit"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(hit); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached the failpoint before its wep Create", via(victim))
		}
	}
	detail, _ := os.ReadFile(hit)
	t.Logf("%s (%s) frozen before its wep Create: %s", via(victim), victimName, strings.TrimSpace(string(detail)))

	// The whole process freezes (its lease lapses); another replica takes
	// the node over and allocates on it.
	if err := victim.Stop(); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	claimName := shard.PartitionLeaseName(shard.PartitionOf(271, node))
	before, err := e.Kube.CoordinationV1().Leases(e.ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var newOwner string
	for newOwner == "" || newOwner == victimName {
		if ctx.Err() != nil {
			t.Fatalf("nobody took %s over from the frozen %s", node, victimName)
		}
		time.Sleep(200 * time.Millisecond)
		if l, err := e.Kube.CoordinationV1().Leases(e.ns).Get(ctx, claimName, metav1.GetOptions{}); err == nil {
			newOwner = ptr.Deref(l.Spec.HolderIdentity, "")
			if newOwner != "" && newOwner != victimName {
				t.Logf("%s: holder %q epoch %d → holder %q epoch %d", claimName, ptr.Deref(before.Spec.HolderIdentity, ""),
					ptr.Deref(before.Spec.LeaseTransitions, 0), newOwner, ptr.Deref(l.Spec.LeaseTransitions, 0))
			}
		}
	}
	t.Logf("%s took %s over %.1fs after the freeze", newOwner, node, time.Since(stoppedAt).Seconds())
	for k := range 6 {
		p, err := e.newPod(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		var ip string
		for tries := 0; ctx.Err() == nil; tries++ {
			if ip, err = e.allocate(ctx, others[k%2], p); err == nil {
				break
			}
			if tries%25 == 0 {
				t.Logf("allocate %s via %s: %v", p, via(others[k%2]), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		results = append(results, result{
			pod:  p,
			node: node,
			ip:   ip,
		})
	}

	// Resume: the frozen Create reaches the API server now.
	if err := os.Remove(fp); err != nil {
		t.Fatal(err)
	}
	if err := victim.Cont(); err != nil {
		t.Fatal(err)
	}
	var got reply
	select {
	case got = <-frozen:
	case <-time.After(60 * time.Second):
		t.Fatal("the frozen call did not return after SIGCONT")
	}
	if got.err == nil {
		t.Errorf("the API server accepted the wep Create of %s for %s (ip %s) after %s took the node over", victimName,
			frozenPod, got.ip, newOwner)
		results = append(results, result{
			pod:  frozenPod,
			node: node,
			ip:   got.ip,
		})
	} else {
		t.Logf("the frozen Create was answered: %v", got.err)
		if !strings.Contains(got.err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(got.err.Error(), "fenced") {
			t.Errorf("the frozen Create failed, but not by the fencing policy: %v", got.err)
		}
		if _, err := e.CCE.CceV1alpha1().WorkloadEndpoints(e.ns).Get(ctx, frozenPod, metav1.GetOptions{}); err == nil {
			t.Errorf("a wep exists for %s although its Create was refused", frozenPod)
		}
		// kubelet retries the ADD; the new owner serves it.
		for ctx.Err() == nil {
			if ip, err := e.allocate(ctx, others[0], frozenPod); err == nil {
				results = append(results, result{
					pod:  frozenPod,
					node: node,
					ip:   ip,
				})
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	time.Sleep(2 * time.Second)
	e.checkIPs(ctx, results)
	// Every wep of the namespace names a distinct IP.
	weps, err := e.CCE.CceV1alpha1().WorkloadEndpoints(e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byIP := map[string]string{}
	for _, w := range weps.Items {
		if other, dup := byIP[w.Spec.IP]; dup {
			t.Errorf("DUPLICATE IP %s in weps %s and %s", w.Spec.IP, other, w.Name)
		}
		byIP[w.Spec.IP] = w.Name
	}
}
