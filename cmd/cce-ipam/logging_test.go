package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"
)

// client-go logs through klog; with newLogger's handler in place its lines
// come out as our JSON, with the component attribute, not as klog text.
func TestLogger_KlogGoesThroughTheJSONHandler(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("ours")
	klog.InfoS("from client-go", "lock", "ns/cce-ipam-leader")
	klog.Errorf("a klog error: %d", 42)
	klog.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("not a JSON line: %q (%v)", l, err)
		}
	}
	if !strings.Contains(lines[1], `"msg":"from client-go"`) || !strings.Contains(lines[1], `"component":"client-go"`) ||
		!strings.Contains(lines[1], `"lock":"ns/cce-ipam-leader"`) {
		t.Errorf("klog's InfoS came out as %s", lines[1])
	}
	if !strings.Contains(lines[2], `"level":"ERROR"`) || !strings.Contains(lines[2], "a klog error: 42") {
		t.Errorf("klog's Errorf came out as %s", lines[2])
	}
}

func TestLogger_FormatsAndBadInput(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "text", "debug")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("shown", "k", "v")
	if got := buf.String(); !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, "k=v") {
		t.Errorf("text format wrote %q", got)
	}
	for _, tc := range [][2]string{{"yaml", "info"}, {"json", "loud"}} {
		if _, err := newLogger(&buf, tc[0], tc[1]); err == nil {
			t.Errorf("newLogger(%q, %q) accepted", tc[0], tc[1])
		}
	}
}

func TestBuildInfo_Metric(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := buildInfo{Version: "v9", Revision: "abc", GoVersion: "go1.x"}
	registerBuildInfo(reg, b)
	const want = `
# HELP cce_ipam_build_info The replica's build: version, VCS revision and Go version (value 1).
# TYPE cce_ipam_build_info gauge
cce_ipam_build_info{goversion="go1.x",revision="abc",version="v9"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cce_ipam_build_info"); err != nil {
		t.Error(err)
	}
	if s := b.String(); !strings.Contains(s, "v9") || !strings.Contains(s, "abc") {
		t.Errorf("version line %q", s)
	}
}

// client-go's errors for a context this replica canceled (a node's pod watch
// stopped on a hand-over) are dropped; other errors, a passed deadline
// among them, and our own records are kept.
func TestLogger_DropsClientGoErrorsOfCanceledContexts(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	klog.ErrorS(fmt.Errorf("Get \"https://api/api/v1/pods?watch=true\": %w", context.Canceled), "Failed to watch",
		"reflector", "pods of node n-1")
	klog.ErrorS(fmt.Errorf("Get \"https://api/api/v1/pods\": %w", context.DeadlineExceeded), "Failed to watch",
		"reflector", "pods of node n-2")
	klog.ErrorS(errors.New("connection refused"), "Failed to update lease")
	log.Error("ours", "err", context.Canceled)
	klog.Flush()
	got := buf.String()
	if strings.Contains(got, "n-1") {
		t.Errorf("a watch stopped by its canceled context was logged:\n%s", got)
	}
	for _, want := range []string{"n-2", "Failed to update lease", `"msg":"ours"`} {
		if !strings.Contains(got, want) {
			t.Errorf("lost %q:\n%s", want, got)
		}
	}
}
