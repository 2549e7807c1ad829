package v1alpha1_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

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
	return []string{"unknown/workloadendpoint.json", "unknown/ippool.json", "unknown/subnet.json"}
}

// readFixture returns the bytes of a testdata file.
func readFixture(t *testing.T, file string) []byte {
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
