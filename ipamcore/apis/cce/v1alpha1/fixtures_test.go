package v1alpha1_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8snet "k8s.io/utils/net"

	v1 "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Fixtures in testdata are objects as the reference system writes them:
//
//	reference/  every field of the appendix of the upstream spec, filled in;
//	legacy/     the shape older reference releases wrote: empty strings and
//	            nulls instead of omitted fields;
//	unknown/    fields our types do not know, at every level; they must
//	            survive on the server (used by the integration test only).
//
// The integration test creates them on a real API server; the unit tests
// decode them into the Go types.

// fixture is one testdata file and the Go value it must decode to.
type fixture struct {
	file     string // relative to testdata
	resource string // plural
	want     runtime.Object
}

func date(s string) metav1.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return metav1.NewTime(t)
}

func referenceFixtures() []fixture {
	return []fixture{
		{file: "reference/workloadendpoint.json", resource: "workloadendpoints", want: &v1.WorkloadEndpoint{
			TypeMeta: metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "WorkloadEndpoint"},
			ObjectMeta: metav1.ObjectMeta{
				Name: "web-0",
				Labels: map[string]string{
					v1.LabelSubnetID:     "sbn-a1b2c3d4",
					v1.LabelInstanceType: v1.InstanceTypeBCC,
					v1.LabelOwner:        "web",
				},
				Finalizers: []string{v1.WorkloadEndpointFinalizer},
			},
			Spec: v1.WorkloadEndpointSpec{
				ContainerID:             "9f1c0e7d2b3a4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5",
				IP:                      "10.0.1.23",
				IPv6:                    "2400:da00:e003::17",
				Type:                    v1.WorkloadEndpointTypeStatefulSet,
				Mac:                     "fa:26:00:0a:bc:01",
				Gw:                      "10.0.1.1",
				ENIID:                   "eni-x1y2z3w4",
				Node:                    "10.0.0.5",
				InstanceID:              "i-AbCd1234",
				SubnetID:                "sbn-a1b2c3d4",
				EnableFixIP:             v1.EnableFixIPTrue,
				FixIPDeletePolicy:       v1.FixIPDeletePolicyNever,
				UpdateAt:                date("2024-05-06T07:08:09Z"),
				ENISubnetID:             "sbn-e1e2e3e4",
				SubnetTopologyReference: "psts-web",
				Phase:                   v1.WorkloadEndpointPhasePodRunning,
				Release: &v1.WorkloadEndpointRelease{
					TTL:            metav1.Duration{Duration: 7 * 24 * time.Hour},
					PodDeletedTime: date("2024-05-07T01:02:03Z"),
				},
			},
		}},
		{file: "reference/ippool.json", resource: "ippools", want: &v1.IPPool{
			TypeMeta:   metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "IPPool"},
			ObjectMeta: metav1.ObjectMeta{Name: "ippool-10-0-0-5"},
			Spec: v1.IPPoolSpec{
				NodeSelector:   "kubernetes.io/hostname=10.0.0.5",
				CreationSource: v1.IPPoolCreationSourceCNI,
				Priority:       10,
				IPv4Ranges: []v1.Range{{
					Version:    4,
					CIDR:       "172.16.0.0/24",
					RangeStart: "172.16.0.10",
					RangeEnd:   "172.16.0.200",
					Excludes:   []string{"172.16.0.100", "172.16.0.101"},
					Gateway:    "172.16.0.1",
					Routes:     []v1.Route{{Dst: "0.0.0.0/0", Gw: "172.16.0.1"}},
					VlanID:     100,
				}},
				IPv6Ranges: []v1.Range{{
					Version:    6,
					CIDR:       "fd00:10::/64",
					RangeStart: "fd00:10::10",
					RangeEnd:   "fd00:10::ff",
					Excludes:   []string{"fd00:10::20"},
					Gateway:    "fd00:10::1",
					Routes:     []v1.Route{{Dst: "::/0", Gw: "fd00:10::1"}},
					VlanID:     200,
				}},
				ENI: v1.ENISpec{
					VPCID:                    "vpc-q1w2e3r4",
					AvailabilityZone:         "zoneD",
					Subnets:                  []string{"sbn-a1b2c3d4", "sbn-f5g6h7j8"},
					SecurityGroups:           []string{"g-sg0001"},
					EnterpriseSecurityGroups: []string{"esg-0001"},
				},
				PodSubnets: []string{"sbn-p0d50001"},
			},
			Status: v1.IPPoolStatus{ENI: v1.ENIStatus{ENIs: map[string]v1.ENI{
				"eni-x1y2z3w4": {
					ID:               "eni-x1y2z3w4",
					MAC:              "fa:26:00:0a:bc:01",
					AvailabilityZone: "zoneD",
					Description:      "auto created by cce-cni, do not modify",
					InterfaceIndex:   3,
					Subnet:           "sbn-a1b2c3d4",
					VPC:              "vpc-q1w2e3r4",
					PrivateIPSet: []v1.PrivateIP{
						{IsPrimary: true, PublicIPAddress: "106.12.0.8", PrivateIPAddress: "10.0.1.2"},
						{PrivateIPAddress: "10.0.1.23"},
					},
					SecurityGroups: []string{"g-sg0001"},
				},
				"eni-n9m8b7v6": {
					ID:               "eni-n9m8b7v6",
					MAC:              "fa:26:00:0a:bc:02",
					AvailabilityZone: "zoneD",
					Description:      "auto created by cce-cni, do not modify",
					InterfaceIndex:   -1,
					Subnet:           "sbn-f5g6h7j8",
					VPC:              "vpc-q1w2e3r4",
					PrivateIPSet:     []v1.PrivateIP{{IsPrimary: true, PrivateIPAddress: "10.0.2.2"}},
				},
			}}},
		}},
		{file: "reference/subnet.json", resource: "subnets", want: &v1.Subnet{
			TypeMeta:   metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "Subnet"},
			ObjectMeta: metav1.ObjectMeta{Name: "sbn-a1b2c3d4"},
			Spec: v1.SubnetSpec{
				ID:               "sbn-a1b2c3d4",
				Name:             "cce-pods-zoneD",
				AvailabilityZone: "zoneD",
				CIDR:             "10.0.1.0/24",
				Exclusive:        true,
			},
			Status: v1.SubnetStatus{
				AvailableIPNum: 0,
				Enable:         true,
				HasNoMoreIP:    true,
				Reason:         "subnet has no more ip",
			},
		}},
		{file: "reference/podsubnettopologyspread.json", resource: "podsubnettopologyspreads", want: &v1.PodSubnetTopologySpread{
			TypeMeta: metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "PodSubnetTopologySpread"},
			ObjectMeta: metav1.ObjectMeta{
				Name:   "psts-web",
				Labels: map[string]string{"app": "web"},
			},
			Spec:   pstsSpec("psts-web", 10, "web"),
			Status: pstsStatus("psts-web"),
		}},
		{file: "reference/podsubnettopologyspreadtable.json", resource: "podsubnettopologyspreadtables", want: &v1.PodSubnetTopologySpreadTable{
			TypeMeta:   metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "PodSubnetTopologySpreadTable"},
			ObjectMeta: metav1.ObjectMeta{Name: "pstt-shop"},
			Spec:       []v1.PodSubnetTopologySpreadSpec{pstsSpec("psts-web", 10, "web"), pstsSpec("psts-api", 5, "api")},
			Status:     []v1.PodSubnetTopologySpreadStatus{pstsStatus("psts-web"), pstsStatus("psts-api")},
		}},
	}
}

