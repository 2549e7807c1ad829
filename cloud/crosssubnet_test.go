package cloud_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// crossCalls is how many cross-subnet adds reached bce-sim.
func crossCalls(e *env) int64 { return e.srv.Stats().Ops[bcesim.OpBatchAddPrivateIPCrossSubnet].Calls }

// An ENI of one subnet gets addresses of another, by count and explicitly:
// they come from the subnet asked for (its availableIp drops, the ENI's own
// subnet's does not), sit on the ENI, and are released like any other.
func TestCrossSubnet_CountAndExplicit(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	id := createENI(t, e, "n", e.subnet)
	attach(t, e, id, e.i128g)
	main0, small0 := available(t, e, e.subnet), available(t, e, e.small)
	smallCIDR := netip.MustParsePrefix("10.0.1.0/28")

	counted, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 3})
	if err != nil || len(counted) != 3 {
		t.Fatalf("count 3 from %s: %v %v", e.small, counted, err)
	}
	for _, a := range counted {
		if !smallCIDR.Contains(netip.MustParseAddr(a)) {
			t.Fatalf("counted address %s is not in %s (%s)", a, e.small, smallCIDR)
		}
	}
	explicit, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, cloud.CrossSubnetAddRequest{SubnetID: e.small,
		IPs: []string{"10.0.1.12", "10.0.1.13"}})
	if err != nil || !slices.Equal(explicit, []string{"10.0.1.12", "10.0.1.13"}) {
		t.Fatalf("explicit addresses of %s: %v %v", e.small, explicit, err)
	}
	if n := available(t, e, e.small); n != small0-5 {
		t.Fatalf("availableIp of %s = %d, want %d", e.small, n, small0-5)
	}
	if n := available(t, e, e.subnet); n != main0 {
		t.Fatalf("availableIp of the ENI's own subnet = %d, want %d (unchanged)", n, main0)
	}
	got, err := e.client.GetENI(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{got.PrimaryIP()}, counted...)
	want = append(want, explicit...)
	if !slices.Equal(addrs(got), sorted(want)) {
		t.Fatalf("eni holds %v, want %v", addrs(got), sorted(want))
	}

	if err := e.client.DeletePrivateIP(ctx, id, explicit[0]); err != nil {
		t.Fatal(err)
	}
	if err := e.client.BatchDeletePrivateIPs(ctx, id, counted); err != nil {
		t.Fatal(err)
	}
	if n := available(t, e, e.small); n != small0-1 {
		t.Fatalf("availableIp of %s after the releases = %d, want %d", e.small, n, small0-1)
	}
	if v := metricValue(t, e.reg, "cce_ipam_cloud_api_calls_total", "operation", "BatchAddPrivateIPCrossSubnet", "result", "ok"); v != 2 {
		t.Fatalf("calls_total{BatchAddPrivateIPCrossSubnet,ok} = %v, want 2", v)
	}
	if err := e.srv.Check(); err != nil {
		t.Fatal(err)
	}
}

