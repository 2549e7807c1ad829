//go:build integration

package ipam_test

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
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

// A DEL of a wep this replica wrote is answered once the wep's delete is
// marked (one write); the finalizer's removal and the address's release
// follow under the pod's lock. While they are pending the address stays
// assigned to the old sandbox, and a new sandbox of the same pod (kubelet
// restarting it) waits for them, then gets a live wep: had it gone ahead, the
// pending finalizer removal would have deleted the new sandbox's wep.
func TestIPAM_DELAnsweredOnceMarked_NewSandboxWaits(t *testing.T) {
	e, wire, srv, ref, addr := addedPod(t, "rm")
	weps := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns)

	gate := make(chan struct{})
	var open sync.Once
	openGate := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(openGate)
	held := make(chan struct{}, 1)
	wire.setIntercept(func(kind string, _ *http.Request) *http.Response {
		if kind == "patch workloadendpoints" {
			select {
			case held <- struct{}{}:
			default:
			}
			<-gate
		}
		return nil
	})
	del, err := srv.ReleaseIP(e.ctx, &rpc.ReleaseIPRequest{K8SPodName: ref.Name, K8SPodNamespace: ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID, K8SNodeName: ref.Node})
	if err != nil || !del.IsSuccess || del.GetENIMultiIP().GetIP() != addr.String() {
		t.Fatalf("DEL = %v, %v; want %s released", del, err, addr)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no finalizer removal was sent after the DEL")
	}
	marked, err := weps.Get(e.ctx, ref.Name, metav1.GetOptions{})
	if err != nil || marked.DeletionTimestamp == nil {
		t.Fatalf("wep after the DEL's answer: %v, err %v; want it marked deleted, finalizer pending", marked, err)
	}
	if info, err := e.ipam.StoreForTest().LookupIP(addr); err != nil || info.State != datastore.StateAssigned ||
		info.Owner.ContainerID != ref.ContainerID {
		t.Fatalf("address %s while its release is pending: %+v, %v; want still assigned to the old sandbox", addr, info, err)
	}

	next := ref
	next.ContainerID += "-next"
	added := make(chan *rpc.AllocateIPReply, 1)
	go func() {
		r, err := srv.AllocateIP(context.Background(), &rpc.AllocateIPRequest{K8SPodName: next.Name,
			K8SPodNamespace: next.Namespace, K8SPodInfraContainerID: next.ContainerID, K8SNodeName: next.Node})
		if err != nil {
			r = &rpc.AllocateIPReply{ErrMsg: err.Error()}
		}
		added <- r
	}()
	select {
	case r := <-added:
		t.Fatalf("the new sandbox's ADD ended (%v) before the old sandbox's release finished", r)
	case <-time.After(500 * time.Millisecond):
	}
	openGate()
	var r *rpc.AllocateIPReply
	select {
	case r = <-added:
	case <-time.After(30 * time.Second):
		t.Fatal("the new sandbox's ADD did not end after the release finished")
	}
	if !r.IsSuccess {
		t.Fatalf("the new sandbox's ADD = %v", r)
	}
	live, err := weps.Get(e.ctx, ref.Name, metav1.GetOptions{})
	if err != nil || live.DeletionTimestamp != nil || live.Spec.ContainerID != next.ContainerID ||
		live.Spec.IP != r.GetENIMultiIP().GetIP() {
		t.Fatalf("wep after the new sandbox's ADD: %+v, err %v; want a live wep of %s with %s", live, err,
			next.ContainerID, r.GetENIMultiIP().GetIP())
	}
	e.checkNoLeak()
}

// When the finalizer cannot be removed after the DEL marked the wep (here
// the fencing policy refuses it: the partition moved), the address stays
// assigned: nothing hands it out while a wep names it. GC frees it once the
// pod is gone, as it frees any deleted pod's wep.
func TestIPAM_DELUnfinishedReleaseHeldUntilGC(t *testing.T) {
	e, wire, srv, ref, addr := addedPod(t, "ru")
	weps := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns)

	wire.setIntercept(func(kind string, req *http.Request) *http.Response {
		if kind == "patch workloadendpoints" {
			return fencedRefusal(req)
		}
		return nil
	})
	cniDel(t, srv, e.ipam, ref) // answered once marked; waits for the refused finish
	wire.setIntercept(nil)
	marked, err := weps.Get(e.ctx, ref.Name, metav1.GetOptions{})
	if err != nil || marked.DeletionTimestamp == nil || !slices.Contains(marked.Finalizers, cce.WorkloadEndpointFinalizer) {
		t.Fatalf("wep after an unfinished release: %v, err %v; want it marked deleted with its finalizer", marked, err)
	}
	if info, err := e.ipam.StoreForTest().LookupIP(addr); err != nil || info.State != datastore.StateAssigned {
		t.Fatalf("address %s of an unfinished release: %+v, %v; want still assigned", addr, info, err)
	}

	e.deletePod(ref.Name)
	e.ipam.CollectGarbage(e.ctx)
	if _, err := weps.Get(e.ctx, ref.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("wep after GC of its deleted pod: err %v, want not found", err)
	}
	if info, err := e.ipam.StoreForTest().LookupIP(addr); err != nil || info.State == datastore.StateAssigned {
		t.Fatalf("address %s after GC: %+v, %v; want freed", addr, info, err)
	}
	e.checkNoLeak()
}

// addedPod is a counted env whose one pod was ADDed through the routed CNI
// server: the server, the pod and the address its wep names.
func addedPod(t *testing.T, prefix string) (*env, *requestLog, *cni.Server, podip.PodRef, netip.Addr) {
	t.Helper()
	e, wire := newCountedEnv(t, prefix)
	ref := e.cachedPodRef(e.createPods("web", 1)[0])
	srv := routedCNIServer(t, e.ipam)
	cniAdd(t, srv, ref)
	w, err := e.cce.CceV1alpha1().WorkloadEndpoints(e.ns).Get(e.ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return e, wire, srv, ref, netip.MustParseAddr(w.Spec.IP)
}

// fencedRefusal is the API server's answer when the fencing policy refuses
// a write: 403 with the policy's "fenced:" message.
func fencedRefusal(req *http.Request) *http.Response {
	body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"workloadendpoints.cce.io \"x\" is forbidden: ` +
		`ValidatingAdmissionPolicy 'p' with binding 'b' denied request: fenced: partition 1 is claimed by \"other\"",` +
		`"reason":"Forbidden","code":403}`
	return &http.Response{
		StatusCode: http.StatusForbidden, Status: "403 Forbidden", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}
