//go:build integration

package ipam_test

import (
	"context"
	"net/http"
	"path"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// addedPods is a counted env whose n pods, all on its one node, were ADDed
// through the routed CNI server.
func addedPods(t *testing.T, prefix string, n int) (*env, *requestLog, *cni.Server, []podip.PodRef) {
	t.Helper()
	e, wire := newCountedEnv(t, prefix)
	srv := routedCNIServer(t, e.ipam)
	var refs []podip.PodRef
	for _, p := range e.createPods("web", n) {
		ref := e.cachedPodRef(p)
		cniAdd(t, srv, ref)
		refs = append(refs, ref)
	}
	return e, wire, srv, refs
}

// gateWEPPatches holds the finalizer removals (patches) of the named weps
// (every wep when names is empty) until the returned func is called or the
// request's context ends.
func gateWEPPatches(t *testing.T, wire *requestLog, names ...string) (open func()) {
	gate := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	wire.setIntercept(func(kind string, req *http.Request) *http.Response {
		if kind != "patch workloadendpoints" || len(names) > 0 && !slices.Contains(names, path.Base(req.URL.Path)) {
			return nil
		}
		select {
		case <-gate:
		case <-req.Context().Done():
		}
		return nil
	})
	return open
}

// stuckPatchesThenDEL holds the finalizer patches of stuck's weps for the
// rest of the test, then DELs every pod of refs, each answered.
func stuckPatchesThenDEL(t *testing.T, wire *requestLog, srv *cni.Server, stuck, refs []podip.PodRef) {
	t.Helper()
	var names []string
	for _, r := range stuck {
		names = append(names, r.Name)
	}
	gateWEPPatches(t, wire, names...)
	for _, r := range refs {
		select {
		case rep := <-delAsync(srv, r):
			if !rep.IsSuccess {
				t.Fatalf("DEL %s = %v", r.Name, rep)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("DEL %s was not answered", r.Name)
		}
	}
}

// delAsync sends a DEL and delivers its reply.
func delAsync(srv *cni.Server, ref podip.PodRef) <-chan *rpc.ReleaseIPReply {
	out := make(chan *rpc.ReleaseIPReply, 1)
	go func() {
		r, err := srv.ReleaseIP(context.Background(), &rpc.ReleaseIPRequest{K8SPodName: ref.Name, K8SPodNamespace: ref.Namespace,
			K8SPodInfraContainerID: ref.ContainerID, K8SNodeName: ref.Node, IPType: rpc.IPType_BCCMultiENIMultiIPType})
		if err != nil {
			r = &rpc.ReleaseIPReply{ErrMsg: err.Error()}
		}
		out <- r
	}()
	return out
}

// A burst of DELs is answered once each wep's delete is marked, however many
// finalizer removals are still waiting for one of the few slots they run in:
// the answers do not wait for them. Only beyond the node's bound of pending
// finishes does a DEL finish before its answer. Until all are finished every
// address stays assigned, and then all are free and every wep gone.
func TestIPAM_DELBurstAnsweredWhileFinishesWait(t *testing.T) {
	e, wire, srv, refs := addedPods(t, "rb", 8)
	const bound = 6 // above the 4 slots: the queue, not the slots, is what answers
	e.ipam.SetFinishPendingMaxForTest(bound)
	open := gateWEPPatches(t, wire)

	addrs := map[string]string{}
	for _, ref := range refs {
		w, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		addrs[ref.Name] = w.Spec.IP
	}
	for k, ref := range refs[:bound] {
		select {
		case r := <-delAsync(srv, ref):
			if !r.IsSuccess || r.GetENIMultiIP().GetIP() != addrs[ref.Name] {
				t.Fatalf("DEL %d = %v; want %s released", k+1, r, addrs[ref.Name])
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("DEL %d of %d was not answered while the finalizer removals wait", k+1, bound)
		}
	}
	over := delAsync(srv, refs[bound])
	select {
	case r := <-over:
		t.Fatalf("DEL %d, beyond the node's bound of pending finishes, was answered (%v) before it finished", bound+1, r)
	case <-time.After(500 * time.Millisecond):
	}
	if got := e.gauge("cce_ipam_release_finishes_pending"); got != bound+1 {
		t.Errorf("cce_ipam_release_finishes_pending = %v, want %d", got, bound+1)
	}
	for _, ref := range refs[:bound+1] {
		info, err := e.ipam.StoreForTest().LookupIP(netipOf(addrs[ref.Name]))
		if err != nil || info.State != datastore.StateAssigned || info.Owner.ContainerID != ref.ContainerID {
			t.Fatalf("address %s of %s while its release is pending: %+v, %v; want still assigned", addrs[ref.Name], ref.Name, info, err)
		}
	}

	open()
	select {
	case r := <-over:
		if !r.IsSuccess {
			t.Fatalf("DEL %d = %v", bound+1, r)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("DEL %d did not end after the removals went on", bound+1)
	}
	cniDel(t, srv, e.ipam, refs[bound+1])
	for _, ref := range refs {
		e.ipam.ReleaseSettledForTest(ref.Namespace, ref.Name)
		if _, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, ref.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("wep %s after its release finished: err %v, want not found", ref.Name, err)
		}
		if info, err := e.ipam.StoreForTest().LookupIP(netipOf(addrs[ref.Name])); err != nil || info.State == datastore.StateAssigned {
			t.Errorf("address %s after its release finished: %+v, %v; want free", addrs[ref.Name], info, err)
		}
	}
	if got := e.gauge("cce_ipam_release_finishes_pending"); got != 0 {
		t.Errorf("cce_ipam_release_finishes_pending = %v after all finished, want 0", got)
	}
	e.checkNoLeak()
}

// Finishes waiting for a slot do not hold up a hand-over, nor are they
// dropped by it: when the node stops being served here they go at once
// (the fence still allows writes while the node drains), and the hand-over
// waits for them. Finishes stuck in flight are given finishWhenStopping.
func TestIPAM_PendingFinishesGoWhenTheNodeStops(t *testing.T) {
	e, wire, srv, refs := addedPods(t, "rs", 6)
	stuck, queued := refs[:4], refs[4:] // the stuck ones take the 4 slots
	stuckPatchesThenDEL(t, wire, srv, stuck, refs)
	weps := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns)
	time.Sleep(300 * time.Millisecond)
	for _, ref := range queued {
		if w, err := weps.Get(e.ctx, ref.Name, metav1.GetOptions{}); err != nil || w.DeletionTimestamp == nil {
			t.Fatalf("wep %s while its finish waits for a slot: %v, err %v; want it marked deleted", ref.Name, w, err)
		}
	}

	start := time.Now()
	e.ipam.StopServingNode(e.nodes[0])
	took := time.Since(start)
	for _, ref := range queued {
		if _, err := weps.Get(e.ctx, ref.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("wep %s after the hand-over: err %v; want its queued finish done, the wep gone", ref.Name, err)
		}
	}
	for _, ref := range stuck {
		w, err := weps.Get(e.ctx, ref.Name, metav1.GetOptions{})
		if err != nil || w.DeletionTimestamp == nil || !slices.Contains(w.Finalizers, cce.WorkloadEndpointFinalizer) {
			t.Errorf("wep %s whose finish was stuck: %v, err %v; want it marked with our finalizer, for GC", ref.Name, w, err)
		}
	}
	if took > 20*time.Second {
		t.Errorf("StopServingNode took %s with finishes pending; want about finishWhenStopping (2 s)", took)
	}
	t.Logf("StopServingNode with 4 finishes stuck and 2 queued took %s", took)
}

// A CNI call for a pod whose release still waits for a slot (a new
// sandbox's ADD) waits for that release, since it takes the pod's lock; the
// release then goes at once instead of behind the others', here behind 4
// patches that never end.
func TestIPAM_NewSandboxHurriesItsPodsPendingFinish(t *testing.T) {
	e, wire, srv, refs := addedPods(t, "rh", 5)
	stuck, ref := refs[:4], refs[4]
	stuckPatchesThenDEL(t, wire, srv, stuck, refs)

	next := ref
	next.ContainerID += "-next"
	added := make(chan *rpc.AllocateIPReply, 1)
	go func() {
		r, err := srv.AllocateIP(context.Background(), &rpc.AllocateIPRequest{K8SPodName: next.Name,
			K8SPodNamespace: next.Namespace, K8SPodInfraContainerID: next.ContainerID, K8SNodeName: next.Node,
			IPType: rpc.IPType_BCCMultiENIMultiIPType})
		if err != nil {
			r = &rpc.AllocateIPReply{ErrMsg: err.Error()}
		}
		added <- r
	}()
	var r *rpc.AllocateIPReply
	select {
	case r = <-added:
	case <-time.After(15 * time.Second):
		t.Fatal("the new sandbox's ADD waited behind other pods' finishes (their 4 slots are stuck)")
	}
	if !r.IsSuccess {
		t.Fatalf("the new sandbox's ADD = %v", r)
	}
	live, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, ref.Name, metav1.GetOptions{})
	if err != nil || live.DeletionTimestamp != nil || live.Spec.ContainerID != next.ContainerID ||
		live.Spec.IP != r.GetENIMultiIP().GetIP() {
		t.Fatalf("wep after the new sandbox's ADD: %+v, err %v; want a live wep of %s with %s", live, err,
			next.ContainerID, r.GetENIMultiIP().GetIP())
	}
}
