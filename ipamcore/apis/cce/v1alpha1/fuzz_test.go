package v1alpha1_test

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"

	v1 "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// FuzzPSTSDecode feeds arbitrary JSON to the PSTS kinds the way client-go
// decodes objects. Nothing may panic, and whatever decodes is stable: it
// encodes, decodes back to the same value, and deep-copies to an equal one.
// Give -fuzz a short -fuzzminimizetime (2s): minimizing each new input of
// the fixtures' size takes the default minute, during which nothing else
// runs.
func FuzzPSTSDecode(f *testing.F) {
	for _, fx := range referenceFixtures() {
		switch fx.want.(type) {
		case *v1.PodSubnetTopologySpread, *v1.PodSubnetTopologySpreadTable:
			f.Add(readFixture(f, fx.file))
		}
	}
	f.Add([]byte(`{"spec":{"subnets":null,"strategy":{"ttl":"1h"}},"status":{"availableSubnets":{"s":{"ipAllocations":null}}}}`))
	f.Add([]byte(`{"spec":[{"subnets":{"s":{"custom":[{"family":"6","customIPRange":[{}]}]}}}],"status":[{}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, obj := range []runtime.Object{&v1.PodSubnetTopologySpread{}, &v1.PodSubnetTopologySpreadTable{}} {
			if err := kjson.UnmarshalCaseSensitivePreserveInts(data, obj); err != nil {
				continue
			}
			out, err := json.Marshal(obj)
			if err != nil {
				t.Fatalf("%T decoded but does not encode: %v", obj, err)
			}
			again := newEmpty(obj)
			if err := kjson.UnmarshalCaseSensitivePreserveInts(out, again); err != nil {
				t.Fatalf("%T: its own encoding does not decode: %v\n%s", obj, err, out)
			}
			if !equality.Semantic.DeepEqual(again, obj) {
				t.Fatalf("%T changed in an encode/decode round trip:\n%s\nthen\n%s", obj, pretty(obj), pretty(again))
			}
			if cp := obj.DeepCopyObject(); !equality.Semantic.DeepEqual(cp, obj) {
				t.Fatalf("%T: deep copy differs:\n%s\nwant\n%s", obj, pretty(cp), pretty(obj))
			}
		}
	})
}
