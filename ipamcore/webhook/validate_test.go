package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// pstsWorld: five subnets the cloud knows, with different users.
func pstsWorld() world {
	sub := func(id, cidr string) cloud.Subnet {
		return cloud.Subnet{ID: id, ZoneName: "cn-bj-a", CIDR: cidr, AvailableIP: 200}
	}
	used := subnetCR("sbn-used", "cn-bj-a", false, true, false)
	used.Spec.CIDR = "10.4.0.0/24"
	return world{
		cloud: &fakeCloud{subnets: map[string]cloud.Subnet{
			"sbn-free": sub("sbn-free", "10.1.0.0/24"), "sbn-eni": sub("sbn-eni", "10.2.0.0/24"),
			"sbn-excl": sub("sbn-excl", "10.3.0.0/24"), "sbn-used": sub("sbn-used", "10.4.0.0/24"),
			"sbn-elastic": sub("sbn-elastic", "10.5.0.0/24"), "sbn-fixed": sub("sbn-fixed", "10.6.0.0/24"),
		}},
		subnets: []*cce.Subnet{subnetCR("sbn-excl", "cn-bj-a", true, true, false), used},
		pools: []*cce.IPPool{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ippool-n1"},
			Spec:       cce.IPPoolSpec{ENI: cce.ENISpec{Subnets: []string{"sbn-eni"}}},
			Status: cce.IPPoolStatus{ENI: cce.ENIStatus{ENIs: map[string]cce.ENI{"eni-1": {
				ID: "eni-1", Subnet: "sbn-eni",
				PrivateIPSet: []cce.PrivateIP{{IsPrimary: true, PrivateIPAddress: "10.2.0.5"}, {PrivateIPAddress: "10.4.0.9"}},
			}}}},
		}},
		psts: []*cce.PodSubnetTopologySpread{
			pstsObj("x", "elastic", 0, map[string]string{"a": "b"}, map[string]cce.SubnetAllocation{"sbn-elastic": {}}),
			pstsObj("x", "fixed", 0, map[string]string{"a": "b"}, map[string]cce.SubnetAllocation{
				"sbn-fixed": {IPAllocationStrategy: cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed}}}),
		},
	}
}

func typ(t cce.IPAllocType) cce.SubnetAllocation {
	return cce.SubnetAllocation{IPAllocationStrategy: cce.IPAllocationStrategy{Type: t}}
}

