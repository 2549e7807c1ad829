//go:build integration

package spread_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
	"github.com/cce-ipam/sharded/ipamcore/spread"
)

func spreadOver(name string, enableAllocations bool, ids ...string) *cce.PodSubnetTopologySpread {
	p := &cce.PodSubnetTopologySpread{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cce.PodSubnetTopologySpreadSpec{
			Subnets:                  map[string]cce.SubnetAllocation{},
			EnableIPAllocationStatus: enableAllocations,
			Selector:                 &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
		},
	}
	for _, id := range ids {
		p.Spec.Subnets[id] = cce.SubnetAllocation{}
	}
	return p
}

// The status lists available and unavailable subnets with the reason, and
// podCount follows the PSTS's weps as they are created, marked podDeleted
// and deleted; ipAllocations names each address's pod; Subnet events move
// subnets between the two.
func TestStatus_SubnetsPodCountAndAllocations(t *testing.T) {
	e := newEnv(t)
	ok := e.subnet("ok", "10.10.0.0/24", nil)
	off := e.subnet("off", "10.11.0.0/24", func(s *cce.Subnet) { s.Status.Enable = false })
	full := e.subnet("full", "10.12.0.0/24", func(s *cce.Subnet) { s.Status.HasNoMoreIP = true })
	missing := "sbn-" + e.ns + "-later"
	e.createSpread(spreadOver("p", true, ok, off, full, missing))
	e.createSpread(spreadOver("other", true, ok))
	e.start(spread.DefaultConfig())

	st := e.status("p", "first status", func(st cce.PodSubnetTopologySpreadStatus) string {
		if st.AvailableSubnetsNum != 1 || st.UnavailableSubnetsNum != 3 {
			return "counts"
		}
		return ""
	})
	a := st.AvailableSubnets[ok]
	if st.Name != "p" || a.ID != ok || a.Name != "ok" || a.CIDR != "10.10.0.0/24" || a.AvailabilityZone != "zone-a" ||
		!a.Enable || a.HasNoMoreIP || a.AvailableIPNum != 200 || a.PodCount != 0 || a.IPAllocations != nil {
		t.Fatalf("available %+v", a)
	}
	for id, want := range map[string]string{off: "disabled", full: "no more IP", missing: "no Subnet resource yet"} {
		if msg := st.UnavailableSubnets[id].Message; !strings.Contains(msg, want) {
			t.Errorf("%s: message %q, want %q", id, msg, want)
		}
	}

	e.wep("pod-1", "p", ok, "10.10.0.11")
	e.wep("pod-2", "p", ok, "10.10.0.12")
	e.wep("pod-3", "p", full, "10.12.0.13")
	e.wep("foreign", "other", ok, "10.10.0.99") // another PSTS's
	e.wep("plain", "", ok, "10.10.0.98")        // not a PSTS wep
	podCount := func(want int32, allocs map[string]string) func(cce.PodSubnetTopologySpreadStatus) string {
		return func(st cce.PodSubnetTopologySpreadStatus) string {
			s := st.AvailableSubnets[ok]
			if s.PodCount != want || fmt.Sprint(s.IPAllocations) != fmt.Sprint(allocs) {
				return fmt.Sprintf("podCount %d, ipAllocations %v", s.PodCount, s.IPAllocations)
			}
			return ""
		}
	}
	e.status("p", "podCount up to 2", podCount(2, map[string]string{"10.10.0.11": "pod-1", "10.10.0.12": "pod-2"}))
	if f := st.UnavailableSubnets[full]; f.ID != full {
		t.Fatalf("unavailable entry %+v", f)
	}
	e.status("p", "the exhausted subnet counts its pod", func(st cce.PodSubnetTopologySpreadStatus) string {
		if s := st.UnavailableSubnets[full]; s.PodCount != 1 || s.IPAllocations["10.12.0.13"] != "pod-3" {
			return "exhausted subnet's pods"
		}
		return ""
	})
	e.status("other", "the other PSTS counts its own", func(st cce.PodSubnetTopologySpreadStatus) string {
		if s := st.AvailableSubnets[ok]; s.PodCount != 1 || s.IPAllocations["10.10.0.99"] != "foreign" {
			return "other's pods"
		}
		return ""
	})

	e.updateWEP("pod-1", func(w *cce.WorkloadEndpoint) { w.Spec.Phase = cce.WorkloadEndpointPhasePodDeleted })
	e.status("p", "podCount down to 1 (podDeleted)", podCount(1, map[string]string{"10.10.0.12": "pod-2"}))
	e.updateWEP("pod-1", func(w *cce.WorkloadEndpoint) { w.Spec.Phase = cce.WorkloadEndpointPhasePodRunning })
	e.status("p", "podCount back to 2 (running again)", podCount(2, map[string]string{"10.10.0.11": "pod-1", "10.10.0.12": "pod-2"}))
	e.deleteWEP("pod-2")
	e.status("p", "podCount down to 1 (deleted)", podCount(1, map[string]string{"10.10.0.11": "pod-1"}))
	// A wep that stops naming the PSTS leaves its count.
	e.updateWEP("pod-1", func(w *cce.WorkloadEndpoint) { w.Spec.SubnetTopologyReference = "" })
	e.status("p", "podCount down to 0 (reference removed)", podCount(0, nil))

	// Subnet events: enabled, no longer exhausted, created.
	e.updateSubnet(off, func(s *cce.Subnet) { s.Status.Enable = true })
	e.updateSubnet(full, func(s *cce.Subnet) { s.Status.HasNoMoreIP = false })
	e.subnet("later", "10.13.0.0/24", nil)
	e.status("p", "every subnet available", func(st cce.PodSubnetTopologySpreadStatus) string {
		if st.AvailableSubnetsNum != 4 || st.UnavailableSubnetsNum != 0 || len(st.UnavailableSubnets) != 0 {
			return "counts"
		}
		return ""
	})
	e.updateSubnet(ok, func(s *cce.Subnet) { s.Status.HasNoMoreIP = true; s.Status.Reason = "declared by the IPAM" })
	e.status("p", "exhausted again", func(st cce.PodSubnetTopologySpreadStatus) string {
		if msg := st.UnavailableSubnets[ok].Message; msg != "the subnet has no more IP: declared by the IPAM" {
			return fmt.Sprintf("message %q", msg)
		}
		return ""
	})
}

