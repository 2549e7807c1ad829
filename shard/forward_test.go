package shard

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cce-ipam/sharded/ipamcore/cni"
	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

func TestAuthenticator_SignVerify(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	a := NewAuthenticator(key)
	a.now = func() time.Time { return now }
	req := &rpc.AllocateIPRequest{K8SPodName: "web-0", K8SPodNamespace: "default", K8SPodInfraContainerID: "abc"}
	h := a.Sign(methodAllocate, req, "r1-aa")
	if from, err := a.Verify(methodAllocate, req, h); err != nil || from != "r1-aa" {
		t.Fatalf("verify own signature: %q, %v", from, err)
	}
	other := NewAuthenticator([]byte("another key, another cluster...."))
	other.now = a.now
	cases := map[string]func() (string, error){
		"other key":    func() (string, error) { return other.Verify(methodAllocate, req, h) },
		"other method": func() (string, error) { return a.Verify(methodRelease, req, h) },
		"other pod": func() (string, error) {
			return a.Verify(methodAllocate, &rpc.AllocateIPRequest{K8SPodName: "web-1", K8SPodNamespace: "default", K8SPodInfraContainerID: "abc"}, h)
		},
		"other sandbox": func() (string, error) {
			return a.Verify(methodAllocate, &rpc.AllocateIPRequest{K8SPodName: "web-0", K8SPodNamespace: "default", K8SPodInfraContainerID: "abd"}, h)
		},
		"other sender": func() (string, error) { return a.Verify(methodAllocate, req, "r2-bb"+h[strings.Index(h, ";"):]) },
		"malformed":    func() (string, error) { return a.Verify(methodAllocate, req, "nonsense") },
		"empty sender": func() (string, error) { return a.Verify(methodAllocate, req, h[strings.Index(h, ";"):]) },
		"stale": func() (string, error) {
			late := NewAuthenticator(key)
			late.now = func() time.Time { return now.Add(forwardSkew + time.Second) }
			return late.Verify(methodAllocate, req, h)
		},
	}
	for name, verify := range cases {
		if _, err := verify(); !errors.Is(err, ErrForgedForward) {
			t.Errorf("%s: got %v, want ErrForgedForward", name, err)
		}
	}
}

// FuzzVerify: any header, for any request, is an error or a verified sender;
// never a panic.
func FuzzVerify(f *testing.F) {
	a := NewAuthenticator([]byte("0123456789abcdef"))
	req := &rpc.AllocateIPRequest{K8SPodName: "p", K8SPodNamespace: "n", K8SPodInfraContainerID: "c"}
	f.Add(a.Sign(methodAllocate, req, "r0"), "p", "n", "c")
	f.Add(";;", "", "", "")
	f.Add("a;99999999999999999999;x", "p", "n", "c")
	f.Fuzz(func(t *testing.T, header, pod, ns, cid string) {
		r := &rpc.AllocateIPRequest{K8SPodName: pod, K8SPodNamespace: ns, K8SPodInfraContainerID: cid}
		from, err := a.Verify(methodAllocate, r, header)
		if err == nil && from == "" {
			t.Fatal("verified with an empty sender")
		}
	})
}

// A peer's refusal is retried because of its kind, marked in the trailer,
// never because of its text; the local refusals are retried by kind too.
func TestRetryable_ByKindNotText(t *testing.T) {
	notHere := metadata.Pairs(cni.RefusalTrailer, cni.RefusalNotHere)
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"peer refusal marked not-here":  {cni.RefusalError(notHere, "AllocateIP ns/p (abc): no replica serves node n yet"), true},
		"peer text without the trailer": {cni.RefusalError(nil, "AllocateIP ns/p (abc): not the owner of the node"), false},
		"peer failure":                  {cni.RefusalError(metadata.MD{}, "AllocateIP ns/p (abc): no idle IP on the node"), false},
		"not the owner here":            {fmt.Errorf("%w: partition 3 is draining here", ErrNotOwner), true},
		"node not served by the IPAM":   {fmt.Errorf("%w: n", ipam.ErrNodeNotServed), true},
		"fenced IPAM write":             {fmt.Errorf("commit: %w", ipam.ErrFenced), true},
		"owner unreachable":             {status.Error(codes.Unavailable, "connection refused"), true},
		"ordinary failure":              {errors.New("no idle IP on the node"), false},
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("%s: retryable(%v) = %v, want %v", name, tc.err, got, tc.want)
		}
	}
}

