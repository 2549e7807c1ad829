//go:build integration

package charttest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/yaml"
)

// Chart.yaml's kubeVersion refuses 1.30 (no field selectors on the wep CRD's
// selectableFields without a feature gate) and admits 1.31, provider builds
// of it included; the bound rests on the wep CRD declaring selectableFields.
func TestChart_KubeVersion(t *testing.T) {
	for version, ok := range map[string]bool{"1.30.9": false, "1.29.0": false, "1.31.0": true, "1.31.2-cce.1": true, "1.37.2": true} {
		_, err := helm(t, "template", "rel", chartDir, "--kube-version", version)
		switch {
		case ok && err != nil:
			t.Errorf("Kubernetes %s refused: %v", version, err)
		case !ok && err == nil:
			t.Errorf("Kubernetes %s accepted, want kubeVersion to refuse it", version)
		case !ok && !strings.Contains(err.Error(), "kubeVersion"):
			t.Errorf("Kubernetes %s: error does not name kubeVersion: %v", version, err)
		}
	}
	crd := readCRD(t, "cce.io_workloadendpoints.yaml")
	if len(crd.Spec.Versions[0].SelectableFields) == 0 {
		t.Error("the wep CRD has no selectableFields: the kubeVersion bound of 1.31 is argued from them")
	}
}

// As a subchart the chart gets the parent's global values; the schema must
// accept them (additionalProperties is false at the top).
func TestChart_Subchart(t *testing.T) {
	parent := t.TempDir()
	if err := os.CopyFS(filepath.Join(parent, "charts", "cce-ipam"), os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"Chart.yaml": "apiVersion: v2\nname: platform\nversion: 1.0.0\n" +
			"dependencies:\n  - name: cce-ipam\n    version: 0.1.0\n",
		"values.yaml": "global:\n  imageRegistry: registry.example.com\n" +
			"cce-ipam:\n  cluster:\n    id: cce-x\n    vpcID: vpc-x\n  bce:\n    region: bj\n",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(parent, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := helm(t, "template", "rel", parent, "--namespace", "kube-system")
	if err != nil {
		t.Fatalf("as a subchart with global values: %v", err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(container(t, deployment(t, objs)).Args, "--cluster-id=cce-x") {
		t.Error("the subchart's Deployment does not carry the parent's values for it")
	}
}

// updateStrategy has the Deployment's shape; chart 0.1.0's flat keys still
// render the same Deployment (and win where set); Recreate gets no
// rollingUpdate, which the API server would refuse.
func TestChart_UpdateStrategy(t *testing.T) {
	for _, tc := range []struct {
		name          string
		set           []string
		typ           appsv1.DeploymentStrategyType
		surge, unavai *intstr.IntOrString
	}{
		{"defaults", nil, appsv1.RollingUpdateDeploymentStrategyType, ptrIntOrString(intstr.FromInt32(1)), ptrIntOrString(intstr.FromInt32(0))},
		{"kubernetes shape", []string{"updateStrategy.rollingUpdate.maxSurge=0", "updateStrategy.rollingUpdate.maxUnavailable=25%"},
			appsv1.RollingUpdateDeploymentStrategyType, ptrIntOrString(intstr.FromInt32(0)), ptrIntOrString(intstr.FromString("25%"))},
		{"0.1.0 flat keys", []string{"updateStrategy.maxSurge=0", "updateStrategy.maxUnavailable=1"},
			appsv1.RollingUpdateDeploymentStrategyType, ptrIntOrString(intstr.FromInt32(0)), ptrIntOrString(intstr.FromInt32(1))},
		{"recreate", []string{"updateStrategy.type=Recreate"}, appsv1.RecreateDeploymentStrategyType, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			s := deployment(t, render(t, "rel", "kube-system", args...)).Spec.Strategy
			if s.Type != tc.typ {
				t.Errorf("strategy type %q, want %q", s.Type, tc.typ)
			}
			if tc.surge == nil {
				if s.RollingUpdate != nil {
					t.Errorf("rollingUpdate %+v rendered with %s", s.RollingUpdate, s.Type)
				}
				return
			}
			if s.RollingUpdate == nil || *s.RollingUpdate.MaxSurge != *tc.surge || *s.RollingUpdate.MaxUnavailable != *tc.unavai {
				t.Errorf("rollingUpdate %+v, want maxSurge %s maxUnavailable %s", s.RollingUpdate, tc.surge, tc.unavai)
			}
		})
	}
	if _, err := helm(t, "template", "rel", chartDir, "--set", "updateStrategy.type=OnDelete"); err == nil ||
		!strings.Contains(err.Error(), "/updateStrategy/type") {
		t.Errorf("updateStrategy.type=OnDelete (a StatefulSet strategy): %v, want a schema error", err)
	}
}

func ptrIntOrString(v intstr.IntOrString) *intstr.IntOrString { return &v }

// The ServiceMonitor carries relabelings, metricRelabelings and annotations
// from the values (the ci values set all three), and none by default.
func TestChart_ServiceMonitorOptions(t *testing.T) {
	sm := one(t, render(t, "rel", "kube-system", "-f", ciValues), "ServiceMonitor")
	if got := sm.GetAnnotations()["example.com/owner"]; got != "networking" {
		t.Errorf("annotations %v, want example.com/owner: networking", sm.GetAnnotations())
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("%d endpoints, want 1", len(eps))
	}
	ep := eps[0].(map[string]any)
	relabel, _ := ep["relabelings"].([]any)
	if len(relabel) != 1 || relabel[0].(map[string]any)["targetLabel"] != "cluster" {
		t.Errorf("relabelings %v, want the ci values' cluster label", ep["relabelings"])
	}
	metric, _ := ep["metricRelabelings"].([]any)
	if len(metric) != 1 || metric[0].(map[string]any)["action"] != "drop" {
		t.Errorf("metricRelabelings %v, want the ci values' drop", ep["metricRelabelings"])
	}

	sm = one(t, render(t, "rel", "kube-system", "--set", "serviceMonitor.enabled=true"), "ServiceMonitor")
	eps, _, _ = unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	for _, k := range []string{"relabelings", "metricRelabelings"} {
		if _, ok := eps[0].(map[string]any)[k]; ok {
			t.Errorf("%s rendered by default", k)
		}
	}
	if len(sm.GetAnnotations()) != 0 {
		t.Errorf("annotations %v rendered by default", sm.GetAnnotations())
	}
}

// image.digest pins the image by digest (repository@digest, no tag); the
// schema refuses a value that is not a digest.
func TestChart_ImageDigest(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "cce-ipam:0.1.0"},
		{[]string{"image.tag=1.2.3"}, "cce-ipam:1.2.3"},
		{[]string{"image.digest=" + digest}, "cce-ipam@" + digest},
		{[]string{"image.tag=1.2.3", "image.digest=" + digest}, "cce-ipam@" + digest},
	} {
		var args []string
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		if got := container(t, deployment(t, render(t, "rel", "kube-system", args...))).Image; got != tc.want {
			t.Errorf("%v: image %q, want %q", tc.set, got, tc.want)
		}
	}
	if _, err := helm(t, "template", "rel", chartDir, "--set", "image.digest=latest"); err == nil ||
		!strings.Contains(err.Error(), "/image/digest") {
		t.Errorf("image.digest=latest: %v, want a schema error", err)
	}
}

// extraVolumes and extraVolumeMounts are appended to the chart's own (the ci
// values mount a ConfigMap; TestChart_ServerDryRunAccepted has the API server
// validate that render).
func TestChart_ExtraVolumes(t *testing.T) {
	d := deployment(t, render(t, "rel", "kube-system", "-f", ciValues))
	if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "extra-ca" && v.ConfigMap != nil && v.ConfigMap.Name == "cce-ipam-extra-ca"
	}) {
		t.Errorf("volumes %+v lack extra-ca", d.Spec.Template.Spec.Volumes)
	}
	if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "gossip-key" }) {
		t.Error("the chart's own gossip-key volume is gone")
	}
	c := container(t, d)
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "extra-ca" && m.MountPath == "/etc/ssl/extra-ca" && m.ReadOnly
	}) {
		t.Errorf("volume mounts %+v lack extra-ca", c.VolumeMounts)
	}
}

