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
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
	"github.com/cce-ipam/sharded/shard"
)

// The API-server requests each CNI call makes today, counted while the call
// runs the whole path of the replica that serves the node: the gRPC service
// (cni.Server), the shard router and the IPAM. REQUESTS.md says why each
// request is there and whether it could go. The lists are exact, so a change
// that adds a request fails here; one that removes a request must update the
// lists and REQUESTS.md. The fast tests count on the fake clientsets' action
// logs; the integration tier (requests_integration_test.go) counts the same
// lists on the wire to a real API server.
func TestFast_Requests_PerCNICall(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	w.waitIdle(2)
	requestsPerCNICall(t, routedCNIServer(t, w.ipam), w.ipam, w.createPod("web-0"), w.expectRequests)
}

func TestFast_Requests_FixedIPCNICalls(t *testing.T) {
	t.Parallel()
	w := newFastWorld(t, fastConfig())
	w.waitIdle(2)
	requestsFixedIPCNICalls(t, routedCNIServer(t, w.ipam), w.ipam, w.createStsPod("db", 0, 1), w.expectRequests)
}

// expectFunc runs call and checks that it made the API-server requests want,
// in order, as "verb resource".
type expectFunc func(what string, want []string, call func())

// requestsPerCNICall is an ordinary pod's life: ADD from a warm pool (its pod
// already in the node's pod watch), the same ADD again, CheckIP, DEL, and the
// same DEL again.
func requestsPerCNICall(t *testing.T, srv *cni.Server, ip *ipam.IPAM, ref podip.PodRef, expect expectFunc) {
	t.Helper()
	expect("warm ADD", []string{"create workloadendpoints"}, func() { cniAdd(t, srv, ref) })
	expect("repeated ADD", nil, func() { cniAdd(t, srv, ref) })
	expect("CheckIP", nil, func() { cniCheck(t, srv, ref) })
	expect("DEL", []string{
		"delete workloadendpoints", // deleteKnownFirst: marks it; the call is answered here
		"patch workloadendpoints",  // finishRelease: drops the finalizer, stamps the token
	}, func() { cniDel(t, srv, ip, ref) })
	expect("repeated DEL", []string{"get workloadendpoints"}, func() { cniDel(t, srv, ip, ref) })
}

// requestsFixedIPCNICalls is a fixed-IP StatefulSet pod: its first ADD looks
// for a reservation, its DEL only stamps the wep (the IP stays reserved), and
// a new sandbox on the same node takes the reserved wep over.
func requestsFixedIPCNICalls(t *testing.T, srv *cni.Server, ip *ipam.IPAM, ref podip.PodRef, expect expectFunc) {
	t.Helper()
	expect("fixed-IP ADD", []string{
		"get workloadendpoints", // takeFixedIP: a reservation? (none)
		"create workloadendpoints",
	}, func() { cniAdd(t, srv, ref) })
	expect("fixed-IP DEL", []string{
		"patch workloadendpoints", // stamp UpdateAt (and the fencing token)
	}, func() { cniDel(t, srv, ip, ref) })
	next := ref
	next.ContainerID += "-next"
	expect("fixed-IP ADD of a new sandbox", []string{
		"get workloadendpoints",    // takeFixedIP: the reservation
		"update workloadendpoints", // commit: take it over with the resourceVersion just read
	}, func() { cniAdd(t, srv, next) })
}

// localRoutes routes every node to this replica, as the routing table does
// for the nodes of the partitions it holds.
type localRoutes struct{}

func (localRoutes) RouteOf(string) shard.Route { return shard.Route{Local: true} }

// routedCNIServer is a replica's CNI path in front of ip.
func routedCNIServer(t testing.TB, ip *ipam.IPAM) *cni.Server {
	fwd := shard.NewForwarder(shard.ForwarderDeps{
		Self:      "replica-0",
		Routes:    localRoutes{},
		OwnerWait: time.Second,
	}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	t.Cleanup(fwd.Close)
	router := shard.NewRouter(shard.RouterDeps{
		Forwarder: fwd,
		Local:     ip,
		Locator:   ip,
	}, slog.New(slog.DiscardHandler))
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
	checkRequests(w.t, what, got, want)
}

func checkRequests(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s made %d API-server requests %q, want %d %q", what, len(got), got, len(want), want)
	}
}

func requestName(a k8stesting.Action) string {
	s := a.GetVerb() + " " + a.GetResource().Resource
	if sub := a.GetSubresource(); sub != "" {
		s += "/" + sub
	}
	return s
}

func cniAdd(t *testing.T, srv *cni.Server, ref podip.PodRef) {
	t.Helper()
	reply, err := srv.AllocateIP(context.Background(), &rpc.AllocateIPRequest{
		K8SPodName:             ref.Name,
		K8SPodNamespace:        ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID,
		K8SNodeName:            ref.Node,
		IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
	})
	if err != nil || !reply.GetIsSuccess() {
		t.Fatalf("AllocateIP %s: %v %s", ref, err, reply.GetErrMsg())
	}
}

// cniDel is a DEL, and waits until the release has finished on ip (the call
// is answered once the wep's delete is marked; the rest follows).
func cniDel(t *testing.T, srv *cni.Server, ip *ipam.IPAM, ref podip.PodRef) {
	t.Helper()
	reply, err := srv.ReleaseIP(context.Background(), &rpc.ReleaseIPRequest{
		K8SPodName:             ref.Name,
		K8SPodNamespace:        ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID,
		K8SNodeName:            ref.Node,
		IPType:                 rpc.IPType_BCCMultiENIMultiIPType,
	})
	ip.ReleaseSettledForTest(ref.Namespace, ref.Name)
	if err != nil || !reply.GetIsSuccess() {
		t.Fatalf("ReleaseIP %s: %v %s", ref, err, reply.GetErrMsg())
	}
}

func cniCheck(t *testing.T, srv *cni.Server, ref podip.PodRef) {
	t.Helper()
	reply, err := srv.CheckIP(context.Background(), &rpc.CheckIPRequest{
		K8SPodName:             ref.Name,
		K8SPodNamespace:        ref.Namespace,
		K8SPodInfraContainerID: ref.ContainerID,
		K8SNodeName:            ref.Node,
	})
	if err != nil || !reply.GetIsSuccess() || !strings.Contains(reply.String(), ref.Node) {
		t.Fatalf("CheckIP %s: %v %s", ref, err, reply.GetErrMsg())
	}
}
