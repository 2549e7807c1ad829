package v1alpha1_test

import (
	"encoding/json"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
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

// FuzzClaimName: every address's claim name is a valid object name that
// names that address alone, and every name AddrOfClaimName accepts is the
// claim name of the address it returns (one address, one name).
func FuzzClaimName(f *testing.F) {
	f.Add([]byte{10, 0, 1, 5}, "10.0.1.5")
	f.Add([]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, "fd00-0-0-0-0-0-0-1")
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 5}, "0-0-0-0-0-ffff-a00-105")
	f.Add([]byte{}, "010.0.1.5")
	f.Fuzz(func(t *testing.T, raw []byte, name string) {
		if addr, ok := netip.AddrFromSlice(raw); ok {
			n := v1.ClaimName(addr)
			if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
				t.Fatalf("ClaimName(%s) = %q is not a valid object name: %v", addr, n, errs)
			}
			back, ok := v1.AddrOfClaimName(n)
			if !ok || back != addr.Unmap() {
				t.Fatalf("AddrOfClaimName(ClaimName(%s) = %q) = %s, %v", addr, n, back, ok)
			}
		}
		if addr, ok := v1.AddrOfClaimName(name); ok {
			if got := v1.ClaimName(addr); got != name {
				t.Fatalf("AddrOfClaimName(%q) = %s, whose claim name is %q: two names for one address", name, addr, got)
			}
			if addr.Is4In6() || addr.Zone() != "" {
				t.Fatalf("AddrOfClaimName(%q) = %s, not a plain address", name, addr)
			}
		}
	})
}
