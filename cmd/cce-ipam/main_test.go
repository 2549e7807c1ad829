package main

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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
