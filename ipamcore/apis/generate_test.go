package apis

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// outputs are the generated paths, relative to the module root. A directory
// is compared file by file, including files present on only one side.
var outputs = []string{
	"ipamcore/apis/cce/v1alpha1/zz_generated.deepcopy.go",
	"ipamcore/generated",
	"charts/cce-ipam/crds",
}

// TestGenerate_CommittedOutputIsCurrent regenerates everything in a copy of
// the module and fails if any committed generated file differs, is missing or
// is extra.
func TestGenerate_CommittedOutputIsCurrent(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "ipamcore", "apis", "generate.sh")
	info, err := os.Stat(script)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode()&0o111 == 0 {
		t.Errorf("%s is not executable; `make generate` skips it", script)
	}

	tmp := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum"} {
		copyFile(t, filepath.Join(root, f), filepath.Join(tmp, f))
	}
	copyTree(t, filepath.Join(root, "ipamcore", "apis"), filepath.Join(tmp, "ipamcore", "apis"))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(tmp, "ipamcore", "apis", "generate.sh"))
	cmd.Dir = tmp
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("generate.sh in a copy of the module: %v\n%s", err, out)
	}
	t.Logf("generate.sh took %s", time.Since(start).Round(time.Millisecond))

	var stale []string
	for _, p := range outputs {
		stale = append(stale, diffPaths(t, filepath.Join(root, p), filepath.Join(tmp, p), p)...)
	}
	if len(stale) > 0 {
		t.Errorf("generated code is stale; run `make generate` and commit the result:\n  %s",
			strings.Join(stale, "\n  "))
	}
}

// diffPaths compares committed (want to be equal to) regenerated output and
// describes every difference.
func diffPaths(t *testing.T, committed, regenerated, rel string) []string {
	t.Helper()
	a := listFiles(t, committed)
	b := listFiles(t, regenerated)
	var diffs []string
	for name := range a {
		if _, ok := b[name]; !ok {
			diffs = append(diffs, filepath.Join(rel, name)+": in the tree but no longer generated")
		}
	}
	for name, got := range b {
		want, ok := a[name]
		switch {
		case !ok:
			diffs = append(diffs, filepath.Join(rel, name)+": generated but missing from the tree")
		case !bytes.Equal(want, got):
			diffs = append(diffs, filepath.Join(rel, name)+": differs; "+firstDifference(want, got))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// listFiles returns the regular files under path (or path itself) by their
// path relative to it; a missing path has no files.
func listFiles(t *testing.T, path string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(path, p)
		if err != nil {
			return err
		}
		files[rel] = data
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return files
}

func firstDifference(committed, regenerated []byte) string {
	a := strings.Split(string(committed), "\n")
	b := strings.Split(string(regenerated), "\n")
	for i := 0; i < len(a) || i < len(b); i++ {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return fmt.Sprintf("line %d: committed %s, regenerated %s", i+1, lineAt(a, i), lineAt(b, i))
		}
	}
	return "same lines, different bytes"
}

func lineAt(lines []string, i int) string {
	if i >= len(lines) {
		return "<end of file>"
	}
	return fmt.Sprintf("%q", lines[i])
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	for rel, data := range listFiles(t, from) {
		writeFile(t, filepath.Join(to, rel), data, from, rel)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeFile writes data and keeps the executable bit of the source file.
func writeFile(t *testing.T, to string, data []byte, fromDir, rel string) {
	t.Helper()
	info, err := os.Stat(filepath.Join(fromDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, info.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}
