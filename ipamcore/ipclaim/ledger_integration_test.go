//go:build integration

package ipclaim_test

import (
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/ipclaim"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

var (
	web0 = ipclaim.Holder{Namespace: "ns", Name: "web-0"}
	web1 = ipclaim.Holder{Namespace: "ns", Name: "web-1"}
	web2 = ipclaim.Holder{Namespace: "ns", Name: "web-2"}
)

// Reserve creates, finds its own, refuses another's; Free only by the
// holder; a freed address cools, then is taken over by compare-and-swap.
func TestLedger_Reserve_Free_Cooling(t *testing.T) {
	ctx := setup(t)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	r := newReplica(ctx, t, "a", ipclaim.DefaultConfig(), clk)
	addr := netip.MustParseAddr("10.1.0.5")
	at := ipclaim.Attachment{Node: "n1", ENIID: "eni-1", PSTS: "psts-a"}

	if err := r.ledger.Reserve(ctx, "sbn-1", addr, web0, at); err != nil {
		t.Fatalf("first Reserve: %v", err)
	}
	c := getClaim(ctx, t, "10.1.0.5")
	if holderOf(c) != "ns/web-0" || c.Spec.IP != "10.1.0.5" || c.Spec.SubnetID != "sbn-1" ||
		c.Labels[cce.LabelSubnetID] != "sbn-1" || c.Spec.Node != "n1" || c.Spec.ENIID != "eni-1" || c.Spec.PSTS != "psts-a" ||
		c.Spec.ReservedAt == nil || c.Spec.ReleasedAt != nil {
		t.Fatalf("claim after Reserve: %s", describe(c))
	}
	rv := c.ResourceVersion

	// The holder again (a retried ADD): no write.
	if err := r.ledger.Reserve(ctx, "sbn-1", addr, web0, at); err != nil {
		t.Fatalf("Reserve by the holder: %v", err)
	}
	if c := getClaim(ctx, t, "10.1.0.5"); c.ResourceVersion != rv {
		t.Errorf("a Reserve by the holder with nothing changed wrote the claim: %s", describe(c))
	}
	// Another pod: taken, and the error says by whom.
	err := r.ledger.Reserve(ctx, "sbn-1", addr, web1, at)
	if !errors.Is(err, ipclaim.ErrTaken) || !strings.Contains(err.Error(), "ns/web-0") {
		t.Fatalf("Reserve by another pod = %v, want ErrTaken naming ns/web-0", err)
	}
	// The holder on another node (a Fixed pod moved): the attachment follows.
	if err := r.ledger.Reserve(ctx, "sbn-1", addr, web0, ipclaim.Attachment{Node: "n2", ENIID: "eni-2", PSTS: "psts-a"}); err != nil {
		t.Fatalf("Reserve by the holder from another node: %v", err)
	}
	if c := getClaim(ctx, t, "10.1.0.5"); c.Spec.Node != "n2" || c.Spec.ENIID != "eni-2" || holderOf(c) != "ns/web-0" {
		t.Errorf("claim after the move: %s", describe(c))
	}

	// Free by another pod: left alone.
	if err := r.ledger.Free(ctx, addr, web1); err != nil {
		t.Fatalf("Free by another pod: %v", err)
	}
	if c := getClaim(ctx, t, "10.1.0.5"); holderOf(c) != "ns/web-0" {
		t.Fatalf("Free by another pod changed the claim: %s", describe(c))
	}
	// Free by the holder.
	if err := r.ledger.Free(ctx, addr, web0); err != nil {
		t.Fatalf("Free: %v", err)
	}
	c = getClaim(ctx, t, "10.1.0.5")
	if holderOf(c) != "<free>" || c.Spec.ReleasedAt == nil || c.Spec.ReleasedAt.Time.Before(clk.Now().Truncate(time.Second)) {
		t.Fatalf("claim after Free: %s", describe(c))
	}
	if err := r.ledger.Free(ctx, addr, web0); err != nil {
		t.Fatalf("a second Free: %v", err)
	}

	// Cooling: nobody, not even the last holder, for 5 s.
	for _, h := range []ipclaim.Holder{web1, web0} {
		err := r.ledger.Reserve(ctx, "sbn-1", addr, h, at)
		if !errors.Is(err, ipclaim.ErrTaken) || !strings.Contains(err.Error(), "cooling") {
			t.Fatalf("Reserve by %s while cooling = %v, want ErrTaken (cooling)", h, err)
		}
	}
	clk.SetTime(clk.Now().Add(6 * time.Second))
	if err := r.ledger.Reserve(ctx, "sbn-1", addr, web1, at); err != nil {
		t.Fatalf("Reserve after the cooling: %v", err)
	}
	if c := getClaim(ctx, t, "10.1.0.5"); holderOf(c) != "ns/web-1" || c.Spec.ReleasedAt != nil {
		t.Fatalf("claim after the takeover: %s", describe(c))
	}
	for result, want := range map[string]float64{"created": 1, "held": 2, "taken": 3, "reused": 1} {
		if got := metric(t, r.reg, "cce_ipam_ipclaim_reserves_total", "result", result); got != want {
			t.Errorf("reserves{result=%s} = %v, want %v", result, got, want)
		}
	}
	if got := metric(t, r.reg, "cce_ipam_ipclaim_frees_total", "kind", "free"); got != 1 {
		t.Errorf("frees{kind=free} = %v, want 1 (the no-op Frees are not counted)", got)
	}
	// Absent claims: Free and Block leave them alone.
	if err := r.ledger.Free(ctx, netip.MustParseAddr("10.1.0.99"), web0); err != nil {
		t.Errorf("Free of an absent claim: %v", err)
	}
	if err := r.ledger.Block(ctx, netip.MustParseAddr("10.1.0.99"), web0); err != nil {
		t.Errorf("Block of an absent claim: %v", err)
	}
	if c := getClaim(ctx, t, "10.1.0.99"); c != nil {
		t.Errorf("Free or Block created a claim: %s", describe(c))
	}
}

// A replica whose cache lags still decides right: a cached "held" is
// checked live (the address was freed meanwhile: taken over); a cached
// "free" that is not any more loses the compare-and-swap; a cached "held
// by this very pod" is checked live too (the pod freed it through another
// replica: it is cooling, not the pod's).
func TestLedger_Reserve_StaleCache(t *testing.T) {
	ctx := setup(t)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	fresh := newReplica(ctx, t, "fresh", ipclaim.DefaultConfig(), clk)
	stale := newReplica(ctx, t, "stale", ipclaim.DefaultConfig(), clk)
	heldThenFreed, freeThenHeld := netip.MustParseAddr("10.2.0.5"), netip.MustParseAddr("10.2.0.6")
	mineThenFreed := netip.MustParseAddr("10.2.0.7")
	for _, a := range []netip.Addr{heldThenFreed, freeThenHeld, mineThenFreed} {
		if err := fresh.ledger.Reserve(ctx, "sbn-2", a, web0, ipclaim.Attachment{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fresh.ledger.Free(ctx, freeThenHeld, web0); err != nil {
		t.Fatal(err)
	}
	waitCached(ctx, t, stale, "10.2.0.5", func(c *cce.IPClaim) bool { return holderOf(c) == "ns/web-0" })
	waitCached(ctx, t, stale, "10.2.0.6", func(c *cce.IPClaim) bool { return holderOf(c) == "<free>" })
	waitCached(ctx, t, stale, "10.2.0.7", func(c *cce.IPClaim) bool { return holderOf(c) == "ns/web-0" })
	stale.freeze()

	if err := fresh.ledger.Free(ctx, mineThenFreed, web0); err != nil {
		t.Fatal(err)
	}
	err := stale.ledger.Reserve(ctx, "sbn-2", mineThenFreed, web0, ipclaim.Attachment{})
	if !errors.Is(err, ipclaim.ErrTaken) || !strings.Contains(err.Error(), "cooling") {
		t.Fatalf("Reserve by the pod of an address the stale cache shows the pod's, freed since = %v, want ErrTaken (cooling)", err)
	}
	if c := getClaim(ctx, t, "10.2.0.7"); holderOf(c) != "<free>" {
		t.Errorf("claim: %s", describe(c))
	}
	if err := fresh.ledger.Free(ctx, heldThenFreed, web0); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(6 * time.Second))
	if err := fresh.ledger.Reserve(ctx, "sbn-2", freeThenHeld, web1, ipclaim.Attachment{}); err != nil {
		t.Fatal(err)
	}

	if err := stale.ledger.Reserve(ctx, "sbn-2", heldThenFreed, web2, ipclaim.Attachment{}); err != nil {
		t.Fatalf("Reserve of an address the stale cache shows held, freed since: %v", err)
	}
	if c := getClaim(ctx, t, "10.2.0.5"); holderOf(c) != "ns/web-2" {
		t.Errorf("claim: %s", describe(c))
	}
	err = stale.ledger.Reserve(ctx, "sbn-2", freeThenHeld, web2, ipclaim.Attachment{})
	if !errors.Is(err, ipclaim.ErrTaken) || !strings.Contains(err.Error(), "ns/web-1") {
		t.Fatalf("Reserve of an address the stale cache shows free, held since = %v, want ErrTaken naming ns/web-1", err)
	}
	if c := getClaim(ctx, t, "10.2.0.6"); holderOf(c) != "ns/web-1" {
		t.Errorf("the lost compare-and-swap changed the claim: %s", describe(c))
	}
	// Free from the stale replica: its cache has no idea; the live read does.
	if err := stale.ledger.Free(ctx, heldThenFreed, web2); err != nil {
		t.Fatal(err)
	}
	if c := getClaim(ctx, t, "10.2.0.5"); holderOf(c) != "<free>" {
		t.Errorf("Free through a stale cache: %s", describe(c))
	}
}

// Many pods of three replicas race for the same free claims: exactly one
// wins each.
func TestLedger_Reserve_OneWinnerPerRace(t *testing.T) {
	ctx := setup(t)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	var replicas []*replica
	for _, name := range []string{"a", "b", "c"} {
		replicas = append(replicas, newReplica(ctx, t, name, ipclaim.DefaultConfig(), clk))
	}
	// Free claims past their cooling, and absent ones: both kinds of race
	// (Update and Create).
	var addrs []netip.Addr
	for i := range 20 {
		a := netip.AddrFrom4([4]byte{10, 3, 0, byte(10 + i)})
		addrs = append(addrs, a)
		if i%2 == 0 {
			if err := replicas[0].ledger.Reserve(ctx, "sbn-3", a, web0, ipclaim.Attachment{}); err != nil {
				t.Fatal(err)
			}
			if err := replicas[0].ledger.Free(ctx, a, web0); err != nil {
				t.Fatal(err)
			}
		}
	}
	clk.SetTime(clk.Now().Add(10 * time.Second))
	for _, a := range addrs {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []string
		)
		for i := range 9 {
			h := ipclaim.Holder{Namespace: "ns", Name: "racer-" + string(rune('a'+i))}
			wg.Go(func() {
				err := replicas[i%3].ledger.Reserve(ctx, "sbn-3", a, h, ipclaim.Attachment{})
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, h.String())
					mu.Unlock()
				case !errors.Is(err, ipclaim.ErrTaken):
					t.Errorf("%s: %v", a, err)
				}
			})
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("%s: %d winners %v, want 1", a, len(winners), winners)
		}
		if got := holderOf(getClaim(ctx, t, a.String())); got != winners[0] {
			t.Errorf("%s: the claim is held by %s, the winner was %s", a, got, winners[0])
		}
	}
}

