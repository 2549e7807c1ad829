package ipclaim

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func mt(t time.Time) *metav1.Time { return &metav1.Time{Time: t} }

// claimOf is a sound claim of addr, free; change it in the test.
func claimOf(addr string) *cce.IPClaim {
	a := netip.MustParseAddr(addr)
	return &cce.IPClaim{
		ObjectMeta: metav1.ObjectMeta{Name: cce.ClaimName(a)},
		Spec:       cce.IPClaimSpec{SubnetID: "sbn-x", IP: a.String()},
	}
}

func TestStateAt(t *testing.T) {
	const cooling = 5 * time.Second
	held := claimOf("10.0.0.5")
	held.Spec.Holder = &cce.IPClaimHolder{Namespace: "ns", Name: "web-0"}
	heldPastBlock := held.DeepCopy()
	heldPastBlock.Spec.NotBefore = mt(t0.Add(time.Hour)) // a holder is a holder, whatever else is written
	never := claimOf("10.0.0.5")
	cooled := claimOf("10.0.0.5")
	cooled.Spec.ReleasedAt = mt(t0.Add(-cooling))
	cool := claimOf("10.0.0.5")
	cool.Spec.ReleasedAt = mt(t0.Add(-cooling + time.Second))
	blocked := claimOf("10.0.0.5")
	blocked.Spec.ReleasedAt = mt(t0.Add(-time.Hour))
	blocked.Spec.NotBefore = mt(t0.Add(time.Minute))
	blockedShort := claimOf("10.0.0.5") // a block that ends before the cooling: cooling decides
	blockedShort.Spec.ReleasedAt = mt(t0)
	blockedShort.Spec.NotBefore = mt(t0.Add(time.Second))
	unblocked := blocked.DeepCopy()
	unblocked.Spec.NotBefore = mt(t0)
	badIP := claimOf("10.0.0.5")
	badIP.Spec.IP = "10.0.0.6"
	noIP := claimOf("10.0.0.5")
	noIP.Spec.IP = ""
	badName := claimOf("10.0.0.5")
	badName.Name = "web-0"
	halfHolder := held.DeepCopy()
	halfHolder.Spec.Holder.Namespace = ""
	for name, tc := range map[string]struct {
		c     *cce.IPClaim
		want  state
		until time.Time
	}{
		"held":                         {held, stateHeld, time.Time{}},
		"held, notBefore ignored":      {heldPastBlock, stateHeld, time.Time{}},
		"free, never released":         {never, stateFree, time.Time{}},
		"free, cooling just over":      {cooled, stateFree, time.Time{}},
		"cooling":                      {cool, stateCooling, t0.Add(time.Second)},
		"blocked":                      {blocked, stateBlocked, t0.Add(time.Minute)},
		"block shorter than cooling":   {blockedShort, stateCooling, t0.Add(cooling)},
		"block over":                   {unblocked, stateFree, time.Time{}},
		"spec.ip not the name's":       {badIP, stateCorrupt, time.Time{}},
		"no spec.ip":                   {noIP, stateCorrupt, time.Time{}},
		"name not an address":          {badName, stateCorrupt, time.Time{}},
		"holder without its namespace": {halfHolder, stateCorrupt, time.Time{}},
	} {
		s, until := stateAt(tc.c, t0, cooling)
		if s != tc.want || !until.Equal(tc.until) {
			t.Errorf("%s: stateAt = %s until %s, want %s until %s", name, s, until, tc.want, tc.until)
		}
		if (s == stateCorrupt) != (Problem(tc.c) != "") {
			t.Errorf("%s: state %s but Problem %q", name, s, Problem(tc.c))
		}
	}
}

func TestProblem_SaysWhatIsWrong(t *testing.T) {
	c := claimOf("fd00::1")
	if p := Problem(c); p != "" {
		t.Fatalf("a sound IPv6 claim: %q", p)
	}
	c.Spec.IP = "fd00::2"
	if p := Problem(c); !strings.Contains(p, "fd00::2") || !strings.Contains(p, "fd00::1") {
		t.Errorf("Problem = %q, want both addresses named", p)
	}
	c.Spec.IP = "not-an-ip"
	if p := Problem(c); !strings.Contains(p, "not-an-ip") {
		t.Errorf("Problem = %q, want the bad value named", p)
	}
	mapped := claimOf("10.0.0.5")
	mapped.Spec.IP = "::ffff:10.0.0.5" // the same address
	if p := Problem(mapped); p != "" {
		t.Errorf("an IPv4-mapped spec.ip of the same address: %q", p)
	}
}

