//go:build integration

package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/cce-ipam/sharded/ipamcore/admissionretry"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
)

const partitions = 271

// The chart's wep fencing policy, against a real API server with 271
// partition claims: what it refuses and lets through, what a write costs
// with it, and how long after a claim CAS the API server still accepts the
// old token (its params come from the API server's own informer).
func TestFencingPolicy_RefusesStaleTokensAndCost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := shared.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	ns := shared.Namespace(t)
	kube := kubernetes.NewForConfigOrDie(shared.Config)
	leases := kube.CoordinationV1().Leases(ns)
	for p := range partitions {
		if _, err := leases.Create(ctx, &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "cce-ipam-partition-" + strconv.Itoa(p), Labels: map[string]string{"cce.io/shard-object": "partition"}},
			Spec:       coordv1.LeaseSpec{HolderIdentity: ptr.To("r0"), LeaseTransitions: ptr.To(int32(1))},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	replica := versioned.NewForConfigOrDie(shared.ReplicaConfig).CceV1alpha1().WorkloadEndpoints(ns)
	admin := versioned.NewForConfigOrDie(shared.Config).CceV1alpha1().WorkloadEndpoints(ns)
	wep := func(name string, p int, holder string, epoch int) *cce.WorkloadEndpoint {
		w := &cce.WorkloadEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       cce.WorkloadEndpointSpec{ContainerID: "c", IP: "10.0.0.1", Type: cce.WorkloadEndpointTypePod, Node: "n"},
		}
		if holder != "" {
			// Stamped as a replica stamps it: the chart and the code must
			// agree on the group of a partition.
			ipam.FenceToken{Partition: p, Holder: holder, Epoch: int64(epoch)}.Stamp(w)
		}
		return w
	}
	// relabel is w with the group label set to g ("" removes it).
	relabel := func(w *cce.WorkloadEndpoint, g string) *cce.WorkloadEndpoint {
		if g == "" {
			delete(w.Labels, "cce.io/fence-group")
		} else {
			w.Labels["cce.io/fence-group"] = g
		}
		return w
	}
	// timeCreates creates and deletes n weps of partition p as the replica
	// user and returns the Creates' latencies, sorted.
	timeCreates := func(prefix string, n int) []time.Duration {
		t.Helper()
		var out []time.Duration
		for k := range n {
			p := k % partitions
			start := time.Now()
			if _, err := replica.Create(ctx, wep(fmt.Sprintf("%s-%d", prefix, k), p, "r0", 1), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			out = append(out, time.Since(start))
		}
		for k := range n {
			if err := admin.Delete(ctx, fmt.Sprintf("%s-%d", prefix, k), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(out)
		return out
	}
	const writes = 300
	timeCreates("warm", 50)
	without := timeCreates("plain", writes)

	policy, remove, err := shared.InstallFencingPolicy(ctx, filepath.Join("..", "..", "charts", "cce-ipam"), ns)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	// The policy's param informer may still be filling: wait until a
	// write under the current token passes.
	for {
		_, err := replica.Create(ctx, wep("sync", 0, "r0", 1), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("a write under the current token is still refused: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	with := timeCreates("fenced", writes)
	pct := func(d []time.Duration, q float64) time.Duration { return d[int(q*float64(len(d)-1))] }
	mean := func(d []time.Duration) time.Duration {
		var s time.Duration
		for _, x := range d {
			s += x
		}
		return s / time.Duration(len(d))
	}
	t.Logf("wep Create, %d sequential writes, %d partitions (a binding each, a policy per 16): without the policy mean %v p50 %v p99 %v; with it mean %v p50 %v p99 %v",
		writes, partitions, mean(without), pct(without, .5), pct(without, .99), mean(with), pct(with, .5), pct(with, .99))

	refused := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy)
	}
	// What it refuses and lets through.
	if _, err := replica.Create(ctx, wep("no-token", 5, "", 0), metav1.CreateOptions{}); !refused(err) {
		t.Errorf("a replica's wep without a token: %v, want refused by the policy", err)
	}
	if _, err := replica.Create(ctx, wep("old-epoch", 5, "r0", 0), metav1.CreateOptions{}); !refused(err) {
		t.Errorf("a stale epoch: %v, want refused", err)
	}
	if _, err := replica.Create(ctx, wep("other-holder", 5, "r1", 1), metav1.CreateOptions{}); !refused(err) {
		t.Errorf("another holder: %v, want refused", err)
	} else {
		t.Logf("refusal as the API server words it: %v", err)
	}
	// The partition's group label (partition / 16) picks the policy whose
	// bindings hold the partition's claim: a write whose group is not its
	// partition's would match none of them, so it is refused outright.
	if _, err := replica.Create(ctx, relabel(wep("no-group", 5, "r0", 1), ""), metav1.CreateOptions{}); !refused(err) {
		t.Errorf("a current token without the group label: %v, want refused", err)
	}
	if _, err := replica.Create(ctx, relabel(wep("wrong-group", 40, "r1", 1), "0"), metav1.CreateOptions{}); !refused(err) {
		t.Errorf("another holder's token under the wrong group (would escape its partition's binding): %v, want refused", err)
	}
	if _, err := replica.Create(ctx, relabel(wep("with-group", 5, "r0", 1), "0"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the same wep with its group: %v", err)
	}
	for _, bad := range []string{"five", "271", "0271", "05", "05x", "5.0"} {
		w := wep("bad-partition", 5, "r0", 1)
		w.Labels["cce.io/fence-partition"] = bad
		if _, err := replica.Create(ctx, w, metav1.CreateOptions{}); !refused(err) {
			t.Errorf("partition label %q (no partition's binding matches it): %v, want refused", bad, err)
		}
	}
	if _, err := admin.Create(ctx, wep("by-admin", 5, "", 0), metav1.CreateOptions{}); err != nil {
		t.Errorf("another user's write is not the policy's business: %v", err)
	}
	w, err := replica.Create(ctx, wep("current", 5, "r0", 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a write under the current claim: %v", err)
	}

	// The claim moves (r0 → r1, epoch 2): the old holder's update and
	// delete are refused, the new holder's stamp-then-delete goes through.
	// The window: from the CAS's reply until the API server refuses the old
	// token, probed with dry runs.
	var windows []time.Duration
	for round := range 20 {
		p := 10 + round
		l, err := leases.Get(ctx, "cce-ipam-partition-"+strconv.Itoa(p), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		old := int(ptr.Deref(l.Spec.LeaseTransitions, 0))
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("r1"), ptr.To(int32(old+1))
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		casDone := time.Now()
		for probes := 0; ; probes++ {
			_, err := replica.Create(ctx, wep("probe", p, "r0", old), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if refused(err) {
				windows = append(windows, time.Since(casDone))
				break
			}
			if err != nil || time.Since(casDone) > 10*time.Second {
				t.Fatalf("probe after the CAS: %v (after %v)", err, time.Since(casDone))
			}
		}
	}
	slices.Sort(windows)
	t.Logf("after a claim CAS, the old token was refused within: p50 %v, max %v (%d CASes; includes one dry-run round trip)",
		pct(windows, .5), windows[len(windows)-1], len(windows))

	l, err := leases.Get(ctx, "cce-ipam-partition-5", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("r1"), ptr.To(int32(2))
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the policy's informer catches up (see the window above)
	upd := w.DeepCopy()
	upd.Spec.IP = "10.0.0.2"
	if _, err := replica.Update(ctx, upd, metav1.UpdateOptions{}); !refused(err) {
		t.Errorf("the old holder's update: %v, want refused", err)
	}
	if err := replica.Delete(ctx, w.Name, metav1.DeleteOptions{}); !refused(err) {
		t.Errorf("the old holder's delete (the stored token is stale): %v, want refused", err)
	}
	upd = w.DeepCopy()
	upd.Annotations["cce.io/fence-holder"], upd.Annotations["cce.io/fence-epoch"] = "r1", "2"
	stamped, err := replica.Update(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("the new holder's stamp: %v", err)
	}
	if err := replica.Delete(ctx, w.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &stamped.ResourceVersion}}); err != nil {
		t.Errorf("the new holder's delete after its stamp: %v", err)
	}

	// A wep stored before the group label existed (a replica of an older
	// version wrote it; here the admin stores one): deleting it as stored is
	// refused, since it matches no group's policy; the current holder's
	// stamp (which adds the group) and then its delete go through, as
	// deleteWEP sends them.
	old := wep("before-groups", 5, "r1", 2)
	delete(old.Labels, "cce.io/fence-group")
	old, err = admin.Create(ctx, old, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.Delete(ctx, old.Name, metav1.DeleteOptions{}); !refused(err) {
		t.Errorf("deleting a stored wep without the group label as it is: %v, want refused", err)
	}
	upd = old.DeepCopy()
	ipam.FenceToken{Partition: 5, Holder: "r1", Epoch: 2}.Stamp(upd)
	if stamped, err = replica.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("stamping a wep stored without the group label: %v", err)
	}
	if err := replica.Delete(ctx, old.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &stamped.ResourceVersion}}); err != nil {
		t.Errorf("deleting it after the stamp: %v", err)
	}
}

// A wep write the API server refuses only because the fencing policy's
// binding could not load its param (here: the partition's claim Lease does
// not exist yet; under load: the server's own read of it timed out) is
// refused with "failed to configure binding" by a plain client, and goes
// through with the replica's retrying transport (ipamcore/admissionretry)
// once the param appears within the request's deadline. The policy's own
// refusal ("fenced: …") is returned at once, not retried.
func TestFencingPolicy_UnconfiguredRefusalRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := shared.InstallCRDs(ctx, filepath.Join("..", "..", "charts", "cce-ipam", "crds")); err != nil {
		t.Fatal(err)
	}
	ns := shared.Namespace(t)
	_, remove, err := shared.InstallFencingPolicy(ctx, filepath.Join("..", "..", "charts", "cce-ipam"), ns)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	const p = 7 // no claim Lease yet
	wep := func(name, holder string) *cce.WorkloadEndpoint {
		w := &cce.WorkloadEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       cce.WorkloadEndpointSpec{ContainerID: "c", IP: "10.0.0.1", Type: cce.WorkloadEndpointTypePod, Node: "n"},
		}
		ipam.FenceToken{Partition: p, Holder: holder, Epoch: 1}.Stamp(w)
		return w
	}
	plain := versioned.NewForConfigOrDie(shared.ReplicaConfig).CceV1alpha1().WorkloadEndpoints(ns)
	var retries []admissionretry.Retried
	var mu sync.Mutex
	cfg := rest.CopyConfig(shared.ReplicaConfig)
	admissionretry.Wrap(cfg, func(r admissionretry.Retried) {
		mu.Lock()
		defer mu.Unlock()
		retries = append(retries, r)
	})
	retrying := versioned.NewForConfigOrDie(cfg).CceV1alpha1().WorkloadEndpoints(ns)
	retried := func() []admissionretry.Retried {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(retries)
	}

	// The premise: the API server words it so, and a plain client fails.
	_, err = plain.Create(ctx, wep("plain", "r0"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "failed to configure binding") {
		t.Fatalf("a wep of a partition without a claim, plain client: %v, want refused for the unloadable param", err)
	}
	t.Logf("the refusal as the API server words it (HTTP %d): %v", codeOf(err), err)

	// Within a deadline that the Lease beats: retried until admitted.
	leases := kubernetes.NewForConfigOrDie(shared.Config).CoordinationV1().Leases(ns)
	claimed := make(chan struct{})
	defer func() { <-claimed }()
	go func() {
		defer close(claimed)
		time.Sleep(time.Second)
		_, err := leases.Create(ctx, &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "cce-ipam-partition-" + strconv.Itoa(p), Labels: map[string]string{"cce.io/shard-object": "partition"}},
			Spec:       coordv1.LeaseSpec{HolderIdentity: ptr.To("r0"), LeaseTransitions: ptr.To(int32(1))},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("create the claim: %v", err)
		}
	}()
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	defer callCancel()
	start := time.Now()
	if _, err := retrying.Create(callCtx, wep("retried", "r0"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the same write with the retrying transport, claim created after 1 s: %v", err)
	}
	got := retried()
	if len(got) == 0 || !strings.Contains(got[0].Message, "failed to configure binding") {
		t.Fatalf("retries %+v, want the unconfigured refusals retried", got)
	}
	t.Logf("admitted after %v and %d retries", time.Since(start), len(got))

	// The policy's own refusal is not retried.
	_, err = retrying.Create(callCtx, wep("other-holder", "r1"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "fenced:") {
		t.Fatalf("a write under another holder's token: %v, want refused by the policy", err)
	}
	if n := len(retried()); n != len(got) {
		t.Fatalf("the policy's refusal was retried (%d retries, was %d)", n, len(got))
	}
}

func codeOf(err error) int32 {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Code
	}
	return 0
}