// Block keeps everyone off an address for the in-use backoff; a Reserve by
// the last holder after half the orphan grace refreshes reservedAt.
func TestLedger_Block_And_Refresh(t *testing.T) {
	ctx := setup(t)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	r := newReplica(ctx, t, "a", ipclaim.DefaultConfig(), clk)
	addr := netip.MustParseAddr("10.4.0.5")
	if err := r.ledger.Reserve(ctx, "sbn-4", addr, web0, ipclaim.Attachment{}); err != nil {
		t.Fatal(err)
	}
	if err := r.ledger.Block(ctx, addr, web0); err != nil {
		t.Fatal(err)
	}
	c := getClaim(ctx, t, "10.4.0.5")
	if holderOf(c) != "<free>" || c.Spec.NotBefore == nil || c.Spec.NotBefore.Sub(clk.Now()) < 59*time.Second {
		t.Fatalf("claim after Block: %s", describe(c))
	}
	clk.SetTime(clk.Now().Add(30 * time.Second)) // past the cooling, not the block
	err := r.ledger.Reserve(ctx, "sbn-4", addr, web1, ipclaim.Attachment{})
	if !errors.Is(err, ipclaim.ErrTaken) || !strings.Contains(err.Error(), "blocked") {
		t.Fatalf("Reserve of a blocked address = %v, want ErrTaken (blocked)", err)
	}
	_, err = r.ledger.Pick(ctx, "sbn-4", []psts.Range{{First: addr, Last: addr}}, nil, web1, ipclaim.Attachment{})
	if !errors.Is(err, ipclaim.ErrExhausted) {
		t.Fatalf("Pick of only a blocked address = %v, want ErrExhausted", err)
	}
	clk.SetTime(clk.Now().Add(31 * time.Second))
	if err := r.ledger.Reserve(ctx, "sbn-4", addr, web1, ipclaim.Attachment{}); err != nil {
		t.Fatalf("Reserve after the block: %v", err)
	}
	reserved := getClaim(ctx, t, "10.4.0.5").Spec.ReservedAt

	clk.SetTime(clk.Now().Add(30 * time.Second)) // a quarter of the grace: nothing written
	if err := r.ledger.Reserve(ctx, "sbn-4", addr, web1, ipclaim.Attachment{}); err != nil {
		t.Fatal(err)
	}
	if got := getClaim(ctx, t, "10.4.0.5").Spec.ReservedAt; !got.Equal(reserved) {
		t.Errorf("reservedAt moved from %s to %s after a quarter of the grace", reserved, got)
	}
	clk.SetTime(clk.Now().Add(31 * time.Second)) // past half the grace
	if err := r.ledger.Reserve(ctx, "sbn-4", addr, web1, ipclaim.Attachment{}); err != nil {
		t.Fatal(err)
	}
	if got := getClaim(ctx, t, "10.4.0.5").Spec.ReservedAt; got.Sub(reserved.Time) < 60*time.Second {
		t.Errorf("reservedAt %s not refreshed (was %s)", got, reserved)
	}
	if got := metric(t, r.reg, "cce_ipam_ipclaim_frees_total", "kind", "block"); got != 1 {
		t.Errorf("frees{kind=block} = %v, want 1", got)
	}
}