func TestStamp_RoundsUpToTheSecond(t *testing.T) {
	for _, tc := range []struct{ in, want time.Time }{
		{t0, t0},
		{t0.Add(time.Nanosecond), t0.Add(time.Second)},
		{t0.Add(999 * time.Millisecond), t0.Add(time.Second)},
	} {
		if got := stamp(tc.in).Time; !got.Equal(tc.want) {
			t.Errorf("stamp(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestNeedsRefresh(t *testing.T) {
	const grace = 2 * time.Minute
	at := Attachment{Node: "n1", ENIID: "eni-1", PSTS: "p"}
	c := newClaim("sbn-x", netip.MustParseAddr("10.0.0.5"), Holder{"ns", "web-0"}, at, t0)
	for name, tc := range map[string]struct {
		subnet string
		at     Attachment
		now    time.Time
		want   bool
	}{
		"same, just reserved":      {"sbn-x", at, t0.Add(10 * time.Second), false},
		"same, half the grace":     {"sbn-x", at, t0.Add(grace / 2), true},
		"another node":             {"sbn-x", Attachment{Node: "n2", ENIID: "eni-1", PSTS: "p"}, t0, true},
		"another ENI":              {"sbn-x", Attachment{Node: "n1", ENIID: "eni-2", PSTS: "p"}, t0, true},
		"another subnet (relabel)": {"sbn-y", at, t0, true},
	} {
		if got := needsRefresh(c, tc.subnet, tc.at, tc.now, grace); got != tc.want {
			t.Errorf("%s: needsRefresh = %v, want %v", name, got, tc.want)
		}
	}
}

func TestReleaseUpdate(t *testing.T) {
	h, other := Holder{"ns", "web-0"}, Holder{"ns", "web-1"}
	held := newClaim("sbn-x", netip.MustParseAddr("10.0.0.5"), h, Attachment{Node: "n1"}, t0)
	now := t0.Add(1500 * time.Millisecond)

	u := releaseUpdate(held, h, now, false, time.Minute)
	if u == nil || u.Spec.Holder != nil || !u.Spec.ReleasedAt.Equal(mt(t0.Add(2*time.Second))) || u.Spec.NotBefore != nil {
		t.Fatalf("Free by the holder: %+v", u)
	}
	if u.Spec.Node != "n1" || u.Spec.IP != "10.0.0.5" || u.Labels[cce.LabelSubnetID] != "sbn-x" {
		t.Errorf("Free lost the last holder's attachment or the address: %+v", u)
	}
	if held.Spec.Holder == nil {
		t.Fatal("releaseUpdate changed its argument")
	}
	if u := releaseUpdate(held, other, now, true, time.Minute); u != nil {
		t.Errorf("Block by another pod changed the claim: %+v", u.Spec)
	}
	if u := releaseUpdate(nil, h, now, true, time.Minute); u != nil {
		t.Errorf("an absent claim: %+v", u)
	}
	b := releaseUpdate(held, h, now, true, time.Minute)
	if b == nil || b.Spec.Holder != nil || !b.Spec.NotBefore.Equal(mt(t0.Add(62*time.Second))) {
		t.Fatalf("Block by the holder: %+v", b)
	}
	if u := releaseUpdate(b, h, now, false, time.Minute); u != nil {
		t.Errorf("Free of a free claim wrote: %+v", u.Spec)
	}
	if u := releaseUpdate(b, h, now, true, time.Minute); u != nil {
		t.Errorf("Block of a claim already blocked as long wrote: %+v", u.Spec)
	}
	later := releaseUpdate(b, other, now.Add(30*time.Second), true, time.Minute)
	if later == nil || !later.Spec.NotBefore.Equal(mt(t0.Add(92*time.Second))) || later.Spec.Holder != nil {
		t.Errorf("Block of a free claim by anyone extends its block: %+v", later)
	}
}
