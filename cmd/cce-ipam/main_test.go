package main

import (
	"bytes"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cce-ipam/sharded/shard"
)

// client-go shares one HTTP/2 connection among configs with the same TLS
// settings (a plain copy does); ownConnection's clients dial their own.
func TestOwnConnection_DialsItsOwnConnection(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	base := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}}

	call := func(cfg *rest.Config) {
		t.Helper()
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.Discovery().ServerVersion(); err != nil {
			t.Fatal(err)
		}
	}
	call(base)
	call(rest.CopyConfig(base))
	if n := conns.Load(); n != 1 {
		t.Fatalf("two clients of copied configs opened %d connections; the premise (a shared connection) no longer holds", n)
	}
	call(ownConnection(base))
	if n := conns.Load(); n != 2 {
		t.Fatalf("after a client of ownConnection: %d connections, want 2", n)
	}
}

// The API server repeats a warning on every request it applies to; the log
// gets each distinct one once, and the memory of them stays bounded.
func TestWarnOnce_LogsEachWarningOnce(t *testing.T) {
	var buf bytes.Buffer
	w := &warnOnce{log: slog.New(slog.NewJSONHandler(&buf, nil))}
	for range 3 {
		w.HandleWarningHeader(299, "-", `metadata.finalizers: "cce-cni.cce.io": prefer a domain-qualified finalizer name`)
	}
	w.HandleWarningHeader(299, "-", "another warning")
	w.HandleWarningHeader(199, "-", "not a warning code")
	w.HandleWarningHeader(299, "-", "")
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("%d lines logged, want 2 (one per distinct warning):\n%s", n, buf.String())
	}
	for i := range warnOnceMax + 10 {
		w.HandleWarningHeader(299, "-", fmt.Sprint("w", i))
	}
	if len(w.seen) > warnOnceMax {
		t.Fatalf("%d warnings remembered, bound is %d", len(w.seen), warnOnceMax)
	}
}

// The forward key is its own file; without one it is derived from the gossip
// key (never the gossip key's bytes), with a warning; with neither, none.
func TestForwardKey_OwnFileElseDerivedFromGossip(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, key []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gossip := bytes.Repeat([]byte{1}, 32)
	forward := bytes.Repeat([]byte{2}, 32)
	gossipFile, forwardFile := write("gossip", gossip), write("forward", forward)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	var o options
	o.members.GossipKeyFile, o.shard.ForwardKeyFile = gossipFile, forwardFile
	if k, err := forwardKey(o, log); err != nil || !bytes.Equal(k, forward) {
		t.Fatalf("with a forward key file: %x, %v", k, err)
	}
	if logs.Len() != 0 {
		t.Errorf("a warning with a forward key file: %s", logs.String())
	}
	o.shard.ForwardKeyFile = ""
	k, err := forwardKey(o, log)
	if err != nil || len(k) != 32 || bytes.Equal(k, gossip) || !bytes.Equal(k, shard.ForwardKeyFromGossipKey(gossip)) {
		t.Fatalf("from the gossip key: %x, %v", k, err)
	}
	if !strings.Contains(logs.String(), "derived from the gossip key") {
		t.Errorf("no warning for the derived key: %q", logs.String())
	}
	o.members.GossipKeyFile = ""
	if k, err := forwardKey(o, log); err != nil || k != nil {
		t.Fatalf("with no key at all: %x, %v", k, err)
	}
	o.shard.ForwardKeyFile = write("bad", []byte("short"))
	if _, err := forwardKey(o, log); err == nil {
		t.Fatal("a malformed forward key file was accepted")
	}
}
