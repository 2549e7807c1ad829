package invariants

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// WorldView keeps the cluster's ENIs only, with their secondary addresses
// (a cross-subnet one included) and their subnet's CIDR, and passes a
// failed read on (a check must not pass on an empty world).
func TestWorldView_ENIs(t *testing.T) {
	world := bcesim.WorldDump{Subnets: []bcesim.SubnetView{{SubnetID: "sbn-a", CIDR: "10.0.0.0/24"}}, ENIs: []bcesim.ENIView{
		{ENIID: "eni-1", Name: "c1/node-a", InstanceID: "i-a", SubnetID: "sbn-a", Status: bcesim.StatusInUse,
			PrivateIPSet: []bcesim.PrivateIPView{{PrivateIPAddress: "10.0.0.1", Primary: true}, {PrivateIPAddress: "10.0.0.2"},
				{PrivateIPAddress: "10.0.0.3"}, {PrivateIPAddress: "10.9.0.7", SubnetID: "sbn-psts"}}},
		{ENIID: "eni-2", Name: "c1/node-b", Status: bcesim.StatusAvailable},
		{ENIID: "eni-3", Name: "c2/node-a", InstanceID: "i-x", Status: bcesim.StatusInUse},
	}}
	v := WorldView(func(context.Context) (bcesim.WorldDump, error) { return world, nil }, "c1/")
	got, err := v.ENIs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []ENI{
		{ID: "eni-1", Name: "c1/node-a", InstanceID: "i-a", InUse: true, SubnetID: "sbn-a", SubnetCIDR: "10.0.0.0/24",
			IPs: []string{"10.0.0.2", "10.0.0.3", "10.9.0.7"}},
		{ID: "eni-2", Name: "c1/node-b"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ENIs = %+v, want %+v", got, want)
	}

	boom := errors.New("admin API down")
	failing := WorldView(func(context.Context) (bcesim.WorldDump, error) { return bcesim.WorldDump{}, boom }, "c1/")
	if _, err := failing.ENIs(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("error = %v, want %v", err, boom)
	}
}
