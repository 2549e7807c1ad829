// Package freeport picks free ports on 127.0.0.1 for the processes and
// listeners that tests, benchmarks and the demo start.
//
// A port is free when the kernel hands it out for TCP and it can also be bound
// for UDP (memberlist gossips on both at the same number). The listeners are
// held until all n ports are chosen, so no port repeats within one call, and
// closed before returning: another process may still take a port before its
// user binds it, which callers that start binaries handle by retrying.
//
//	ports, err := freeport.Get(3)      // library code
//	ports := freeport.MustGet(t, 3)     // tests
//	addr := freeport.Addr(t)            // "127.0.0.1:<port>"
package freeport

import (
	"fmt"
	"net"
	"strconv"
	"testing"
)

// Get returns n distinct ports on 127.0.0.1 that are free for TCP and UDP.
func Get(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var closers []func() error
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		closers = append(closers, l.Close)
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // the UDP port is taken: keep the TCP one held and try another
		}
		closers = append(closers, u.Close)
		ports = append(ports, port)
	}
	return ports, nil
}

// MustGet is Get for tests: it fails t instead of returning an error.
func MustGet(t testing.TB, n int) []int {
	t.Helper()
	ports, err := Get(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// Addr returns "127.0.0.1:<port>" for one free port, or fails t.
func Addr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(MustGet(t, 1)[0])
}