// Corrupt claims (a spec.ip that is not the name's, a holder without a
// name) are never taken, never panic, and say why.
func TestLedger_CorruptClaims_AreNotTaken(t *testing.T) {
	ctx := setup(t)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	r := newReplica(ctx, t, "a", ipclaim.DefaultConfig(), clk)
	for _, c := range corruptClaims() {
		if _, err := admin().CceV1alpha1().IPClaims().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitCached(ctx, t, r, "10.5.0.6", func(c *cce.IPClaim) bool { return c != nil })
	for _, a := range []string{"10.5.0.5", "10.5.0.6"} {
		err := r.ledger.Reserve(ctx, "sbn-5", netip.MustParseAddr(a), web0, ipclaim.Attachment{})
		if !errors.Is(err, ipclaim.ErrTaken) || !strings.Contains(err.Error(), "corrupt") {
			t.Errorf("Reserve of the corrupt claim of %s = %v, want ErrTaken (corrupt)", a, err)
		}
	}
	got, err := r.ledger.Pick(ctx, "sbn-5", []psts.Range{{First: netip.MustParseAddr("10.5.0.5"), Last: netip.MustParseAddr("10.5.0.7")}},
		nil, web0, ipclaim.Attachment{})
	if err != nil || got.String() != "10.5.0.7" {
		t.Fatalf("Pick next to corrupt claims = %s, %v; want 10.5.0.7", got, err)
	}
	for _, a := range []string{"10.5.0.5", "10.5.0.6"} {
		if err := r.ledger.Free(ctx, netip.MustParseAddr(a), web0); err != nil {
			t.Errorf("Free of a corrupt claim: %v", err)
		}
	}
}

// corruptClaims are three claims nobody may trust: spec.ip is another
// address, the holder has no name, and a name that is no address.
func corruptClaims() []*cce.IPClaim {
	return []*cce.IPClaim{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "10.5.0.5", Labels: map[string]string{cce.LabelSubnetID: "sbn-5"}},
			Spec:       cce.IPClaimSpec{SubnetID: "sbn-5", IP: "10.5.0.55"},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "10.5.0.6", Labels: map[string]string{cce.LabelSubnetID: "sbn-5"}},
			Spec:       cce.IPClaimSpec{SubnetID: "sbn-5", IP: "10.5.0.6", Holder: &cce.IPClaimHolder{Namespace: "ns"}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "not-an-address", Labels: map[string]string{cce.LabelSubnetID: "sbn-5"}},
			Spec:       cce.IPClaimSpec{SubnetID: "sbn-5", IP: "bogus"},
		},
	}
}
