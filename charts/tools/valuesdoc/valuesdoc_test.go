package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse_DocumentedLeavesAndMaps(t *testing.T) {
	rows, err := Parse([]byte(`# File header, not a description.

# -- Replicas.
replicaCount: 3
image:
  # -- Repository,
  # continued on a second line.
  repository: cce-ipam
  # -- Tag | with a pipe.
  tag: ""
# -- Requests and limits.
resources:
  limits:
    memory: 1Gi
# -- Extra args.
extraArgs: []
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Row{
		{Key: "replicaCount", Type: "int", Default: "3", Description: "Replicas."},
		{Key: "image.repository", Type: "string", Default: `"cce-ipam"`, Description: "Repository, continued on a second line."},
		{Key: "image.tag", Type: "string", Default: `""`, Description: "Tag | with a pipe."},
		{Key: "resources", Type: "map", Default: `{"limits":{"memory":"1Gi"}}`, Description: "Requests and limits."},
		{Key: "extraArgs", Type: "list", Default: "[]", Description: "Extra args."},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows %+v, want %d", len(rows), rows, len(want))
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
	if table := Table(rows); !strings.Contains(table, `Tag \| with a pipe.`) {
		t.Errorf("pipe not escaped in\n%s", table)
	}
}

func TestParse_UndocumentedValueFails(t *testing.T) {
	_, err := Parse([]byte("# -- Documented.\na: 1\nb:\n  # a plain comment is not a description\n  c: 2\n"))
	if err == nil || !strings.Contains(err.Error(), "b.c") {
		t.Fatalf("err = %v, want one naming b.c", err)
	}
}

func TestSplice_NeedsMarkers(t *testing.T) {
	if _, err := Splice([]byte("no markers"), "x"); err == nil {
		t.Fatal("Splice without markers succeeded")
	}
	got, err := Splice([]byte("a\n"+beginMarker+"\nold\n"+endMarker+"\nb\n"), "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "a\n" + beginMarker + "\nnew\n" + endMarker + "\nb\n"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// The chart's README table is generated from its values.yaml: this fails when
// someone changed a value or its comment without running `make chart-docs`.
func TestChartREADME_TableIsUpToDate(t *testing.T) {
	chart := filepath.Join("..", "..", "cce-ipam")
	values, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chart, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := Parse(values)
	if err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	want, err := Splice(readme, Table(rows))
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(readme) {
		t.Fatal("charts/cce-ipam/README.md has a stale values table: run `make chart-docs`")
	}
}
