package shard

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// A signed ReleaseIP cannot be replayed as a fixed-IP move, nor a move's
// address or ENI changed: the MAC covers the move under its own method name
// and the sandbox field that carries them.
func TestMove_SignatureBindsMethodAndAddress(t *testing.T) {
	a := NewAuthenticator([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	a.now = func() time.Time { return now }
	move := &rpc.ReleaseIPRequest{K8SPodName: "db-0", K8SPodNamespace: "ns", K8SPodInfraContainerID: "move:10.0.0.7@eni-a",
		K8SNodeName: "n1"}
	h := mustSign(t, a, methodMove, move, "r1")
	if from, err := a.Verify(methodMove, move, h); err != nil || from != "r1" {
		t.Fatalf("verify a move: %q, %v", from, err)
	}
	release := mustSign(t, a, methodRelease, move, "r1")
	if _, err := a.Verify(methodMove, move, release); !errors.Is(err, ErrForgedForward) {
		t.Errorf("a ReleaseIP signature verified as a move: %v", err)
	}
	other := &rpc.ReleaseIPRequest{K8SPodName: "db-0", K8SPodNamespace: "ns", K8SPodInfraContainerID: "move:10.0.0.8@eni-a",
		K8SNodeName: "n1"}
	if _, err := a.Verify(methodMove, other, h); !errors.Is(err, ErrForgedForward) {
		t.Errorf("a move's signature verified for another address: %v", err)
	}
}

func TestParseMove(t *testing.T) {
	addr, eni, err := parseMove("move:10.0.0.7@eni-a")
	if err != nil || addr != netip.MustParseAddr("10.0.0.7") || eni != "eni-a" {
		t.Fatalf("parseMove = %v %q %v", addr, eni, err)
	}
	for _, bad := range []string{"", "sandbox-1", "move:", "move:10.0.0.7", "move:10.0.0.7@", "move:@eni-a", "move:x@eni-a",
		"move:10.0.0.256@eni-a"} {
		if _, _, err := parseMove(bad); err == nil {
			t.Errorf("parseMove(%q) accepted", bad)
		}
	}
}

// FuzzParseMove: any sandbox field is a move or an error, never a panic.
func FuzzParseMove(f *testing.F) {
	f.Add("move:10.0.0.7@eni-a")
	f.Add("move:@")
	f.Fuzz(func(t *testing.T, field string) {
		addr, eni, err := parseMove(field)
		if err == nil && (!addr.IsValid() || eni == "") {
			t.Fatalf("parseMove(%q) = %v %q without error", field, addr, eni)
		}
	})
}
