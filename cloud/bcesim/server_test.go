package bcesim_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/baidubce/bce-sdk-go/bce"
	"github.com/baidubce/bce-sdk-go/services/bcc/api"
	"github.com/baidubce/bce-sdk-go/services/eni"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

func svcErr(t *testing.T, err error) *bce.BceServiceError {
	t.Helper()
	var se *bce.BceServiceError
	if !errors.As(err, &se) {
		t.Fatalf("want a BceServiceError, got %T %v", err, err)
	}
	return se
}

func createENI(t *testing.T, c *sdk, w *world, name string) string {
	t.Helper()
	res, err := c.eni.CreateEni(&eni.CreateEniArgs{Name: name, SubnetId: w.subnet, SecurityGroupIds: []string{w.sg},
		PrivateIpSet: []eni.PrivateIp{{Primary: true}}})
	if err != nil {
		t.Fatalf("create eni: %v", err)
	}
	return res.EniId
}

func TestServer_SDKLifecycle(t *testing.T) {
	// The simulator takes its clock as a func() time.Time (Config.Now).
	clock := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC))
	w := startWorld(t, bcesim.Config{
		Now:   clock.Now,
		World: bcesim.WorldConfig{AttachDelay: 3 * time.Second},
	})
	c := newSDK(t, w.url, testAK, testSK)

	id := createENI(t, c, w, "c-abc/i-small/node1/abcdef")
	got, err := c.eni.GetEniDetail(id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "available" || got.InstanceId != "" || len(got.PrivateIpSet) != 1 || !got.PrivateIpSet[0].Primary {
		t.Fatalf("new eni = %+v", got)
	}
	if _, err := time.Parse(time.RFC3339, got.CreatedTime); err != nil {
		t.Fatalf("createdTime %q: %v", got.CreatedTime, err)
	}
	inst := w.small
	if err := c.eni.AttachEniInstance(&eni.EniInstance{
		EniId:      id,
		InstanceId: &inst,
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.eni.GetEniDetail(id); got.Status != "attaching" || got.InstanceId != inst {
		t.Fatalf("after attach: status %q instance %q, want attaching on %s", got.Status, got.InstanceId, inst)
	}
	clock.Step(3 * time.Second)
	if got, _ := c.eni.GetEniDetail(id); got.Status != "inuse" {
		t.Fatalf("after the attach delay: status %q, want inuse", got.Status)
	}
	// 4 GB memory: 8 addresses per ENI including the primary.
	res, err := c.eni.BatchAddPrivateIp(&eni.EniBatchPrivateIpArgs{
		EniId:                 id,
		PrivateIpAddressCount: 7,
	})
	if err != nil || len(res.PrivateIpAddresses) != 7 {
		t.Fatalf("batch add 7: %v %v", res, err)
	}
	_, err = c.eni.AddPrivateIp(&eni.EniPrivateIpArgs{EniId: id})
	if se := svcErr(t, err); se.Code != bcesim.CodeVMMemoryIPCap || se.StatusCode != http.StatusBadRequest {
		t.Fatalf("add past the memory cap: %v", se)
	}
	if err := c.eni.DeletePrivateIp(&eni.EniPrivateIpArgs{
		EniId:            id,
		PrivateIpAddress: res.PrivateIpAddresses[0],
	}); err != nil {
		t.Fatal(err)
	}
	err = c.eni.DeletePrivateIp(&eni.EniPrivateIpArgs{
		EniId:            id,
		PrivateIpAddress: res.PrivateIpAddresses[0],
	})
	if se := svcErr(t, err); se.Code != bcesim.CodePrivateIPNotExist {
		t.Fatalf("delete twice: %v", se)
	}
	if err := w.srv.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestServer_BadSignatureAndUnknownKey(t *testing.T) {
	w := startWorld(t, bcesim.Config{})
	_, err := newSDK(t, w.url, testAK, "wrong-secret").eni.GetEniDetail("eni-x")
	if se := svcErr(t, err); se.Code != bcesim.CodeSignatureMismatch || se.StatusCode != http.StatusBadRequest {
		t.Fatalf("wrong secret: %v", se)
	}
	_, err = newSDK(t, w.url, "other-ak", testSK).eni.GetEniDetail("eni-x")
	if se := svcErr(t, err); se.Code != bcesim.CodeInvalidAccessKeyID || se.StatusCode != http.StatusForbidden {
		t.Fatalf("unknown key: %v", se)
	}
	// The right key reaches the world: a missing ENI, not an auth error.
	_, err = newSDK(t, w.url, testAK, testSK).eni.GetEniDetail("eni-x")
	if se := svcErr(t, err); se.Code != bcesim.CodeEniID {
		t.Fatalf("good key: %v", se)
	}
}

func TestServer_RateLimitAnswers429(t *testing.T) {
	w := startWorld(t, bcesim.Config{RateLimits: map[bcesim.Op]bcesim.RateLimit{bcesim.OpGetInstance: {
		QPS:   0.001,
		Burst: 1,
	}}})
	c := newSDK(t, w.url, testAK, testSK)
	if _, err := c.bcc.GetInstanceDetail(w.small); err != nil {
		t.Fatal(err)
	}
	_, err := c.bcc.GetInstanceDetail(w.small)
	if se := svcErr(t, err); se.Code != bcesim.CodeRateLimit || se.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second call: %v", se)
	}
	st := w.srv.Stats().Ops[bcesim.OpGetInstance]
	if st.Calls != 2 || st.Throttled != 1 {
		t.Fatalf("stats = %+v, want 2 calls, 1 throttled", st)
	}
}

// Without a clientToken, a 5xx after the mutation makes the SDK's retry apply
// it again: the leak the fault exists to produce.
func TestServer_FailAfterMutationWithoutTokenDoubleApplies(t *testing.T) {
	w := startWorld(t, bcesim.Config{})
	c := newSDK(t, w.url, testAK, testSK)
	id := createENI(t, c, w, "n")
	if err := w.srv.SetFaults(bcesim.Faults{FailAfterMutation: map[bcesim.Op]int{bcesim.OpBatchAddPrivateIP: 1}}); err != nil {
		t.Fatal(err)
	}
	res, err := c.eni.BatchAddPrivateIp(&eni.EniBatchPrivateIpArgs{
		EniId:                 id,
		PrivateIpAddressCount: 2,
	})
	if err != nil || len(res.PrivateIpAddresses) != 2 {
		t.Fatalf("batch add: %v %v", res, err)
	}
	got, _ := c.eni.GetEniDetail(id)
	if len(got.PrivateIpSet) != 1+4 {
		t.Fatalf("eni holds %d addresses, want 5 (primary + 2 applied twice)", len(got.PrivateIpSet))
	}
}

// The calls the IPAM does not use through cloud.Provider but the upstream
// (or its node agent) does: security groups, quota, status, cross-subnet add.
func TestServer_SDKSecondaryCalls(t *testing.T) {
	w := startWorld(t, bcesim.Config{PageSize: 1})
	c := newSDK(t, w.url, testAK, testSK)
	if _, err := w.srv.AddSecurityGroup(bcesim.SecurityGroupSpec{
		ID:    "g-second",
		VPCID: testVPC,
	}); err != nil {
		t.Fatal(err)
	}
	sgs, err := c.bcc.ListSecurityGroup(&api.ListSecurityGroupArgs{InstanceId: w.small})
	if err != nil || len(sgs.SecurityGroups) != 1 || sgs.SecurityGroups[0].Id != w.sg || sgs.IsTruncated {
		t.Fatalf("security groups of %s: %+v %v", w.small, sgs, err)
	}
	page, err := c.bcc.ListSecurityGroup(&api.ListSecurityGroupArgs{VpcId: testVPC})
	if err != nil || len(page.SecurityGroups) != 1 || !page.IsTruncated || page.NextMarker == "" {
		t.Fatalf("first page of vpc groups: %+v %v", page, err)
	}

	id := createENI(t, c, w, "n")
	inst := w.small
	if err := c.eni.AttachEniInstance(&eni.EniInstance{
		EniId:      id,
		InstanceId: &inst,
	}); err != nil {
		t.Fatal(err)
	}
	q, err := c.eni.GetEniQuota(&eni.EniQuoteArgs{InstanceId: w.small})
	if err != nil || q.TotalQuantity != 2 || q.AvailableQuantity != 1 {
		t.Fatalf("eni quota of a 2-vCPU instance with one eni: %+v %v", q, err)
	}
	q, err = c.eni.GetEniQuota(&eni.EniQuoteArgs{EniId: id})
	if err != nil || q.TotalQuantity != 8 || q.AvailableQuantity != 7 {
		t.Fatalf("address quota of an eni on 4 GB: %+v %v", q, err)
	}
	st, err := c.eni.GetEniStatus(id)
	if err != nil || (st.Status != "attaching" && st.Status != "inuse") {
		t.Fatalf("status: %+v %v", st, err)
	}
	res, err := c.eni.BatchAddPrivateIpCrossSubnet(&eni.EniBatchAddPrivateIpCrossSubnetArgs{
		EniId:                 id,
		SubnetId:              w.subnet2,
		PrivateIpAddressCount: 2,
	})
	if err != nil || len(res.PrivateIpAddresses) != 2 {
		t.Fatalf("cross-subnet add: %+v %v", res, err)
	}
	sn2, _ := c.vpc.GetSubnetDetail(w.subnet2)
	if sn2.Subnet.AvailableIp != 13-2 {
		t.Fatalf("subnet2 availableIp %d, want 11", sn2.Subnet.AvailableIp)
	}
	res, err = c.eni.BatchAddPrivateIpCrossSubnet(&eni.EniBatchAddPrivateIpCrossSubnetArgs{EniId: id,
		PrivateIps: []eni.PrivateIpArgs{{
			PrivateIpAddress: "10.0.1.9",
			SubnetId:         w.subnet2,
		}}})
	if err != nil || len(res.PrivateIpAddresses) != 1 || res.PrivateIpAddresses[0] != "10.0.1.9" {
		t.Fatalf("explicit cross-subnet add: %+v %v", res, err)
	}
	if err := w.srv.Check(); err != nil {
		t.Fatal(err)
	}
}

// The cross-subnet add refuses what names no address or no subnet, and its
// errors are BCE's: subnet exhausted, address taken, address outside the
// subnet, unknown subnet; nothing is allocated by a refused call.
func TestServer_CrossSubnetAddRefusals(t *testing.T) {
	w := startWorld(t, bcesim.Config{})
	c := newSDK(t, w.url, testAK, testSK)
	id := createENI(t, c, w, "n")
	other := createENI(t, c, w, "o")
	add := func(args eni.EniBatchAddPrivateIpCrossSubnetArgs) (*eni.BatchAddPrivateIpResult, error) {
		args.EniId = id
		return c.eni.BatchAddPrivateIpCrossSubnet(&args)
	}
	free := func() int {
		sn, err := c.vpc.GetSubnetDetail(w.subnet2)
		if err != nil {
			t.Fatal(err)
		}
		return sn.Subnet.AvailableIp
	}
	free0 := free()
	for _, tc := range []struct {
		name string
		args eni.EniBatchAddPrivateIpCrossSubnetArgs
		code string
	}{
		{"count without a subnet", eni.EniBatchAddPrivateIpCrossSubnetArgs{PrivateIpAddressCount: 1}, bcesim.CodeInvalidParameter},
		{"count and addresses", eni.EniBatchAddPrivateIpCrossSubnetArgs{SubnetId: w.subnet2, PrivateIpAddressCount: 1,
			PrivateIps: []eni.PrivateIpArgs{{PrivateIpAddress: "10.0.1.5", SubnetId: w.subnet2}}}, bcesim.CodeInvalidParameter},
		{"an entry without an address", eni.EniBatchAddPrivateIpCrossSubnetArgs{
			PrivateIps: []eni.PrivateIpArgs{{SubnetId: w.subnet2}}}, bcesim.CodeInvalidParameter},
		{"neither", eni.EniBatchAddPrivateIpCrossSubnetArgs{SubnetId: w.subnet2}, bcesim.CodeInvalidParameter},
		{"eleven", eni.EniBatchAddPrivateIpCrossSubnetArgs{SubnetId: w.subnet2, PrivateIpAddressCount: 11}, bcesim.CodeInvalidParameter},
		{"ipv6", eni.EniBatchAddPrivateIpCrossSubnetArgs{SubnetId: w.subnet2, PrivateIpAddressCount: 1, IsIpv6: true}, bcesim.CodeInvalidParameter},
		{"unknown subnet", eni.EniBatchAddPrivateIpCrossSubnetArgs{SubnetId: "sbn-none", PrivateIpAddressCount: 1}, bcesim.CodeNoSuchObject},
		{"address outside the subnet", eni.EniBatchAddPrivateIpCrossSubnetArgs{
			PrivateIps: []eni.PrivateIpArgs{{PrivateIpAddress: "10.0.0.50", SubnetId: w.subnet2}}}, bcesim.CodeIPOutsideSubnet},
		{"the subnet's gateway", eni.EniBatchAddPrivateIpCrossSubnetArgs{
			PrivateIps: []eni.PrivateIpArgs{{PrivateIpAddress: "10.0.1.1", SubnetId: w.subnet2}}}, bcesim.CodePrivateIPInUse},
		{"one free, one outside: neither taken", eni.EniBatchAddPrivateIpCrossSubnetArgs{PrivateIps: []eni.PrivateIpArgs{
			{PrivateIpAddress: "10.0.1.5", SubnetId: w.subnet2},
			{PrivateIpAddress: "10.0.1.99", SubnetId: w.subnet2},
		}}, bcesim.CodeIPOutsideSubnet},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := add(tc.args)
			if err == nil {
				t.Fatalf("accepted: %v", res.PrivateIpAddresses)
			}
			if se := svcErr(t, err); se.Code != tc.code {
				t.Fatalf("code %q (%v), want %q", se.Code, se, tc.code)
			}
			if n := free(); n != free0 {
				t.Fatalf("availableIp of %s is %d after a refused call, want %d", w.subnet2, n, free0)
			}
		})
	}

	// An address another ENI took across subnets is in use; the subnet
	// running out is reported as such, for the subnet asked for.
	if _, err := c.eni.BatchAddPrivateIpCrossSubnet(&eni.EniBatchAddPrivateIpCrossSubnetArgs{EniId: other,
		PrivateIps: []eni.PrivateIpArgs{{
			PrivateIpAddress: "10.0.1.5",
			SubnetId:         w.subnet2,
		}}}); err != nil {
		t.Fatal(err)
	}
	_, err := add(eni.EniBatchAddPrivateIpCrossSubnetArgs{PrivateIps: []eni.PrivateIpArgs{{PrivateIpAddress: "10.0.1.5", SubnetId: w.subnet2}}})
	if se := svcErr(t, err); se.Code != bcesim.CodePrivateIPInUse {
		t.Fatalf("address of another eni: %v", se)
	}
	for left := free0 - 1; left > 0; left -= min(left, bcesim.MaxBatchIPs) {
		if _, err := add(eni.EniBatchAddPrivateIpCrossSubnetArgs{SubnetId: w.subnet2, PrivateIpAddressCount: min(left, bcesim.MaxBatchIPs)}); err != nil {
			t.Fatalf("the rest of %s: %v", w.subnet2, err)
		}
	}
	if n := free(); n != 0 {
		t.Fatalf("availableIp of %s is %d, want 0", w.subnet2, n)
	}
	_, err = add(eni.EniBatchAddPrivateIpCrossSubnetArgs{SubnetId: w.subnet2, PrivateIpAddressCount: 1})
	if se := svcErr(t, err); se.Code != bcesim.CodeSubnetNoMoreIP || !strings.Contains(se.Message, w.subnet2) {
		t.Fatalf("add from an exhausted subnet: %v", se)
	}
	if err := w.srv.Check(); err != nil {
		t.Fatal(err)
	}
}
