package subnet

import (
	"maps"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

func TestWanted_ExclusiveOnlyForPSTSStrategiesThatPick(t *testing.T) {
	typ := func(t cce.IPAllocType) cce.SubnetAllocation {
		return cce.SubnetAllocation{IPAllocationStrategy: cce.IPAllocationStrategy{Type: t}}
	}
	pools := []*cce.IPPool{{Spec: cce.IPPoolSpec{ENI: cce.ENISpec{Subnets: []string{"sbn-pool", "sbn-both"}}}}}
	spreads := []*cce.PodSubnetTopologySpread{
		{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: cce.PodSubnetTopologySpreadSpec{Subnets: map[string]cce.SubnetAllocation{
			"sbn-fixed": typ(cce.IPAllocTypeFixed), "sbn-elastic": {}, "sbn-both": typ(cce.IPAllocTypeCustom),
			"sbn-mixed": {}, "Bad_ID": typ(cce.IPAllocTypeFixed), "": {},
		}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: cce.PodSubnetTopologySpreadSpec{
			Strategy: &cce.IPAllocationStrategy{Type: cce.IPAllocTypeManual},
			Subnets:  map[string]cce.SubnetAllocation{"sbn-mixed": typ(cce.IPAllocTypeElastic), "sbn-global": {}},
		}},
	}
	want := map[string]bool{
		"sbn-pool": false, "sbn-both": false, "sbn-fixed": true, "sbn-elastic": false, "sbn-mixed": true, "sbn-global": true,
	}
	if got := wanted(pools, spreads); !maps.Equal(got, want) {
		t.Fatalf("wanted = %v, want %v", got, want)
	}
	if got := wanted(nil, nil); len(got) != 0 {
		t.Fatalf("wanted of nothing = %v", got)
	}
}