// pstsSpec is the spec of the PSTS fixtures: every field of the reference's
// PSTS, IPv6 included, set.
func pstsSpec(name string, priority int32, app string) v1.PodSubnetTopologySpreadSpec {
	return v1.PodSubnetTopologySpreadSpec{
		Name: name,
		Subnets: map[string]v1.SubnetAllocation{
			"sbn-fx0a1b2c": {
				IPAllocationStrategy: v1.IPAllocationStrategy{
					Type:                 v1.IPAllocTypeFixed,
					ReleaseStrategy:      v1.ReleaseStrategyNever,
					EnableReuseIPAddress: true,
					TTL:                  &metav1.Duration{Duration: v1.DefaultReuseIPTTL},
				},
				IPv4:      []string{"10.0.5.10", "10.0.5.11"},
				IPv6:      []string{"2400:da00:e003:5::10"},
				IPv4Range: []string{"10.0.5.64/27"},
				IPv6Range: []string{"2400:da00:e003:5::/120"},
				Custom: []v1.CustomAllocation{
					{
						Family: k8snet.IPv4,
						CustomIPRange: []v1.CustomIPRange{
							{Start: "10.0.5.100", End: "10.0.5.120"},
							{Start: "10.0.5.200", End: "10.0.5.200"},
						},
					},
					{
						Family:        k8snet.IPv6,
						CustomIPRange: []v1.CustomIPRange{{Start: "2400:da00:e003:5::100", End: "2400:da00:e003:5::1ff"}},
					},
				},
			},
			"sbn-el3d4e5f": {IPAllocationStrategy: v1.IPAllocationStrategy{
				Type:            v1.IPAllocTypeElastic,
				ReleaseStrategy: v1.ReleaseStrategyTTL,
			}},
		},
		Strategy: &v1.IPAllocationStrategy{
			Type:                 v1.IPAllocTypeCustom,
			ReleaseStrategy:      v1.ReleaseStrategyTTL,
			EnableReuseIPAddress: true,
			TTL:                  &metav1.Duration{Duration: 90 * time.Minute},
		},
		Selector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"app": app},
			MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key:      "tier",
				Operator: metav1.LabelSelectorOpIn,
				Values:   []string{"front", "edge"},
			}},
		},
		Priority:                 priority,
		MaxSkew:                  2,
		WhenUnsatisfiable:        v1.ScheduleAnyway,
		EnableIPAllocationStatus: true,
		EnablePodTopologySpread:  true,
	}
}

