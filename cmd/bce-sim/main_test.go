package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestRun_ServesPrintsAddressAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--credential", "ak:sk", "--subnet", "sbn-1,cn-bj-a,10.0.0.0/24",
			"--instance", "i-1,sbn-1,4,16", "--instances", "3", "--instance-subnet", "sbn-1", "--rate-limit", "ListENIs=0:0", "--replica-lag", "250ms", "--error-rate", "0.5"}, outW, &logs)
		outW.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	addr, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("no address printed: %v (logs: %s)", err, logs.String())
	}
	go func() { _, _ = io.Copy(io.Discard, outR) }() // drain until the process exits
	resp, err := http.Get("http://" + strings.TrimSpace(addr) + "/admin/world")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d bcesim.WorldDump
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	if len(d.Subnets) != 1 || len(d.Instances) != 4 || d.Subnets[0].AvailableIP != 256-3-4 {
		t.Fatalf("world = %d subnets, %d instances, availableIp %d", len(d.Subnets), len(d.Instances), d.Subnets[0].AvailableIP)
	}
	var f bcesim.Faults
	resp3, err := http.Get("http://" + strings.TrimSpace(addr) + "/admin/faults")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp3.Body).Decode(&f)
	resp3.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if f.ReplicaLagMs != 250 || f.ErrorRate["*"] != 0.5 {
		t.Fatalf("faults from flags = %+v", f)
	}
	resp2, err := http.Get("http://" + strings.TrimSpace(addr) + "/admin/ratelimits")
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	var rl map[string]bcesim.RateLimit
	if err := json.NewDecoder(resp2.Body).Decode(&rl); err != nil {
		t.Fatal(err)
	}
	if _, limited := rl["ListENIs"]; limited || rl["DeleteENI"].QPS != 1 {
		t.Fatalf("rate limits = %v: want defaults with ListENIs lifted", rl)
	}
}

func TestRun_RejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "127.0.0.1:0"}, // no credentials
		{"--credential", "nocolon"},
		{"--credential", "a:b", "--subnet", "sbn-1,zone"},
		{"--credential", "a:b", "--instance", "i-1,sbn-none,2,4"},
		{"--credential", "a:b", "--rate-limit", "ListENIs=fast"},
		{"--credential", "a:b", "--rate-limit", "NoSuchOp=1:1"},
		{"--credential", "a:b", "--page-size", "5000"},
		{"--credential", "a:b", "--log-format", "xml"},
		{"--credential", "a:b", "--error-rate", "1.5"},
		{"--credential", "a:b", "--replica-lag", "-1s"},
		{"--no-such-flag"},
		{"--gateway-token", "with space"},
	} {
		var out, logs syncBuffer
		if err := run(context.Background(), args, &out, &logs); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// --gateway-token alone makes a simulator that only the CCE gateway's
// requests reach.
func TestRun_GatewayOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	var logs syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--gateway-token", "tok", "--gateway-remote-host", "bcc.bj.baidubce.com",
			"--subnet", "sbn-1,cn-bj-a,10.0.0.0/24"}, outW, &logs)
		outW.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	addr, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("no address printed: %v (logs: %s)", err, logs.String())
	}
	go func() { _, _ = io.Copy(io.Discard, outR) }()
	get := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+strings.TrimSpace(addr)+"/v1/subnet/sbn-1", nil)
		req.Header.Set("cce-token", token)
		req.Header.Set("cce-cluster", "cce-1")
		req.Header.Set("cce-remote-host", "bcc.bj.baidubce.com")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get("tok"); st != http.StatusOK {
		t.Fatalf("right token: %d", st)
	}
	if st := get("other"); st != http.StatusForbidden {
		t.Fatalf("wrong token: %d", st)
	}
}
