package cloud_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// The conformance tests drive the real bce-sdk-go (through cloud.Client)
// against bcesim over HTTP on 127.0.0.1, for every Provider operation.

func createENI(t *testing.T, e *env, name, subnet string) string {
	t.Helper()
	id, err := e.client.CreateENI(context.Background(), cloud.CreateENIRequest{
		Name:             name,
		SubnetID:         subnet,
		SecurityGroupIDs: []string{e.sg},
	})
	if err != nil {
		t.Fatalf("create eni %s: %v", name, err)
	}
	return id
}

func attach(t *testing.T, e *env, eniID, inst string) {
	t.Helper()
	if err := e.client.AttachENI(context.Background(), eniID, inst); err != nil {
		t.Fatalf("attach %s to %s: %v", eniID, inst, err)
	}
}

func addrs(e *cloud.ENI) []string {
	var out []string
	for _, ip := range e.PrivateIPs {
		out = append(out, ip.Address)
	}
	slices.Sort(out)
	return out
}

func available(t *testing.T, e *env, subnet string) int {
	t.Helper()
	sn, err := e.client.DescribeSubnet(context.Background(), subnet)
	if err != nil {
		t.Fatal(err)
	}
	return sn.AvailableIP
}

func TestConformance_ENILifecycle(t *testing.T) {
	e := newEnv(t, envOpts{sim: bcesim.Config{World: bcesim.WorldConfig{
		AttachDelay: 5 * time.Second,
		DetachDelay: 2 * time.Second,
	}}})
	ctx := context.Background()
	free0 := available(t, e, e.subnet)

	id := createENI(t, e, "c-1/i-128g/node1/abcdef", e.subnet)
	got, err := e.client.GetENI(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != cloud.ENIStatusAvailable || got.InstanceID != "" || got.PrimaryIP() == "" || got.CreatedTime.IsZero() ||
		got.MACAddress == "" || got.VPCID != testVPC || got.ZoneName != testZone || !slices.Equal(got.SecurityGroupIDs, []string{e.sg}) {
		t.Fatalf("new eni = %+v", got)
	}
	if n := available(t, e, e.subnet); n != free0-1 {
		t.Fatalf("availableIp after create = %d, want %d", n, free0-1)
	}

	attach(t, e, id, e.i128g)
	if got, _ := e.client.GetENI(ctx, id); got.Status != cloud.ENIStatusAttaching || got.InstanceID != e.i128g {
		t.Fatalf("right after attach: %s on %q, want attaching on %s", got.Status, got.InstanceID, e.i128g)
	}
	e.clock.Step(5 * time.Second)
	if got, _ := e.client.GetENI(ctx, id); got.Status != cloud.ENIStatusInUse {
		t.Fatalf("after the attach delay: %s, want inuse", got.Status)
	}

	one, err := e.client.AddPrivateIP(ctx, id, "")
	if err != nil || !netip.MustParsePrefix("10.0.0.0/24").Contains(netip.MustParseAddr(one)) {
		t.Fatalf("add auto ip: %q %v", one, err)
	}
	exact, err := e.client.AddPrivateIP(ctx, id, "10.0.0.200")
	if err != nil || exact != "10.0.0.200" {
		t.Fatalf("add explicit ip: %q %v", exact, err)
	}
	counted, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{Count: 4})
	if err != nil || len(counted) != 4 {
		t.Fatalf("batch add 4: %v %v", counted, err)
	}
	listed, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{IPs: []string{"10.0.0.210", "10.0.0.211"}})
	if err != nil || !slices.Equal(listed, []string{"10.0.0.210", "10.0.0.211"}) {
		t.Fatalf("batch add explicit: %v %v", listed, err)
	}
	got, _ = e.client.GetENI(ctx, id)
	if len(got.PrivateIPs) != 1+1+1+4+2 {
		t.Fatalf("eni holds %v", addrs(got))
	}
	if n := available(t, e, e.subnet); n != free0-9 {
		t.Fatalf("availableIp = %d, want %d", n, free0-9)
	}

	if err := e.client.DeletePrivateIP(ctx, id, one); err != nil {
		t.Fatal(err)
	}
	if err := e.client.BatchDeletePrivateIPs(ctx, id, counted); err != nil {
		t.Fatal(err)
	}
	got, _ = e.client.GetENI(ctx, id)
	if want := []string{got.PrimaryIP(), "10.0.0.200", "10.0.0.210", "10.0.0.211"}; !slices.Equal(addrs(got), sorted(want)) {
		t.Fatalf("after deletes eni holds %v, want %v", addrs(got), sorted(want))
	}
	if n := available(t, e, e.subnet); n != free0-4 {
		t.Fatalf("availableIp = %d, want %d", n, free0-4)
	}

	byInst, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{InstanceID: e.i128g})
	if err != nil || len(byInst) != 1 || byInst[0].ID != id {
		t.Fatalf("list by instance: %v %v", byInst, err)
	}

	if err := e.client.DetachENI(ctx, id, e.i128g); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.client.GetENI(ctx, id); got.Status != cloud.ENIStatusDetaching {
		t.Fatalf("after detach: %s, want detaching", got.Status)
	}
	e.clock.Step(2 * time.Second)
	if got, _ := e.client.GetENI(ctx, id); got.Status != cloud.ENIStatusAvailable || got.InstanceID != "" {
		t.Fatalf("after the detach delay: %s on %q", got.Status, got.InstanceID)
	}
	if err := e.client.DeleteENI(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.GetENI(ctx, id); !errors.Is(err, cloud.ErrENINotFound) {
		t.Fatalf("get deleted eni: %v", err)
	}
	if n := available(t, e, e.subnet); n != free0 {
		t.Fatalf("availableIp after delete = %d, want %d", n, free0)
	}
	if err := e.srv.Check(); err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, e.reg, "cce_ipam_cloud_api_calls_total", "operation", "BatchAddPrivateIP", "result", "ok"); v != 2 {
		t.Fatalf("calls_total{BatchAddPrivateIP,ok} = %v, want 2", v)
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func TestConformance_PaginationAcrossPages(t *testing.T) {
	e := newEnv(t, envOpts{sim: bcesim.Config{PageSize: 2}})
	ctx := context.Background()
	var mine []string
	for i := range 5 {
		mine = append(mine, createENI(t, e, fmt.Sprintf("c-1/i-x/node%d/00000%d", i, i), e.subnet))
	}
	createENI(t, e, "c-2/i-y/other/000000", e.subnet)  // another cluster's ENI
	createENI(t, e, "xc-1/i-z/other/000000", e.subnet) // contains "c-1/" but does not start with it

	before := e.srv.Stats().Ops[bcesim.OpListENIs].Calls
	got, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{
		VPCID:      testVPC,
		NamePrefix: "c-1/",
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range got {
		ids = append(ids, x.ID)
	}
	if !slices.Equal(sorted(ids), sorted(mine)) {
		t.Fatalf("listed %v, want %v", ids, mine)
	}
	if pages := e.srv.Stats().Ops[bcesim.OpListENIs].Calls - before; pages < 3 {
		t.Fatalf("list took %d pages, want >= 3", pages)
	}
	all, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{VPCID: testVPC})
	if err != nil || len(all) != 7 {
		t.Fatalf("list whole vpc: %d enis, %v", len(all), err)
	}
	byIP, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{PrivateIPs: []string{all[3].PrimaryIP()}})
	if err != nil || len(byIP) != 1 || byIP[0].ID != all[3].ID {
		t.Fatalf("list by address: %v %v", byIP, err)
	}

	for i := range 5 {
		if _, err := e.srv.AddSubnet(bcesim.SubnetSpec{
			ZoneName: testZone,
			CIDR:     fmt.Sprintf("10.1.%d.0/24", i),
			VPCID:    testVPC,
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.srv.AddSubnet(bcesim.SubnetSpec{
		ZoneName: testZone,
		CIDR:     "10.9.0.0/24",
		VPCID:    "vpc-other",
	}); err != nil {
		t.Fatal(err)
	}
	before = e.srv.Stats().Ops[bcesim.OpListSubnets].Calls
	subnets, err := e.client.ListSubnets(ctx, cloud.ListSubnetsOptions{VPCID: testVPC})
	if err != nil || len(subnets) != 7 {
		t.Fatalf("list subnets: %d, %v", len(subnets), err)
	}
	if pages := e.srv.Stats().Ops[bcesim.OpListSubnets].Calls - before; pages != 4 {
		t.Fatalf("subnet list took %d pages, want 4", pages)
	}
	for _, sn := range subnets {
		if sn.VPCID != testVPC || sn.ZoneName != testZone || sn.CIDR == "" || sn.AvailableIP <= 0 {
			t.Fatalf("subnet %+v", sn)
		}
	}
}

func TestConformance_DescribeSubnetAndInstance(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	sn, err := e.client.DescribeSubnet(ctx, e.small)
	// /28 = 16 addresses minus network, gateway and broadcast.
	if err != nil || sn.ID != e.small || sn.CIDR != "10.0.1.0/28" || sn.AvailableIP != 13 || sn.ZoneName != testZone ||
		sn.SubnetType != "BCC" {
		t.Fatalf("describe subnet: %+v %v", sn, err)
	}
	in, err := e.client.GetInstance(ctx, e.i4g)
	if err != nil || in.CPUCount != 2 || in.MemoryCapacityInGB != 4 || in.ENIQuota != 2 || in.VPCID != testVPC ||
		in.SubnetID != e.subnet || in.ZoneName != testZone || in.InternalIP == "" || in.Status != "Running" {
		t.Fatalf("get instance: %+v %v", in, err)
	}
}

// A 5xx after the mutation makes the SDK resend the identical request; the
// clientToken the client sends makes the simulator answer the retry from its
// idempotency cache instead of applying the change again.
func TestConformance_FailAfterMutationIsNotDoubleApplied(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	if err := e.srv.SetFaults(bcesim.Faults{FailAfterMutation: map[bcesim.Op]int{
		bcesim.OpCreateENI: 1, bcesim.OpBatchAddPrivateIP: 1, bcesim.OpAddPrivateIP: 1, bcesim.OpBatchDeletePrivateIP: 1,
	}}); err != nil {
		t.Fatal(err)
	}
	free0 := available(t, e, e.subnet)
	id := createENI(t, e, "c-1/i/n/aaaaaa", e.subnet)
	ips, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{Count: 3})
	if err != nil || len(ips) != 3 {
		t.Fatalf("batch add: %v %v", ips, err)
	}
	if _, err := e.client.AddPrivateIP(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	if err := e.client.BatchDeletePrivateIPs(ctx, id, ips[:2]); err != nil {
		t.Fatalf("batch delete retried after 5xx: %v", err)
	}
	dump := e.srv.Dump()
	if len(dump.ENIs) != 1 {
		t.Fatalf("%d enis exist, want 1 (create applied twice?)", len(dump.ENIs))
	}
	if n := len(dump.ENIs[0].PrivateIPSet); n != 1+3+1-2 {
		t.Fatalf("eni holds %d addresses, want 3", n)
	}
	if n := available(t, e, e.subnet); n != free0-3 {
		t.Fatalf("availableIp %d, want %d", n, free0-3)
	}
	st := e.srv.Stats().Ops
	for _, op := range []bcesim.Op{bcesim.OpCreateENI, bcesim.OpBatchAddPrivateIP, bcesim.OpAddPrivateIP, bcesim.OpBatchDeletePrivateIP} {
		if st[op].Calls != 2 {
			t.Errorf("%s reached the simulator %d times, want 2 (the 5xx and the SDK's retry)", op, st[op].Calls)
		}
	}
	if left := e.srv.Faults().FailAfterMutation; left[bcesim.OpCreateENI] != 0 {
		t.Fatalf("fault not consumed: %v", left)
	}
}

func TestConformance_ContextCancelsInFlightCall(t *testing.T) {
	e := newEnv(t, envOpts{})
	if err := e.srv.SetFaults(bcesim.Faults{LatencyMs: map[bcesim.Op]int{bcesim.OpGetInstance: 30_000}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := e.client.GetInstance(ctx, e.i4g)
	if cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a canceled error wrapping DeadlineExceeded, got %v", err)
	}
}

// A replica lists the VPC but keeps only its own instances' ENIs, plus the
// unattached ones (the leak sweep's), across pages.
func TestConformance_ListENIsKeepsOnlyTheGivenInstances(t *testing.T) {
	e := newEnv(t, envOpts{sim: bcesim.Config{PageSize: 2}})
	ctx := context.Background()
	other, err := e.srv.AddInstance(bcesim.InstanceSpec{
		ID:       "i-other",
		SubnetID: e.subnet,
		CPUCount: 16,
		MemoryGB: 128,
	})
	if err != nil {
		t.Fatal(err)
	}
	mine := createENI(t, e, "c-1/i-128g/node-a/000000", e.subnet)
	attach(t, e, mine, e.i128g)
	theirs := createENI(t, e, "c-1/i-other/node-b/000000", e.subnet)
	attach(t, e, theirs, other)
	loose := createENI(t, e, "c-1/i-gone/node-c/000000", e.subnet)
	e.clock.Step(5 * time.Second)

	got, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{
		VPCID:      testVPC,
		NamePrefix: "c-1/",
		Instances:  map[string]bool{e.i128g: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range got {
		ids = append(ids, x.ID)
		if x.ID == mine && (x.InstanceID != e.i128g || len(x.PrivateIPs) != 1) {
			t.Errorf("kept ENI converted wrongly: %+v", x)
		}
	}
	if want := []string{mine, loose}; !slices.Equal(sorted(ids), sorted(want)) {
		t.Fatalf("listed %v, want %v (ours and the unattached one, not %s)", ids, want, theirs)
	}
	none, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{
		VPCID:      testVPC,
		NamePrefix: "c-1/",
		Instances:  map[string]bool{},
	})
	if err != nil || len(none) != 1 || none[0].ID != loose {
		t.Fatalf("no instances: %v %v, want only the unattached %s", none, err, loose)
	}
	all, err := e.client.ListENIs(ctx, cloud.ListENIsOptions{
		VPCID:      testVPC,
		NamePrefix: "c-1/",
	})
	if err != nil || len(all) != 3 {
		t.Fatalf("nil Instances filters nothing: %d ENIs, %v", len(all), err)
	}
}

// Enterprise security groups travel through the SDK to BCE and back; a
// request with both kinds or neither is refused before it is sent.
func TestConformance_CreateENI_EnterpriseSecurityGroups(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	id, err := e.client.CreateENI(ctx, cloud.CreateENIRequest{Name: "c/i/n/esg001", SubnetID: e.subnet,
		EnterpriseSecurityGroupIDs: []string{"esg-abc"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.client.GetENI(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.EnterpriseSecurityGroupIDs, []string{"esg-abc"}) || len(got.SecurityGroupIDs) != 0 {
		t.Fatalf("ENI groups: enterprise %v, ordinary %v", got.EnterpriseSecurityGroupIDs, got.SecurityGroupIDs)
	}
	for name, req := range map[string]cloud.CreateENIRequest{
		"both":    {Name: "c/i/n/both01", SubnetID: e.subnet, SecurityGroupIDs: []string{e.sg}, EnterpriseSecurityGroupIDs: []string{"esg-abc"}},
		"neither": {Name: "c/i/n/none01", SubnetID: e.subnet},
	} {
		if _, err := e.client.CreateENI(ctx, req); !errors.Is(err, cloud.ErrInvalidRequest) {
			t.Errorf("%s: %v, want an invalid-request error", name, err)
		}
	}
}

// bce-sim's attach delay can be changed at run time: an ENI attached after
// the change reads attaching until the new delay has passed.
func TestConformance_SetAttachDelay(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	if err := e.srv.SetAttachDelay(50 * time.Second); err == nil {
		t.Fatal("a 50 s delay was accepted: the upstream polls for 50 s at most")
	}
	if err := e.srv.SetAttachDelay(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	id := createENI(t, e, "c/i/n/delay1", e.subnet)
	attach(t, e, id, e.i128g)
	var elapsed time.Duration
	for _, step := range []struct {
		after time.Duration
		want  cloud.ENIStatus
	}{{0, cloud.ENIStatusAttaching}, {2 * time.Second, cloud.ENIStatusAttaching}, {time.Second, cloud.ENIStatusInUse}} {
		elapsed += step.after
		e.clock.Step(step.after)
		got, err := e.client.GetENI(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != step.want {
			t.Fatalf("%s after the attach: %s, want %s", elapsed, got.Status, step.want)
		}
	}
}

// An ENI can be created holding auto-assigned secondary addresses beside its
// primary (CreateENI's privateIpSet); the attach then checks them against
// the instance's cap, and a count outside the bounds never reaches BCE.
func TestConformance_CreateENIWithSecondaryAddresses(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	free0 := available(t, e, e.subnet)
	id, err := e.client.CreateENI(ctx, cloud.CreateENIRequest{Name: "c-1/i-128g/node1/with05", SubnetID: e.subnet,
		SecurityGroupIDs: []string{e.sg}, SecondaryIPs: 5})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.client.GetENI(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	primaries := 0
	for _, ip := range got.PrivateIPs {
		if ip.Primary {
			primaries++
		}
	}
	if len(got.PrivateIPs) != 6 || primaries != 1 {
		t.Fatalf("eni created with 5 secondary addresses holds %v (%d primary)", addrs(got), primaries)
	}
	if n := available(t, e, e.subnet); n != free0-6 {
		t.Fatalf("availableIp after the create = %d, want %d", n, free0-6)
	}
	attach(t, e, id, e.i128g)

	for _, n := range []int{-1, cloud.MaxCreateSecondaryIPs + 1} {
		_, err := e.client.CreateENI(ctx, cloud.CreateENIRequest{Name: "c-1/i-128g/node1/badcnt", SubnetID: e.subnet,
			SecurityGroupIDs: []string{e.sg}, SecondaryIPs: n})
		if !errors.Is(err, cloud.ErrInvalidRequest) {
			t.Fatalf("%d secondary addresses: %v, want an invalid request", n, err)
		}
	}
	if c := e.srv.Stats().Ops[bcesim.OpCreateENI].Calls; c != 1 {
		t.Fatalf("bce-sim saw %d CreateENI calls, want 1 (the bad counts are refused before the call)", c)
	}
}
