package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestGet_DistinctAndBindable(t *testing.T) {
	ports := MustGet(t, 20)
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d returned twice in %v", p, ports)
		}
		seen[p] = true
		addr := "127.0.0.1:" + strconv.Itoa(p)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("port %d is not free for TCP: %v", p, err)
		}
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("port %d is not free for UDP: %v", p, err)
		}
		_ = l.Close()
		_ = u.Close()
	}
}

func TestAddr_Loopback(t *testing.T) {
	host, _, err := net.SplitHostPort(Addr(t))
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr host %q (%v), want 127.0.0.1", host, err)
	}
}