func TestTarget_SharesNeverExceedTheBudget(t *testing.T) {
	for _, global := range []Share{{Rate: 10, Burst: 5}, {Rate: 20, Burst: 10}, {Rate: 7, Burst: 3}, {Rate: 100, Burst: 1}} {
		for n := 1; n <= 9; n++ {
			var live []string
			for i := range n {
				live = append(live, string(rune('a'+i)))
			}
			var sum Share
			for _, m := range live {
				s := demandTarget(global, live, m, nil, true, 0) // all busy: the even split
				if s.Burst < 1 || s.Rate <= 0 {
					t.Fatalf("global %v, %d replicas: %s gets %v", global, n, m, s)
				}
				sum.Rate += s.Rate
				sum.Burst += s.Burst
			}
			if sum.Rate > global.Rate+1e-9 {
				t.Errorf("global %v, %d replicas: rates sum to %v", global, n, sum.Rate)
			}
			// Burst cannot go below one token each; within that, it never
			// exceeds the global burst.
			if sum.Burst > max(global.Burst, int64(n)) {
				t.Errorf("global %v, %d replicas: bursts sum to %d", global, n, sum.Burst)
			}
		}
	}
	if s := demandTarget(Share{Rate: 10, Burst: 5}, []string{"a", "b"}, "c", nil, true, 0); s != (Share{}) {
		t.Errorf("a replica outside the ring gets %v", s)
	}
}

// Demand-following: idle replicas keep what they use, the busy one gets the
// rest; the targets of any mix never sum above the budget once everyone has
// published its own.
func TestDemandTarget(t *testing.T) {
	global := Share{Rate: 30, Burst: 15}
	live := []string{"a", "b", "c"}
	// Nothing published yet: everyone counts as busy, even split.
	if s := demandTarget(global, live, "a", nil, true, 0); s.Rate != 10 {
		t.Fatalf("unpublished peers: %v, want 10/s", s)
	}
	// b and c idle, each holding 2.5/s (a quarter of fair): a gets 25.
	idle := map[string]Share{"b": {Rate: 2.5, Burst: 1}, "c": {Rate: 2.5, Burst: 1}}
	if s := demandTarget(global, live, "a", idle, true, 0); s.Rate != 25 {
		t.Fatalf("busy among idle peers: %v, want 25/s", s)
	}
	// An idle replica keeps twice its use, clamped to [fair/4, fair].
	for need, want := range map[float64]float64{0: 2.5, 4: 4, 50: 10} {
		if s := demandTarget(global, live, "b", nil, false, need); s.Rate != want {
			t.Errorf("idle with need %v: %v, want %v", need, s.Rate, want)
		}
	}
	// b turns busy: a and b split what c leaves.
	pub := map[string]Share{"a": {Rate: 25, Burst: 12, Busy: true}, "b": {Rate: 2.5, Burst: 1, Busy: true}, "c": {Rate: 2.5, Burst: 1}}
	sa := demandTarget(global, live, "a", pub, true, 0)
	sb := demandTarget(global, live, "b", pub, true, 0)
	sc := demandTarget(global, live, "c", pub, false, 1)
	if sa.Rate != 13.75 || sb.Rate != 13.75 {
		t.Fatalf("two busy, one idle: a %v b %v, want 13.75 each", sa, sb)
	}
	if sum := sa.Rate + sb.Rate + sc.Rate; sum > global.Rate+1e-9 {
		t.Fatalf("targets sum to %v above %v", sum, global.Rate)
	}
	if s := demandTarget(global, live, "z", pub, true, 0); s != (Share{}) {
		t.Errorf("a replica outside the ring gets %v", s)
	}
}