// pstsStatus is the status of the PSTS fixtures, every field set.
func pstsStatus(name string) v1.PodSubnetTopologySpreadStatus {
	return v1.PodSubnetTopologySpreadStatus{
		Name:                  name,
		AvailableSubnetsNum:   2,
		UnavailableSubnetsNum: 1,
		AvailableSubnets: map[string]v1.SubnetPodStatus{
			"sbn-fx0a1b2c": {
				AvailableIPNum:   240,
				Enable:           true,
				HasNoMoreIP:      true,
				ID:               "sbn-fx0a1b2c",
				Name:             "psts-fixed",
				AvailabilityZone: "zoneD",
				CIDR:             "10.0.5.0/24",
				IPv6CIDR:         "2400:da00:e003:5::/64",
				PodCount:         2,
				Message:          "subnet has no more ip",
				IPAllocations:    map[string]string{"10.0.5.10": "web-0", "10.0.5.11": "web-1"},
			},
			"sbn-el3d4e5f": {
				AvailableIPNum:   12,
				Enable:           true,
				ID:               "sbn-el3d4e5f",
				Name:             "psts-elastic",
				AvailabilityZone: "zoneD",
				CIDR:             "10.0.6.0/28",
				PodCount:         1,
			},
		},
		UnavailableSubnets: map[string]v1.SubnetPodStatus{
			"sbn-gone0001": {
				AvailableIPNum:   1,
				Enable:           true,
				HasNoMoreIP:      true,
				ID:               "sbn-gone0001",
				Name:             "psts-other-zone",
				AvailabilityZone: "zoneF",
				CIDR:             "10.0.7.0/24",
				IPv6CIDR:         "2400:da00:e003:7::/64",
				PodCount:         3,
				Message:          "subnet zone zoneF has no node",
				IPAllocations:    map[string]string{"10.0.7.9": "web-9"},
			},
		},
		PodMatchedCount:  4,
		PodAffectedCount: 3,
	}
}

func legacyFixtures() []fixture {
	return []fixture{
		{file: "legacy/workloadendpoint.json", resource: "workloadendpoints", want: &v1.WorkloadEndpoint{
			TypeMeta: metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "WorkloadEndpoint"},
			ObjectMeta: metav1.ObjectMeta{
				Name: "nginx-7c5b8d9f4-x2k7p",
				Labels: map[string]string{
					v1.LabelSubnetID:     "sbn-a1b2c3d4",
					v1.LabelInstanceType: v1.InstanceTypeBCC,
				},
				Finalizers: []string{v1.WorkloadEndpointFinalizer},
			},
			Spec: v1.WorkloadEndpointSpec{
				ContainerID: "c0ffee",
				IP:          "10.0.1.24",
				Type:        v1.WorkloadEndpointTypePod,
				Mac:         "fa:26:00:0a:bc:01",
				ENIID:       "eni-x1y2z3w4",
				Node:        "node-a",
				SubnetID:    "sbn-a1b2c3d4",
				Release:     &v1.WorkloadEndpointRelease{},
			},
		}},
		{file: "legacy/ippool.json", resource: "ippools", want: &v1.IPPool{
			TypeMeta:   metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "IPPool"},
			ObjectMeta: metav1.ObjectMeta{Name: "ippool-node-a"},
			Spec: v1.IPPoolSpec{
				NodeSelector:   "kubernetes.io/hostname=node-a",
				CreationSource: v1.IPPoolCreationSourceCNI,
				IPv4Ranges:     []v1.Range{{Version: 4, CIDR: "172.16.1.0/24"}},
			},
		}},
		{file: "legacy/subnet.json", resource: "subnets", want: &v1.Subnet{
			TypeMeta:   metav1.TypeMeta{APIVersion: "cce.io/v1alpha1", Kind: "Subnet"},
			ObjectMeta: metav1.ObjectMeta{Name: "sbn-f5g6h7j8"},
			Spec: v1.SubnetSpec{
				ID:               "sbn-f5g6h7j8",
				AvailabilityZone: "zoneD",
				CIDR:             "10.0.2.0/24",
			},
			Status: v1.SubnetStatus{AvailableIPNum: 251, Enable: true},
		}},
	}
}

func unknownFieldFixtures() []string {
	return []string{"unknown/workloadendpoint.json", "unknown/ippool.json", "unknown/subnet.json", "unknown/podsubnettopologyspread.json"}
}

// readFixture returns the bytes of a testdata file.
func readFixture(t testing.TB, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// jsonMap decodes JSON into generic maps, the form in which two documents
// compare field by field.
func jsonMap(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return m
}

// newEmpty returns a zero object of the same kind as obj.
func newEmpty(obj runtime.Object) runtime.Object {
	switch obj.(type) {
	case *v1.WorkloadEndpoint:
		return &v1.WorkloadEndpoint{}
	case *v1.IPPool:
		return &v1.IPPool{}
	case *v1.Subnet:
		return &v1.Subnet{}
	case *v1.PodSubnetTopologySpread:
		return &v1.PodSubnetTopologySpread{}
	case *v1.PodSubnetTopologySpreadTable:
		return &v1.PodSubnetTopologySpreadTable{}
	}
	panic("unexpected kind")
}

// pretty renders a value for failure messages.
func pretty(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err.Error()
	}
	return string(b)
}