// Each failure BCE reports for a cross-subnet add is classified by its code,
// and matches the sentinel the allocator branches on. Nothing is allocated
// by a failed call.
func TestCrossSubnet_ErrorClasses(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		sim      bcesim.Config
		provoke  func(t *testing.T, e *env, eniID string) error
		class    cloud.Class
		sentinel error
		code     string
	}{
		{
			name: "no more IP in that subnet",
			provoke: func(t *testing.T, e *env, eniID string) error {
				// 13 usable addresses in the small subnet.
				for _, n := range []int{10, 3} {
					if _, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: n}); err != nil {
						t.Fatal(err)
					}
				}
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1})
				if n := available(t, e, e.subnet); n == 0 {
					t.Fatalf("the ENI's own subnet is exhausted too; the case proves nothing")
				}
				return err
			},
			class: cloud.ClassSubnetHasNoMoreIP, sentinel: cloud.ErrSubnetHasNoMoreIP, code: bcesim.CodeSubnetNoMoreIP,
		},
		{
			name: "address in use by another ENI",
			provoke: func(t *testing.T, e *env, eniID string) error {
				other := createENI(t, e, "other", e.small)
				got, err := e.client.GetENI(ctx, other)
				if err != nil {
					t.Fatal(err)
				}
				_, err = e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: e.small,
					IPs: []string{got.PrimaryIP()}})
				return err
			},
			class: cloud.ClassPrivateIPInUse, sentinel: cloud.ErrPrivateIPInUse, code: bcesim.CodePrivateIPInUse,
		},
		{
			name: "address already on the ENI",
			provoke: func(t *testing.T, e *env, eniID string) error {
				req := cloud.CrossSubnetAddRequest{SubnetID: e.small, IPs: []string{"10.0.1.7"}}
				if _, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, req); err != nil {
					t.Fatal(err)
				}
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, req)
				return err
			},
			class: cloud.ClassPrivateIPInUse, sentinel: cloud.ErrPrivateIPInUse, code: bcesim.CodePrivateIPInUse,
		},
		{
			name: "address outside the subnet",
			provoke: func(t *testing.T, e *env, eniID string) error {
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: e.small,
					IPs: []string{"10.0.0.77"}})
				return err
			},
			class: cloud.ClassInvalidRequest, sentinel: cloud.ErrInvalidRequest, code: bcesim.CodeIPOutsideSubnet,
		},
		{
			name: "unknown subnet",
			provoke: func(t *testing.T, e *env, eniID string) error {
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: "sbn-none", Count: 1})
				return err
			},
			class: cloud.ClassNotFound, sentinel: cloud.ErrNotFound, code: bcesim.CodeNoSuchObject,
		},
		{
			name: "subnet of another zone",
			provoke: func(t *testing.T, e *env, eniID string) error {
				far, err := e.srv.AddSubnet(bcesim.SubnetSpec{
					ID:       "sbn-far",
					ZoneName: "cn-bj-b",
					CIDR:     "10.0.2.0/24",
					VPCID:    testVPC,
				})
				if err != nil {
					t.Fatal(err)
				}
				_, err = e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: far, Count: 1})
				return err
			},
			class: cloud.ClassInvalidRequest, sentinel: cloud.ErrInvalidRequest, code: bcesim.CodeVPCMismatch,
		},
		{
			name: "unknown ENI",
			provoke: func(t *testing.T, e *env, _ string) error {
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, "eni-none", cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1})
				return err
			},
			class: cloud.ClassENINotFound, sentinel: cloud.ErrENINotFound, code: bcesim.CodeEniID,
		},
		{
			name: "VM memory cannot attach more IP",
			provoke: func(t *testing.T, e *env, _ string) error {
				id := createENI(t, e, "small-vm", e.subnet)
				attach(t, e, id, e.i4g) // 4 GB: 8 addresses per ENI, primary included
				if _, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{Count: 7}); err != nil {
					t.Fatal(err)
				}
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1})
				return err
			},
			class: cloud.ClassVMMemoryCannotAttachMoreIP, sentinel: cloud.ErrVMMemoryCannotAttachMoreIP, code: bcesim.CodeVMMemoryIPCap,
		},
		{
			name: "IPv6, which bce-sim does not simulate",
			provoke: func(t *testing.T, e *env, eniID string) error {
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1, IPv6: true})
				return err
			},
			class: cloud.ClassInvalidRequest, sentinel: cloud.ErrInvalidRequest, code: bcesim.CodeInvalidParameter,
		},
		{
			name: "rate limit",
			sim: bcesim.Config{RateLimits: map[bcesim.Op]bcesim.RateLimit{bcesim.OpBatchAddPrivateIPCrossSubnet: {
				QPS:   0.001,
				Burst: 1,
			}}},
			provoke: func(t *testing.T, e *env, eniID string) error {
				if _, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1}); err != nil {
					t.Fatal(err)
				}
				_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, eniID, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1})
				if n := metricValue(t, e.reg, "cce_ipam_cloud_api_throttled_total", "operation", "BatchAddPrivateIPCrossSubnet"); n != 2 {
					t.Errorf("throttled_total = %v, want 2 (first try and one retry)", n)
				}
				return err
			},
			class: cloud.ClassRateLimit, sentinel: cloud.ErrRateLimit, code: bcesim.CodeRateLimit,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{sim: tc.sim, client: cloud.Config{ThrottleRetries: 1}})
			eniID := createENI(t, e, "n", e.subnet)
			attach(t, e, eniID, e.i128g)
			err := tc.provoke(t, e, eniID)
			var ce *cloud.Error
			if !errors.As(err, &ce) {
				t.Fatalf("want *cloud.Error, got %T %v", err, err)
			}
			if ce.Class != tc.class || !errors.Is(err, tc.sentinel) || ce.Code != tc.code || ce.Op != "BatchAddPrivateIPCrossSubnet" {
				t.Fatalf("got %s class %v code %q (%v); want class %v code %q", ce.Op, ce.Class, ce.Code, err, tc.class, tc.code)
			}
			if err := e.srv.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// What BCE would refuse for its form is refused before a token is spent or
