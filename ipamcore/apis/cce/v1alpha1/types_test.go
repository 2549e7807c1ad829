package v1alpha1_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kjson "sigs.k8s.io/json"

	v1 "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// Every field of a reference or legacy object lands in the intended Go field,
// and the types know every field name the reference writes.
func TestTypes_DecodeReferenceFixtures_Strict(t *testing.T) {
	for _, f := range append(referenceFixtures(), legacyFixtures()...) {
		t.Run(f.file, func(t *testing.T) {
			// The decoder of client-go and the API server: field names are
			// case-sensitive, unknown and duplicate fields are reported.
			got := newEmpty(f.want)
			strictErrs, err := kjson.UnmarshalStrict(readFixture(t, f.file), got, kjson.DisallowUnknownFields)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range strictErrs {
				t.Errorf("strict decode: %v", e)
			}
			if !equality.Semantic.DeepEqual(got, f.want) {
				t.Errorf("decoded\n%s\nwant\n%s", pretty(got), pretty(f.want))
			}
		})
	}
}

// Encoding a decoded reference object gives back the same document: no field
// is lost, renamed or added, so objects we write read the same in the
// reference system.
func TestTypes_EncodeReferenceFixtures_RoundTrip(t *testing.T) {
	for _, f := range referenceFixtures() {
		t.Run(f.file, func(t *testing.T) {
			data := readFixture(t, f.file)
			obj := newEmpty(f.want)
			if err := kjson.UnmarshalCaseSensitivePreserveInts(data, obj); err != nil {
				t.Fatal(err)
			}
			out, err := json.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			want := jsonMap(t, data)
			got := jsonMap(t, out)
			// metadata gains creationTimestamp: null from ObjectMeta.
			delete(got["metadata"].(map[string]any), "creationTimestamp")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("re-encoded\n%s\nwant\n%s", pretty(got), pretty(want))
			}
		})
	}
}

// Objects the reference wrote with older releases (empty strings, nulls)
// encode without nulls, so they pass the schema even where it is stricter
// than nullable.
func TestTypes_EncodeLegacyFixtures_NoNullsOutsideNullableFields(t *testing.T) {
	nullable := map[string]bool{
		"updateAt": true, "podDeletedTime": true, "creationTimestamp": true,
		"subnets": true, "securityGroups": true, "enterpriseSecurityGroups": true,
		"excludes": true, "routes": true,
	}
	for _, f := range legacyFixtures() {
		t.Run(f.file, func(t *testing.T) {
			out, err := json.Marshal(f.want)
			if err != nil {
				t.Fatal(err)
			}
			var walk func(path string, v any)
			walk = func(path string, v any) {
				switch v := v.(type) {
				case map[string]any:
					for k, x := range v {
						if x == nil && !nullable[k] {
							t.Errorf("%s.%s is null", path, k)
						}
						walk(path+"."+k, x)
					}
				case []any:
					for _, x := range v {
						walk(path+"[]", x)
					}
				}
			}
			walk("", jsonMap(t, out))
		})
	}
}

func TestScheme_DecodesFixturesByKind(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	for _, f := range referenceFixtures() {
		t.Run(f.file, func(t *testing.T) {
			obj, gvk, err := codecs.UniversalDeserializer().Decode(readFixture(t, f.file), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if gvk.Group != v1.GroupName || gvk.Version != v1.Version {
				t.Errorf("group/version %s, want %s", gvk.GroupVersion(), v1.SchemeGroupVersion)
			}
			if reflect.TypeOf(obj) != reflect.TypeOf(f.want) {
				t.Errorf("decoded a %T, want %T", obj, f.want)
			}
			if !equality.Semantic.DeepEqual(obj, f.want) {
				t.Errorf("decoded\n%s\nwant\n%s", pretty(obj), pretty(f.want))
			}
		})
	}
	for _, kind := range []string{"WorkloadEndpoint", "WorkloadEndpointList", "IPPool", "IPPoolList", "Subnet", "SubnetList",
		"PodSubnetTopologySpread", "PodSubnetTopologySpreadList", "PodSubnetTopologySpreadTable", "PodSubnetTopologySpreadTableList"} {
		if !scheme.Recognizes(v1.SchemeGroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not know %s", kind)
		}
	}
	if got := v1.Resource("ippools").String(); got != "ippools.cce.io" {
		t.Errorf("Resource(ippools) = %s", got)
	}
}

// DeepCopy shares no map, slice or pointer with the original.
func TestDeepCopy_SharesNothing(t *testing.T) {
	for _, f := range referenceFixtures() {
		t.Run(f.file, func(t *testing.T) {
			orig := f.want.DeepCopyObject()
			cp := orig.DeepCopyObject()
			switch c := cp.(type) {
			case *v1.WorkloadEndpoint:
				c.Labels[v1.LabelOwner] = "changed"
				c.Finalizers[0] = "changed"
				c.Spec.Release.TTL = metav1.Duration{}
			case *v1.IPPool:
				c.Spec.IPv4Ranges[0].Excludes[0] = "changed"
				c.Spec.IPv4Ranges[0].Routes[0].Gw = "changed"
				c.Spec.ENI.Subnets[0] = "changed"
				eni := c.Status.ENI.ENIs["eni-x1y2z3w4"]
				eni.PrivateIPSet[0].PrivateIPAddress = "changed"
				c.Status.ENI.ENIs["eni-new"] = v1.ENI{}
			case *v1.Subnet:
				c.Spec.ID = "changed"
			case *v1.PodSubnetTopologySpread:
				changePSTSSpec(&c.Spec)
				changePSTSStatus(&c.Status)
			case *v1.PodSubnetTopologySpreadTable:
				changePSTSSpec(&c.Spec[0])
				changePSTSStatus(&c.Status[1])
				c.Spec = append(c.Spec[:1], v1.PodSubnetTopologySpreadSpec{})
			}
			if !equality.Semantic.DeepEqual(orig, f.want) {
				t.Errorf("changing a deep copy changed the original:\n%s", pretty(orig))
			}
		})
	}
}

// changePSTSSpec changes every map, slice and pointer of a fixture's PSTS
// spec in place.
func changePSTSSpec(s *v1.PodSubnetTopologySpreadSpec) {
	fixed := s.Subnets["sbn-fx0a1b2c"]
	fixed.IPv4[0] = "changed"
	fixed.IPv6[0] = "changed"
	fixed.IPv4Range[0] = "changed"
	fixed.IPv6Range[0] = "changed"
	fixed.Custom[0].CustomIPRange[0].Start = "changed"
	fixed.TTL.Duration = time.Second
	s.Subnets["sbn-new"] = v1.SubnetAllocation{}
	s.Strategy.TTL.Duration = time.Second
	s.Strategy.Type = "changed"
	s.Selector.MatchLabels["app"] = "changed"
	s.Selector.MatchExpressions[0].Values[0] = "changed"
}

// changePSTSStatus changes every map of a fixture's PSTS status in place.
func changePSTSStatus(s *v1.PodSubnetTopologySpreadStatus) {
	s.AvailableSubnets["sbn-fx0a1b2c"].IPAllocations["10.0.5.10"] = "changed"
	s.AvailableSubnets["sbn-new"] = v1.SubnetPodStatus{}
	s.UnavailableSubnets["sbn-gone0001"].IPAllocations["10.0.7.9"] = "changed"
	delete(s.UnavailableSubnets, "sbn-gone0001")
}