func TestServer_CheckPSTS(t *testing.T) {
	fixed := func(ips ...string) cce.SubnetAllocation {
		a := typ(cce.IPAllocTypeFixed)
		for _, ip := range ips {
			if strings.Contains(ip, "/") {
				a.IPv4Range = append(a.IPv4Range, ip)
			} else {
				a.IPv4 = append(a.IPv4, ip)
			}
		}
		return a
	}
	for _, tc := range []struct {
		name    string
		subnets map[string]cce.SubnetAllocation
		edit    func(p *cce.PodSubnetTopologySpread)
		code    int32 // 0: admitted
		want    []string
	}{
		{name: "no subnets", subnets: map[string]cce.SubnetAllocation{}, code: 422, want: []string{"spec.subnets is empty"}},
		{name: "unknown type", subnets: map[string]cce.SubnetAllocation{"sbn-free": typ("Sticky")}, code: 422,
			want: []string{`subnet sbn-free: unknown strategy type "Sticky"`}},
		{name: "unknown global release strategy", subnets: map[string]cce.SubnetAllocation{"sbn-free": {}}, code: 422,
			edit: func(p *cce.PodSubnetTopologySpread) {
				p.Spec.Strategy = &cce.IPAllocationStrategy{Type: cce.IPAllocTypeFixed, ReleaseStrategy: "Sometimes"}
			}, want: []string{`spec.strategy: unknown release strategy "Sometimes"`}},
		{name: "bad spread", subnets: map[string]cce.SubnetAllocation{"sbn-free": {}}, code: 422,
			edit: func(p *cce.PodSubnetTopologySpread) { p.Spec.WhenUnsatisfiable, p.Spec.MaxSkew = "Maybe", -1 },
			want: []string{`whenUnsatisfiable "Maybe"`, "maxSkew -1 is negative"}},
		{name: "subnet unknown to the cloud", subnets: map[string]cce.SubnetAllocation{"sbn-free": {}, "sbn-nope": {}}, code: 422,
			want: []string{"subnet sbn-nope does not exist in the cloud"}},
		{name: "address outside the subnet", subnets: map[string]cce.SubnetAllocation{"sbn-free": fixed("10.9.0.1")}, code: 422,
			want: []string{"subnet sbn-free (Fixed strategy): addresses do not fit the subnet 10.1.0.0/24", "10.9.0.1 is not inside"}},
		{name: "overlapping ranges", subnets: map[string]cce.SubnetAllocation{"sbn-free": fixed("10.1.0.0/28", "10.1.0.8/29")}, code: 422,
			want: []string{"subnet sbn-free", "overlap"}},
		{name: "malformed address", subnets: map[string]cce.SubnetAllocation{"sbn-free": fixed("10.1.0.300")}, code: 422,
			want: []string{`"10.1.0.300" is not an IPv4 address`}},
		{name: "Elastic on an exclusive subnet", subnets: map[string]cce.SubnetAllocation{"sbn-excl": {}}, code: 422,
			want: []string{"subnet sbn-excl (Elastic strategy): the subnet is exclusive"}},
		{name: "Elastic where a Fixed PSTS is", subnets: map[string]cce.SubnetAllocation{"sbn-fixed": typ(cce.IPAllocTypeElastic)}, code: 422,
			want: []string{"subnet sbn-fixed (Elastic strategy): the subnet is used by Fixed PodSubnetTopologySpread x/fixed"}},
		{name: "Fixed on an ENI subnet", subnets: map[string]cce.SubnetAllocation{"sbn-eni": fixed()}, code: 422,
			want: []string{"subnet sbn-eni (Fixed strategy): the subnet is an ENI subnet of IPPool default/ippool-n1"}},
		{name: "Manual where an ENI holds an address", subnets: map[string]cce.SubnetAllocation{"sbn-used": typ(cce.IPAllocTypeManual)},
			code: 422, want: []string{"subnet sbn-used (Manual strategy): the subnet is not exclusive and ENI eni-1 of IPPool default/ippool-n1 holds its address 10.4.0.9"}},
		{name: "Custom where an Elastic PSTS is", subnets: map[string]cce.SubnetAllocation{"sbn-elastic": typ(cce.IPAllocTypeCustom)},
			code: 422, want: []string{"subnet sbn-elastic (Custom strategy): the subnet is used by Elastic PodSubnetTopologySpread x/elastic"}},
		{name: "every fault at once", subnets: map[string]cce.SubnetAllocation{"sbn-excl": {}, "sbn-eni": fixed()}, code: 422,
			want: []string{"sbn-excl (Elastic strategy)", "sbn-eni (Fixed strategy)"}},
		{name: "Fixed on a free subnet", subnets: map[string]cce.SubnetAllocation{"sbn-free": fixed("10.1.0.10", "10.1.0.32/28")}},
		{name: "Fixed next to another Fixed", subnets: map[string]cce.SubnetAllocation{"sbn-fixed": fixed()}},
		{name: "a global strategy overrides the subnets'", subnets: map[string]cce.SubnetAllocation{"sbn-excl": typ("Sticky")},
			edit: func(p *cce.PodSubnetTopologySpread) {
				p.Spec.Strategy = &cce.IPAllocationStrategy{Type: cce.IPAllocTypeManual}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, pstsWorld())
			p := pstsObj("apps", "mine", 0, map[string]string{"app": "x"}, tc.subnets)
			if tc.edit != nil {
				tc.edit(p)
			}
			uses, err := s.checkPSTS(context.Background(), p)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if len(uses) != len(tc.subnets) {
					t.Fatalf("uses %+v", uses)
				}
				return
			}
			var r *refusal
			if !errors.As(err, &r) || r.code != tc.code {
				t.Fatalf("err %v, want a refusal with HTTP %d", err, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
		})
	}
}

// A cloud that cannot answer refuses with 503 and Retry-After, naming the
// subnet; an UPDATE that keeps the spec passes without asking it.
func TestServer_ReviewPSTS_CloudOutage(t *testing.T) {
	w := pstsWorld()
	w.cloud.err = &cloud.Error{Op: "DescribeSubnet", Class: cloud.ClassServer, StatusCode: 500, Code: "InternalError"}
	s := newTestServer(t, w)
	p := pstsObj("apps", "mine", 0, map[string]string{"app": "x"}, map[string]cce.SubnetAllocation{"sbn-free": {}})
	raw, _ := json.Marshal(p)
	req := &admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Namespace: "apps", Name: "mine",
		Resource: metav1.GroupVersionResource{Group: "cce.io", Version: "v1alpha1", Resource: "podsubnettopologyspreads"},
		Object:   runtime.RawExtension{Raw: raw}}
	_, err := s.reviewPSTS(context.Background(), req)
	resp := deny(err)
	if resp.Allowed || resp.Result.Code != http.StatusServiceUnavailable || resp.Result.Details == nil ||
		resp.Result.Details.RetryAfterSeconds == 0 || !strings.Contains(resp.Result.Message, "subnet sbn-free") ||
		!strings.Contains(resp.Result.Message, "try again") {
		t.Fatalf("answer %+v %+v, want 503 with Retry-After naming the subnet", resp, resp.Result)
	}
	p.Finalizers = []string{"x"}
	req.Operation, req.OldObject = admissionv1.Update, req.Object
	req.Object.Raw, _ = json.Marshal(p)
	if resp, err := s.reviewPSTS(context.Background(), req); err != nil || !resp.Allowed {
		t.Fatalf("a metadata update was refused: %v", err)
	}
}