// a request sent.
func TestCrossSubnet_RefusedBeforeCalling(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	id := createENI(t, e, "n", e.subnet)
	eleven := make([]string, 11)
	for i := range eleven {
		eleven[i] = netip.AddrFrom4([4]byte{10, 0, 1, byte(2 + i)}).String()
	}
	taken0, _ := e.client.Usage()
	for name, req := range map[string]cloud.CrossSubnetAddRequest{
		"no subnet":               {Count: 1},
		"malformed subnet":        {SubnetID: "sbn/../x", Count: 1},
		"neither count nor IPs":   {SubnetID: e.small},
		"count and IPs":           {SubnetID: e.small, Count: 1, IPs: []string{"10.0.1.5"}},
		"negative count":          {SubnetID: e.small, Count: -1},
		"eleven by count":         {SubnetID: e.small, Count: 11},
		"eleven explicit":         {SubnetID: e.small, IPs: eleven},
		"malformed address":       {SubnetID: e.small, IPs: []string{"10.0.1.5/32"}},
		"IPv6 address as IPv4":    {SubnetID: e.small, IPs: []string{"2400:da00::5"}},
		"IPv4 address as IPv6":    {SubnetID: e.small, IPs: []string{"10.0.1.5"}, IPv6: true},
		"IPv4-mapped IPv6":        {SubnetID: e.small, IPs: []string{"::ffff:10.0.1.5"}},
		"address with a zone":     {SubnetID: e.small, IPs: []string{"fe80::1%eth0"}, IPv6: true},
		"empty explicit addresss": {SubnetID: e.small, IPs: []string{""}},
	} {
		_, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, req)
		if cloud.ClassOf(err) != cloud.ClassInvalidRequest || !errors.Is(err, cloud.ErrInvalidRequest) {
			t.Errorf("%s: %v, want class InvalidRequest", name, err)
		}
	}
	if n := crossCalls(e); n != 0 {
		t.Fatalf("refused requests reached BCE %d times", n)
	}
	if taken, _ := e.client.Usage(); taken != taken0 {
		t.Fatalf("refused requests took %d tokens", taken-taken0)
	}
}

// A 5xx is retried like a batch add's: after one applied the change, the
// retry carries the same clientToken and is answered from bce-sim's cache,
// so the addresses are added once; a 5xx that persists is given up after
// SDKRetries retries, each its own request.
func TestCrossSubnet_ServerErrorsRetried(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{SDKRetries: 2, SDKRetryBase: time.Millisecond}})
	ctx := context.Background()
	id := createENI(t, e, "n", e.subnet)
	small0 := available(t, e, e.small)
	if err := e.srv.SetFaults(bcesim.Faults{FailAfterMutation: map[bcesim.Op]int{bcesim.OpBatchAddPrivateIPCrossSubnet: 1}}); err != nil {
		t.Fatal(err)
	}
	ips, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 2})
	if err != nil || len(ips) != 2 {
		t.Fatalf("cross-subnet add after a 5xx that applied it: %v %v", ips, err)
	}
	if n := crossCalls(e); n != 2 {
		t.Fatalf("the add reached BCE %d times, want 2 (the 5xx and the retry)", n)
	}
	if n := available(t, e, e.small); n != small0-2 {
		t.Fatalf("availableIp of %s = %d, want %d: the retry applied the add again", e.small, n, small0-2)
	}
	got, _ := e.client.GetENI(ctx, id)
	if len(got.PrivateIPs) != 3 {
		t.Fatalf("eni holds %v, want the primary and the 2 addresses", addrs(got))
	}

	if err := e.srv.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpBatchAddPrivateIPCrossSubnet: 1}}); err != nil {
		t.Fatal(err)
	}
	before := crossCalls(e)
	_, err = e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, cloud.CrossSubnetAddRequest{SubnetID: e.small, IPs: []string{"10.0.1.13"}})
	if cloud.ClassOf(err) != cloud.ClassServer || !cloud.ClassOf(err).Retryable() {
		t.Fatalf("under a 5xx storm: %v, want a retryable server error", err)
	}
	if n := crossCalls(e) - before; n != 3 {
		t.Fatalf("a failing add was sent %d times, want 3 (the call and SDKRetries=2 retries)", n)
	}
	if err := e.srv.Check(); err != nil {
		t.Fatal(err)
	}
}

