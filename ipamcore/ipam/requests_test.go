package ipam_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
	"github.com/cce-ipam/sharded/shard"
)

// The API-server requests each CNI call makes today, counted on the fake
// clientsets' action logs while the call runs the whole path of the replica
// that serves the node: the gRPC service (cni.Server), the shard router and
// the IPAM. REQUESTS.md says why each request is there and whether it could
// go. The lists are exact, so a change that adds a request fails here; one
// that removes a request must update the list and REQUESTS.md.
func TestFast_Requests_PerCNICall(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	w.waitIdle(2)
	srv := w.cniServer()
	ref := w.createPod("web-0")

	w.expectRequests("warm ADD", []string{"create workloadendpoints"}, func() { w.cniAdd(srv, ref) })
	w.expectRequests("repeated ADD", []string{"get workloadendpoints"}, func() { w.cniAdd(srv, ref) })
	w.expectRequests("CheckIP", []string{"get workloadendpoints"}, func() { w.cniCheck(srv, ref) })
	w.expectRequests("DEL", []string{
		"get workloadendpoints",    // router: EndpointNode
		"get workloadendpoints",    // Release: the wep, fresh
		"update workloadendpoints", // deleteWEP: drop the finalizer
		"delete workloadendpoints", // deleteWEP
	}, func() { w.cniDel(srv, ref) })
	w.expectRequests("repeated DEL", []string{"get workloadendpoints"}, func() { w.cniDel(srv, ref) })
}

// A fixed-IP StatefulSet pod: its first ADD looks for a reservation, a new
// sandbox on the same node takes the reserved wep over, and its DEL only
// stamps the wep (the IP stays reserved).
func TestFast_Requests_FixedIPCNICalls(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	w.waitIdle(2)
	srv := w.cniServer()
	ref := w.createStsPod("db", 0, 1)

	w.expectRequests("fixed-IP ADD", []string{
		"get workloadendpoints", // takeFixedIP: a reservation? (none)
		"create workloadendpoints",
	}, func() { w.cniAdd(srv, ref) })
	w.expectRequests("fixed-IP DEL", []string{
		"get workloadendpoints",    // router: EndpointNode
		"get workloadendpoints",    // Release
		"update workloadendpoints", // stamp UpdateAt (and the fencing token)
	}, func() { w.cniDel(srv, ref) })
	next := ref
	next.ContainerID = sandboxID(ref.Name, 2)
	w.expectRequests("fixed-IP ADD of a new sandbox", []string{
		"get workloadendpoints",    // takeFixedIP: the reservation
		"create workloadendpoints", // commit: AlreadyExists
		"get workloadendpoints",    // commit: the existing wep's resourceVersion
		"update workloadendpoints", // commit: take it over
	}, func() { w.cniAdd(srv, next) })
}

// localRoutes routes every node to this replica, as the routing table does
// for the nodes of the partitions it holds.
type localRoutes struct{}

func (localRoutes) RouteOf(string) shard.Route { return shard.Route{Local: true} }

// cniServer is the replica's CNI path in front of the world's IPAM.
func (w *fastWorld) cniServer() *cni.Server {
	router := shard.NewRouter(shard.RouterDeps{
		Self:      "replica-0",
		Routes:    localRoutes{},
		Local:     w.ipam,
		Locator:   w.ipam,
		OwnerWait: time.Second,
	}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	w.t.Cleanup(router.Close)
	return cni.NewServer(cni.DefaultConfig(), router, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
}

// expectRequests runs call and checks the API-server requests it made, in
// order, as "verb resource[/subresource]". The IPAM's own loops run on the
// fake clock (hour-long periods the test does not step) and the pool worker
// calls only the cloud, so every request in the window is the call's.
func (w *fastWorld) expectRequests(what string, want []string, call func()) {
	w.t.Helper()
	kubeBefore, cceBefore := len(w.kube.Actions()), len(w.cce.Actions())
	call()
	var got []string
	for _, a := range append(w.kube.Actions()[kubeBefore:], w.cce.Actions()[cceBefore:]...) {
		got = append(got, requestName(a))
	}
	if !slices.Equal(got, want) {
		w.t.Errorf("%s made %d API-server requests %q, want %d %q", what, len(got), got, len(want), want)
	}
}

func requestName(a k8stesting.Action) string {
	s := a.GetVerb() + " " + a.GetResource().Resource
	if sub := a.GetSubresource(); sub != "" {
		s += "/" + sub
	}
	return s
}

func (w *fastWorld) cniAdd(srv *cni.Server, ref podip.PodRef) {
	w.t.Helper()
	reply, err := srv.AllocateIP(context.Background(), &rpc.AllocateIPRequest{
		K8SPodName:             ref.Name,
		K8SPodNamespace:        ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID,
		K8SNodeName:            ref.Node,
		IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
	})
	if err != nil || !reply.GetIsSuccess() {
		w.t.Fatalf("AllocateIP %s: %v %s", ref, err, reply.GetErrMsg())
	}
}

func (w *fastWorld) cniDel(srv *cni.Server, ref podip.PodRef) {
	w.t.Helper()
	reply, err := srv.ReleaseIP(context.Background(), &rpc.ReleaseIPRequest{
		K8SPodName:             ref.Name,
		K8SPodNamespace:        ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID,
		K8SNodeName:            ref.Node,
		IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
	})
	if err != nil || !reply.GetIsSuccess() {
		w.t.Fatalf("ReleaseIP %s: %v %s", ref, err, reply.GetErrMsg())
	}
}

func (w *fastWorld) cniCheck(srv *cni.Server, ref podip.PodRef) {
	w.t.Helper()
	reply, err := srv.CheckIP(context.Background(), &rpc.CheckIPRequest{
		K8SPodName:             ref.Name,
		K8SPodNamespace:        ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID,
		K8SNodeName:            ref.Node,
	})
	if err != nil || !reply.GetIsSuccess() || !strings.Contains(reply.String(), ref.Node) {
		w.t.Fatalf("CheckIP %s: %v %s", ref, err, reply.GetErrMsg())
	}
}