// podMatchedCount counts the pods annotated with the PSTS, podAffectedCount
// those of them with an address (a wep naming the PSTS, not podDeleted).
func TestStatus_PodMatchedAndAffected(t *testing.T) {
	e := newEnv(t)
	ok := e.subnet("ok", "10.20.0.0/24", nil)
	e.createSpread(spreadOver("p", false, ok))
	e.start(spread.DefaultConfig())
	counts := func(matched, affected int32) func(cce.PodSubnetTopologySpreadStatus) string {
		return func(st cce.PodSubnetTopologySpreadStatus) string {
			if st.PodMatchedCount != matched || st.PodAffectedCount != affected {
				return fmt.Sprintf("matched %d affected %d", st.PodMatchedCount, st.PodAffectedCount)
			}
			return ""
		}
	}
	e.status("p", "no pods", counts(0, 0))
	for _, name := range []string{"a", "b", "c"} {
		e.pod(name, "p")
	}
	e.pod("plain", "")
	e.pod("elsewhere", "other")
	e.status("p", "three matched", counts(3, 0))

	e.wep("a", "p", ok, "10.20.0.5")
	e.wep("b", "p", ok, "10.20.0.6")
	e.wep("plain", "p", ok, "10.20.0.7") // a wep, but the pod is not annotated
	e.status("p", "two affected", counts(3, 2))
	e.updateWEP("b", func(w *cce.WorkloadEndpoint) { w.Spec.Phase = cce.WorkloadEndpointPhasePodDeleted })
	e.status("p", "a podDeleted wep is no address", counts(3, 1))

	// A pod that loses its annotation, a deleted pod.
	pod, err := e.kube.CoreV1().Pods(e.ns).Get(e.ctx, "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(pod.Annotations, cce.AnnotationPodSubnetTopologySpread)
	if _, err := e.kube.CoreV1().Pods(e.ns).Update(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.status("p", "the unannotated pod no longer matches", counts(2, 1))
	if err := e.kube.CoreV1().Pods(e.ns).Delete(e.ctx, "a", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	e.status("p", "the deleted pod no longer matches", counts(1, 0))
}

// A status that would not change is not written: a reconcile forced by a
// label change leaves the status alone.
func TestStatus_UnchangedIsNotWritten(t *testing.T) {
	e := newEnv(t)
	// Count this PSTS's status writes on the wire: the controller-wide
	// counter also sees the statuses of earlier tests' PSTS, whose
	// namespaces are still being deleted.
	var writes atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/namespaces/"+e.ns+"/podsubnettopologyspreads/p/status") {
				writes.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	e.cce = versioned.NewForConfigOrDie(cfg)
	ok := e.subnet("ok", "10.30.0.0/24", nil)
	e.createSpread(spreadOver("p", false, ok))
	e.start(spread.DefaultConfig())
	e.status("p", "first status", func(st cce.PodSubnetTopologySpreadStatus) string {
		if st.AvailableSubnetsNum != 1 {
			return "not yet"
		}
		return ""
	})
	before := writes.Load()
	if before == 0 {
		t.Fatal("the first status was not seen on the wire: the count below would prove nothing")
	}
	reconciles := counter(t, e.reg, "cce_ipam_spread_reconciles_total", map[string]string{"controller": "psts-status"})
	p, err := e.getSpread("p")
	if err != nil {
		t.Fatal(err)
	}
	p.Labels = map[string]string{"touched": "yes"}
	if _, err := e.cce.CceV1alpha1().PodSubnetTopologySpreads(e.ns).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("a reconcile of the touched PSTS", func() (bool, string) {
		n := counter(t, e.reg, "cce_ipam_spread_reconciles_total", map[string]string{"controller": "psts-status"})
		return n > reconciles, fmt.Sprintf("%v reconciles", n)
	})
	if again := writes.Load(); again != before {
		t.Fatalf("an unchanged status was written %d times", again-before)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Corrupt objects: subnet IDs no Subnet can have or that no cloud knows,
// weps with garbage fields. The status says what is wrong, an event lists
// the weps, and the controller goes on serving.
func TestStatus_CorruptObjects(t *testing.T) {
	e := newEnv(t)
	ok := e.subnet("ok", "10.40.0.0/24", nil)
	garbage := e.subnet("garbage", "10.41.0.0/24", func(s *cce.Subnet) { s.Spec.CIDR = "ten-dot-something" })
	p := spreadOver("p", true, ok, "sbn-nowhere-"+e.ns, "Not_A_Subnet!", "")
	p.Spec.Subnets[garbage] = cce.SubnetAllocation{IPv4Range: []string{"junk"}}
	e.createSpread(p)
	e.wep("bad-ip", "p", ok, "10.40.0.300")
	e.wep("no-subnet", "p", "", "10.40.0.5")
	e.wep("odd-phase", "p", ok, "10.40.0.6")
	e.updateWEP("odd-phase", func(w *cce.WorkloadEndpoint) { w.Spec.Phase = "¯\\_(ツ)_/¯"; w.Spec.Type = "Bogus" })
	e.wep("unlisted", "p", "sbn-unlisted", "10.99.0.1")
	e.start(spread.DefaultConfig())

	st := e.status("p", "status of a corrupt PSTS", func(st cce.PodSubnetTopologySpreadStatus) string {
		if st.UnavailableSubnetsNum != 4 || st.AvailableSubnets[ok].PodCount != 2 {
			return "counts"
		}
		return ""
	})
	for id, want := range map[string]string{
		"sbn-nowhere-" + e.ns: "no Subnet resource yet",
		"Not_A_Subnet!":       "not a valid subnet ID",
		"":                    "not a valid subnet ID",
		garbage:               `CIDR "ten-dot-something" is not valid`,
	} {
		if msg := st.UnavailableSubnets[id].Message; !strings.Contains(msg, want) {
			t.Errorf("subnet %q: message %q, want %q", id, msg, want)
		}
	}
	if allocs := st.AvailableSubnets[ok].IPAllocations; len(allocs) != 1 || allocs["10.40.0.6"] != "odd-phase" {
		t.Errorf("ipAllocations %v: the invalid address must be left out", allocs)
	}
	e.eventContaining(e.ns, "p", spread.ReasonInvalidEndpoints, `WorkloadEndpoint bad-ip has an invalid address "10.40.0.300"`)
	e.eventContaining(e.ns, "p", spread.ReasonInvalidEndpoints, `subnet "sbn-unlisted", which the spec does not list`)

	// Still serving: fixing the wep is seen.
	e.updateWEP("bad-ip", func(w *cce.WorkloadEndpoint) { w.Spec.IP = "10.40.0.7" })
	e.status("p", "the fixed address listed", func(st cce.PodSubnetTopologySpreadStatus) string {
		if st.AvailableSubnets[ok].IPAllocations["10.40.0.7"] != "bad-ip" {
			return "not listed"
		}
		return ""
	})
	if n := counter(t, e.reg, "cce_ipam_spread_reconciles_total", map[string]string{"result": "error"}); n != 0 {
		t.Fatalf("%v reconciles failed", n)
	}
}

// The elector runs the controllers again after a lost and regained
// leadership: a second Run of the same controller starts from scratch and
// catches up with what changed in between.
func TestController_RunAgain(t *testing.T) {
	e := newEnv(t)
	ok := e.subnet("ok", "10.45.0.0/24", nil)
	e.createSpread(spreadOver("p", false, ok))
	c := e.controller(spread.DefaultConfig())
	podCount := func(want int32) func(cce.PodSubnetTopologySpreadStatus) string {
		return func(st cce.PodSubnetTopologySpreadStatus) string {
			if n := st.AvailableSubnets[ok].PodCount; n != want || st.AvailableSubnetsNum != 1 {
				return fmt.Sprintf("podCount %d", n)
			}
			return ""
		}
	}
	stop := e.run(c)
	e.status("p", "first term", podCount(0))
	if err := stop(); err != nil {
		t.Fatalf("first Run returned %v", err)
	}
	e.wep("a", "p", ok, "10.45.0.5")
	stop = e.run(c)
	e.status("p", "second term", podCount(1))
	if err := stop(); err != nil {
		t.Fatalf("second Run returned %v", err)
	}
}