// A closed gate or a refused node permission sends nothing, and a gate that
// closes after the first attempt stops the retries.
func TestCrossSubnet_GateAndFence(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{SDKRetries: 3, SDKRetryBase: time.Millisecond}})
	ctx := context.Background()
	id := createENI(t, e, "n", e.subnet)
	req := cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1}

	fenced := errors.New("lease at risk")
	e.setGate(func() error { return fenced })
	if _, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, req); cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, fenced) {
		t.Fatalf("behind a closed gate: %v, want Canceled wrapping the gate's reason", err)
	}
	e.setGate(nil)
	notOwner := func() (time.Time, error) { return time.Time{}, errors.New("not the owner") }
	_, err := e.client.BatchAddPrivateIPsCrossSubnet(cloud.ForNode(ctx, "node-a", notOwner), id, req)
	if cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, cloud.ErrFenced) {
		t.Fatalf("for a node no longer ours: %v, want Canceled matching ErrFenced", err)
	}
	if n := crossCalls(e); n != 0 {
		t.Fatalf("refused calls reached BCE %d times", n)
	}

	if err := e.srv.SetFaults(bcesim.Faults{ErrorRate: map[bcesim.Op]float64{bcesim.OpBatchAddPrivateIPCrossSubnet: 1}}); err != nil {
		t.Fatal(err)
	}
	e.setGate(func() error {
		if crossCalls(e) > 0 {
			return fenced // closes once the first attempt reached BCE
		}
		return nil
	})
	_, err = e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, req)
	if n := crossCalls(e); n != 1 || !errors.Is(err, fenced) {
		t.Fatalf("the gate closed after the first attempt: %d requests, err %v; want 1 and the gate's reason", n, err)
	}
	e.setGate(nil)
	if n := available(t, e, e.small); n != 13 {
		t.Fatalf("availableIp of %s = %d, want 13: a refused or failed add allocated", e.small, n)
	}
}

// The cross-subnet add has its own per-operation limit, in the default table
// like the batch add's, and waits for its token like any call.
func TestCrossSubnet_OpLimit(t *testing.T) {
	if l, ok := cloud.DefaultOpLimits()["BatchAddPrivateIPCrossSubnet"]; !ok || l != cloud.DefaultOpLimits()["BatchAddPrivateIP"] {
		t.Fatalf("default limit of the cross-subnet add = %+v (present %v), want the batch add's", l, ok)
	}
	e := newEnv(t, envOpts{client: cloud.Config{Rate: 100, Burst: 50,
		OpLimits: map[string]cloud.OpLimit{"BatchAddPrivateIPCrossSubnet": {
			Rate:  0.01,
			Burst: 1,
		}}}})
	ctx := context.Background()
	id := createENI(t, e, "n", e.subnet)
	req := cloud.CrossSubnetAddRequest{SubnetID: e.small, Count: 1}
	if _, err := e.client.BatchAddPrivateIPsCrossSubnet(ctx, id, req); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := e.client.BatchAddPrivateIPsCrossSubnet(short, id, req); cloud.ClassOf(err) != cloud.ClassCanceled {
		t.Fatalf("second add with its bucket empty: %v, want it cut short waiting for its token", err)
	}
	if _, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{Count: 1}); err != nil {
		t.Fatalf("the batch add waited on the cross-subnet add's bucket: %v", err)
	}
	if n := crossCalls(e); n != 1 {
		t.Fatalf("%d cross-subnet adds reached BCE, want 1", n)
	}
}
