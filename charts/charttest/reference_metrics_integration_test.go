//go:build integration

package charttest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/yaml"
)

// The PrometheusRule that records the reference's metric names: rendered
// with the ServiceMonitor (and only then, and not when switched off), valid
// for promtool, and right on promtool's unit tests
// (testdata/reference-metrics-test.yaml: names, labels, ms from s, sums over
// replicas, a histogram_quantile of the reference's).
func TestChart_ReferenceMetricRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: run `make tools` (charts/tools/install-prometheus.sh)")
	}
	base := []string{"--set", "cluster.id=cce-mig", "--set", "cluster.vpcID=vpc-mig"}
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"defaults", nil, 0},
		{"with ServiceMonitor", []string{"--set", "serviceMonitor.enabled=true"}, 1},
		{"switched off", []string{"--set", "serviceMonitor.enabled=true", "--set", "referenceMetrics.enabled=false"}, 0},
	} {
		if got := len(find(render(t, "rel", "kube-system", append(base, tc.args...)...), "PrometheusRule")); got != tc.want {
			t.Errorf("%s: %d PrometheusRules rendered, want %d", tc.name, got, tc.want)
		}
	}

	dir := t.TempDir()
	rules := referenceRules(t, render(t, "rel", "kube-system", append(base, "--set", "serviceMonitor.enabled=true",
		"--set", "referenceMetrics.labels.release=prom")...))
	if err := os.WriteFile(filepath.Join(dir, "reference-metrics.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	test, err := os.ReadFile(filepath.Join("testdata", "reference-metrics-test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), test, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "reference-metrics.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	cmd := exec.Command(promtool, "test", "rules", "test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// referenceRules returns the rule groups of the rendered PrometheusRule as a
// Prometheus rule file.
func referenceRules(t testing.TB, objs []*unstructured.Unstructured) []byte {
	t.Helper()
	pr := one(t, objs, "PrometheusRule")
	if got := pr.GetLabels()["release"]; got != "prom" {
		t.Errorf("PrometheusRule labels %v, want referenceMetrics.labels (release=prom) among them", pr.GetLabels())
	}
	spec, _ := pr.Object["spec"].(map[string]any)
	data, err := yaml.Marshal(map[string]any{"groups": spec["groups"]})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// installPrometheusRuleCRD installs a minimal monitoring.coreos.com/v1
// PrometheusRule CRD (the operator's schema is not under test: promtool
// checks the rules) and waits until discovery serves it.
func installPrometheusRuleCRD(t *testing.T, ctx context.Context) {
	t.Helper()
	cs := apiextensionsclient.NewForConfigOrDie(cp.Config)
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheusrules.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "prometheusrules", Singular: "prometheusrule",
				Kind: "PrometheusRule", ListKind: "PrometheusRuleList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Required: []string{"groups"}, XPreserveUnknownFields: new(true)},
					},
				}},
			}},
		},
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	disc := discovery.NewDiscoveryClientForConfigOrDie(cp.Config)
	eventually(t, ctx, 200*time.Millisecond, "PrometheusRule CRD served", func() error {
		res, err := disc.ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
		if err != nil {
			return err
		}
		for _, r := range res.APIResources {
			if r.Name == "prometheusrules" {
				return nil
			}
		}
		return errors.New("prometheusrules not served yet")
	})
}
