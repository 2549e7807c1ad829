//go:build integration

package charttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/cce-ipam/sharded/e2e/cluster"
	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// chartDir is the chart under test, relative to this package.
const chartDir = "../cce-ipam"

var cp *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.RunTests(m, cluster.Options{AuditServiceAccounts: true}, &cp))
}

// binDir is where make tools and make binaries put helm, cce-ipam and bce-sim.
func binDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("CCE_IPAM_BIN_DIR"); d != "" {
		return d
	}
	d, err := filepath.Abs(filepath.Join("..", "..", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// bin returns the path of a tool in bin/, failing (never skipping) when it
// is missing.
func bin(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(binDir(t), name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make tools binaries` (%v)", p, err)
	}
	return p
}

// renderKubeVersion is the Kubernetes version `helm template` renders for:
// the chart's lowest (Chart.yaml kubeVersion). Without --kube-version, helm
// checks kubeVersion against its built-in default, which for the pinned helm
// (built from source without helm's release ldflags) is v1.20.0.
const renderKubeVersion = "1.31.0"

// helm runs the pinned helm with an isolated home; it returns stdout, and an
// error carrying stderr when helm fails. `helm template` gets
// --kube-version renderKubeVersion unless the caller names a version.
func helm(t testing.TB, args ...string) (string, error) {
	t.Helper()
	if len(args) > 0 && args[0] == "template" &&
		!slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--kube-version") }) {
		args = append(slices.Clone(args), "--kube-version", renderKubeVersion)
	}
	home := t.TempDir()
	cmd := exec.Command(bin(t, "helm"), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.String(), nil
}

// valuesFile writes values as a YAML file for helm -f.
func valuesFile(t testing.TB, values map[string]any) string {
	t.Helper()
	data, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// render runs helm template for a release in a namespace with the given
// extra helm arguments (-f files, --set, --include-crds) and decodes the
// manifests: what helm install applies, without the helm test hook's objects
// (renderTestHook), which only helm test creates.
func render(t testing.TB, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderArgs(t, release, namespace, append([]string{"--skip-tests"}, args...)...)
}

// renderTestHook renders only the helm test hook's objects.
func renderTestHook(t testing.TB, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderArgs(t, release, namespace, append([]string{"--show-only", "templates/tests/ring-check.yaml"}, args...)...)
}

func renderArgs(t testing.TB, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, append([]string{"template", release, chartDir, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("decode rendered manifests: %v", err)
	}
	return objs
}

func decode(manifests string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the objects of a kind; with a name, only that one.
func find(objs []*unstructured.Unstructured, kind string, name ...string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (len(name) == 0 || o.GetName() == name[0]) {
			out = append(out, o)
		}
	}
	return out
}

// one returns the single object of a kind (and name), failing otherwise.
func one(t testing.TB, objs []*unstructured.Unstructured, kind string, name ...string) *unstructured.Unstructured {
	t.Helper()
	got := find(objs, kind, name...)
	if len(got) != 1 {
		t.Fatalf("rendered %d %s %v, want exactly one", len(got), kind, name)
	}
	return got[0]
}

// typed converts a rendered object into its typed form.
func typed[T any](t testing.TB, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("convert %s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return out
}

func deployment(t testing.TB, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	return typed[appsv1.Deployment](t, one(t, objs, "Deployment"))
}

func container(t testing.TB, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("Deployment has %d containers, want 1", n)
	}
	return d.Spec.Template.Spec.Containers[0]
}

// startProcess runs bin under e2e/supervisor with exactly env (nil: none);
// it is killed when the test ends, its log tail logged if the test failed.
func startProcess(t testing.TB, name, bin string, args, env []string) *supervisor.Process {
	t.Helper()
	if env == nil {
		env = []string{}
	}
	return supervisor.StartT(t, supervisor.Spec{
		Name: name,
		Bin:  bin,
		Args: args,
		Env:  env,
	})
}

// alive reports an error, with the log's tail, if p has exited.
func alive(p *supervisor.Process) error {
	if p.Running() {
		return nil
	}
	return p.ExitError()
}

// logText returns p's whole log.
func logText(p *supervisor.Process) string {
	data, _ := os.ReadFile(p.LogPath())
	return string(data)
}

// eventually polls cond every interval until it returns nil or ctx ends; it
// fails with the last error.
func eventually(t testing.TB, ctx context.Context, interval time.Duration, what string, cond func() error) {
	t.Helper()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v (last: %v)", what, ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}
