package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestTarget(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		file    string
		process bool
	}{
		// As containerd's shim calls runc.
		{[]string{"--root", "/run/runc/moby", "--log", "/x/log.json", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/b/pid", "id"}, "/b/config.json", false},
		{[]string{"--root=/r", "run", "-b", "/b2", "id"}, "/b2/config.json", false},
		{[]string{"create", "--bundle=/b3", "id"}, "/b3/config.json", false},
		{[]string{"create", "id"}, "config.json", false},
		{[]string{"--root", "/r", "exec", "--process", "/tmp/p.json", "--detach", "id"}, "/tmp/p.json", true},
		{[]string{"exec", "-p", "/tmp/q.json", "id"}, "/tmp/q.json", true},
		{[]string{"exec", "id", "sh"}, "", false}, // no process file: nothing to edit
		{[]string{"--root", "/r", "state", "id"}, "", false},
		{[]string{"--version"}, "", false},
		{nil, "", false},
	} {
		file, process := target(tc.args)
		if file != tc.file || process != tc.process {
			t.Errorf("target(%q) = %q, %v; want %q, %v", tc.args, file, process, tc.file, tc.process)
		}
	}
}

func TestDropCaps_ConfigKeepsEverythingElse(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.json")
	all := []any{"CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"}
	in := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"args": []any{"/sbin/init"},
			"capabilities": map[string]any{
				"bounding": all, "effective": all, "permitted": all, "inheritable": all, "ambient": []any{"CAP_CHOWN"},
			},
			"x-unknown": 7.0,
		},
		"linux": map[string]any{"namespaces": []any{map[string]any{"type": "pid"}}},
	}
	write(t, file, in)
	if err := edit(file, false, []string{"CAP_SYS_RESOURCE"}, nil); err != nil {
		t.Fatal(err)
	}
	out := read(t, file)
	proc := out["process"].(map[string]any)
	for set, v := range proc["capabilities"].(map[string]any) {
		if slices.Contains(v.([]any), any("CAP_SYS_RESOURCE")) {
			t.Errorf("%s still holds CAP_SYS_RESOURCE: %v", set, v)
		}
	}
	if got := proc["capabilities"].(map[string]any)["bounding"]; len(got.([]any)) != 2 {
		t.Errorf("bounding = %v, want CAP_CHOWN and CAP_SYS_ADMIN", got)
	}
	if proc["x-unknown"] != 7.0 || out["ociVersion"] != "1.0.2" || out["linux"] == nil {
		t.Errorf("other fields changed: %v", out)
	}
}

func TestDropCaps_ProcessFileAndNoCaps(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "process.json")
	write(t, file, map[string]any{"args": []any{"sh"}, "capabilities": map[string]any{"bounding": []any{"CAP_SYS_RESOURCE", "CAP_KILL"}}})
	if err := edit(file, true, []string{"CAP_SYS_RESOURCE"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := read(t, file)["capabilities"].(map[string]any)["bounding"].([]any); len(got) != 1 || got[0] != "CAP_KILL" {
		t.Errorf("bounding = %v, want [CAP_KILL]", got)
	}
	// A config without capabilities (or without process) is left alone.
	plain := filepath.Join(dir, "plain.json")
	if err := os.WriteFile(plain, []byte(`{"ociVersion":"1.0.2"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := edit(plain, false, []string{"CAP_SYS_RESOURCE"}, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(plain); string(b) != `{"ociVersion":"1.0.2"}` {
		t.Errorf("plain config rewritten: %s", b)
	}
	// Garbage is an error, not a panic, and the file is not touched.
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"process":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := edit(bad, false, []string{"CAP_SYS_RESOURCE"}, nil); err == nil {
		t.Error("dropCaps of a truncated config: no error")
	}
}

func write(t *testing.T, file string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, file string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMissingCaps(t *testing.T) {
	got, err := missingCaps("Name:\tx\nCapBnd:\t000001fffeffffff\nCapAmb:\t0\n")
	if err != nil || !slices.Equal(got, []string{"CAP_SYS_RESOURCE"}) {
		t.Errorf("this machine's CapBnd: %v, %v; want [CAP_SYS_RESOURCE]", got, err)
	}
	if got, err := missingCaps("CapBnd:\t000001ffffffffff\n"); err != nil || len(got) != 0 {
		t.Errorf("full set: %v, %v; want none", got, err)
	}
	for _, bad := range []string{"", "CapBnd:\tzz\n", "CapEff:\t0\n"} {
		if _, err := missingCaps(bad); err == nil {
			t.Errorf("missingCaps(%q): no error", bad)
		}
	}
}

// TestEdit_RaisesOOMScoreAdj: a pod sandbox asks for -998; without
// CAP_SYS_RESOURCE runc's init cannot set it below runcwrap's own value.
func TestEdit_RaisesOOMScoreAdj(t *testing.T) {
	dir := t.TempDir()
	own := 0
	for _, tc := range []struct {
		in   any
		want any
	}{{-998.0, 0.0}, {500.0, 500.0}, {nil, nil}} {
		file := filepath.Join(dir, "config.json")
		proc := map[string]any{"args": []any{"/pause"}}
		if tc.in != nil {
			proc["oomScoreAdj"] = tc.in
		}
		write(t, file, map[string]any{"process": proc})
		if err := edit(file, false, nil, &own); err != nil {
			t.Fatal(err)
		}
		if got := read(t, file)["process"].(map[string]any)["oomScoreAdj"]; got != tc.want {
			t.Errorf("oomScoreAdj %v: got %v, want %v", tc.in, got, tc.want)
		}
	}
	// Without a floor (the capability is there) it is left alone.
	file := filepath.Join(dir, "config.json")
	write(t, file, map[string]any{"process": map[string]any{"oomScoreAdj": -998.0}})
	if err := edit(file, false, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := read(t, file)["process"].(map[string]any)["oomScoreAdj"]; got != -998.0 {
		t.Errorf("no floor: oomScoreAdj = %v, want -998", got)
	}
}