// The pods carry app.kubernetes.io/version: the version that runs (the image
// tag, else the appVersion). The selector stays without it: a Deployment's
// selector is immutable, so a version in it would fail every upgrade.
func TestChart_PodVersionLabel(t *testing.T) {
	for tag, want := range map[string]string{"": "0.1.0", "1.2.3": "1.2.3"} {
		d := deployment(t, render(t, "rel", "kube-system", "--set", "image.tag="+tag))
		if got := d.Spec.Template.Labels["app.kubernetes.io/version"]; got != want {
			t.Errorf("image.tag=%q: pod label app.kubernetes.io/version=%q, want %q", tag, got, want)
		}
		if _, ok := d.Spec.Selector.MatchLabels["app.kubernetes.io/version"]; ok {
			t.Error("the Deployment's selector has the version label")
		}
	}
}

// Every CRD of the chart is in the categories cce and cce-ipam, so
// `kubectl get cce` lists every object of ours; checked in the files and in
// the API server's discovery.
func TestCRDs_Categories(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(chartDir, "crds"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		n++
		crd := readCRD(t, e.Name())
		for _, c := range []string{"cce", "cce-ipam"} {
			if !slices.Contains(crd.Spec.Names.Categories, c) {
				t.Errorf("%s: categories %v lack %q", e.Name(), crd.Spec.Names.Categories, c)
			}
		}
	}
	if n != 6 {
		t.Errorf("%d CRD files, want 6", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx, filepath.Join(chartDir, "crds")); err != nil {
		t.Fatal(err)
	}
	list, err := discovery.NewDiscoveryClientForConfigOrDie(cp.Config).ServerResourcesForGroupVersion("cce.io/v1alpha1")
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, r := range list.APIResources {
		if strings.Contains(r.Name, "/") { // subresources have no categories
			continue
		}
		served++
		if !slices.Contains(r.Categories, "cce") || !slices.Contains(r.Categories, "cce-ipam") {
			t.Errorf("discovery: %s has categories %v, want cce and cce-ipam", r.Name, r.Categories)
		}
	}
	if served != 6 {
		t.Errorf("discovery serves %d cce.io resources, want 6", served)
	}
}

func readCRD(t *testing.T, file string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "crds", file))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return &crd
}
