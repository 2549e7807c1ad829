//go:build integration

package charttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// chartAlerts are the alerts templates/prometheusrule-alerts.yaml defines,
// each with a promtool test in testdata/alerts-test.yaml and a runbook in
// the chart README.
var chartAlerts = []string{"CCEIPAMLeaseInvalid", "CCEIPAMFencingPolicyMissing", "CCEIPAMOwnerWaitTimeouts",
	"CCEIPAMCNIFailureRatio", "CCEIPAMBCEThrottling", "CCEIPAMLeakedIPsPastGrace", "CCEIPAMSubnetNearlyFull",
	"CCEIPAMMembersBelowReplicas", "CCEIPAMFencedWrites", "CCEIPAMNoReplicaUp"}

// The alerts' PrometheusRule: off by default, every alert switchable (the
// fencing one only with the fencing policy), the default selector picks the
// release's ServiceMonitor targets, every alert carries a summary, a
// description and a runbook_url whose anchor is a section of the chart
// README, promtool accepts the rules, and promtool's unit tests
// (testdata/alerts-test.yaml: each alert fires once its condition held for
// its `for`, not before, and not on near misses) pass.
func TestChart_AlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: run `make tools` (charts/tools/install-prometheus.sh)")
	}
	const name = "rel-cce-ipam-alerts"
	for _, tc := range []struct {
		name   string
		args   []string
		alerts int
	}{
		{"defaults", nil, 0},
		{"enabled", []string{"--set", "alerts.enabled=true"}, len(chartAlerts)},
		{"enabled, one switched off", []string{"--set", "alerts.enabled=true", "--set", "alerts.fencedWrites.enabled=false"},
			len(chartAlerts) - 1},
		{"enabled, no fencing policy", []string{"--set", "alerts.enabled=true", "--set", "fencing.enabled=false"},
			len(chartAlerts) - 1},
	} {
		prs := find(render(t, "rel", "kube-system", tc.args...), "PrometheusRule", name)
		if tc.alerts == 0 {
			if len(prs) != 0 {
				t.Errorf("%s: %d alert PrometheusRules rendered, want none", tc.name, len(prs))
			}
			continue
		}
		if len(prs) != 1 {
			t.Fatalf("%s: %d alert PrometheusRules rendered, want 1", tc.name, len(prs))
		}
		if got := alertRules(t, prs[0]); len(got) != tc.alerts {
			t.Errorf("%s: %d alerts, want %d", tc.name, len(got), tc.alerts)
		}
	}

	// The default selector: the target labels of the chart's ServiceMonitor.
	for _, r := range alertRules(t, one(t, render(t, "rel", "kube-system", "--set", "alerts.enabled=true"), "PrometheusRule", name)) {
		if want := `namespace="kube-system", service="rel-cce-ipam-peers"`; !strings.Contains(r["expr"].(string), want) {
			t.Errorf("%s: expr %s does not select %s", r["alert"], r["expr"], want)
		}
	}

	pr := one(t, render(t, "rel", "kube-system", "--set", "alerts.enabled=true", "--set", `alerts.selector=job="cce-ipam"`,
		"--set", "alerts.alertLabels.team=net", "--set", "alerts.labels.release=prom"), "PrometheusRule", name)
	if got := pr.GetLabels()["release"]; got != "prom" {
		t.Errorf("PrometheusRule labels %v, want alerts.labels (release=prom) among them", pr.GetLabels())
	}
	rules := alertRules(t, pr)
	var names []string
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		alert, _ := r["alert"].(string)
		names = append(names, alert)
		ann, _ := r["annotations"].(map[string]any)
		for _, k := range []string{"summary", "description", "runbook_url"} {
			if s, _ := ann[k].(string); strings.TrimSpace(s) == "" {
				t.Errorf("%s has no %s annotation", alert, k)
			}
		}
		url, _ := ann["runbook_url"].(string)
		if want := "README.md#" + strings.ToLower(alert); !strings.HasSuffix(url, want) {
			t.Errorf("%s: runbook_url %q, want …%s", alert, url, want)
		}
		// The runbook: a heading named after the alert (GitHub's anchor is
		// its lower-case name), saying what it means, what to check and what
		// to do.
		section := readmeSection(string(readme), "### "+alert)
		if section == "" {
			t.Errorf("%s: the chart README has no runbook section \"### %s\"", alert, alert)
		}
		for _, part := range []string{"**Means:**", "**Check:**", "**Do:**"} {
			if section != "" && !strings.Contains(section, part) {
				t.Errorf("%s: its runbook has no %s", alert, part)
			}
		}
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(chartAlerts))
	if !slices.Equal(names, want) {
		t.Fatalf("alerts %v, want %v", names, want)
	}

	// Every alert has a promtool case where it fires and one where it does not.
	test, err := os.ReadFile(filepath.Join("testdata", "alerts-test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, alert := range chartAlerts {
		fires := regexp.MustCompile(`alertname: ` + alert + `\n\s+exp_alerts:\n\s+- exp_labels`)
		silent := regexp.MustCompile(`alertname: ` + alert + `\n\s+exp_alerts: \[\]`)
		if !fires.Match(test) || !silent.Match(test) {
			t.Errorf("testdata/alerts-test.yaml: %s needs a case where it fires and one where it stays silent", alert)
		}
	}

	dir := t.TempDir()
	full := alertRuleFile(t, rules, false)
	if err := os.WriteFile(filepath.Join(dir, "alerts-full.yaml"), full, 0o600); err != nil {
		t.Fatal(err)
	}
	// check rules also parses and test-expands the annotation templates.
	if out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "alerts-full.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yaml"), alertRuleFile(t, rules, true), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), test, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// alertRules returns the rules of the alerts PrometheusRule's one group.
func alertRules(t testing.TB, pr *unstructured.Unstructured) []map[string]any {
	t.Helper()
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if len(groups) != 1 {
		t.Fatalf("%s: %d rule groups, want 1", pr.GetName(), len(groups))
	}
	raw, _ := groups[0].(map[string]any)["rules"].([]any)
	var out []map[string]any
	for _, r := range raw {
		out = append(out, r.(map[string]any))
	}
	return out
}

// alertRuleFile is a Prometheus rule file with the rules as one group;
// short drops the summary and description annotations (whose text
// promtool's unit tests would otherwise have to repeat), keeping runbook_url.
func alertRuleFile(t testing.TB, rules []map[string]any, short bool) []byte {
	t.Helper()
	var out []any
	for _, r := range rules {
		c := map[string]any{}
		for k, v := range r {
			c[k] = v
		}
		if ann, ok := r["annotations"].(map[string]any); ok && short {
			c["annotations"] = map[string]any{"runbook_url": ann["runbook_url"]}
		}
		out = append(out, c)
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "cce-ipam-alerts", "rules": out}}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// readmeSection returns the text under heading up to the next heading of
// the same or a higher level ("" when the heading is missing).
func readmeSection(readme, heading string) string {
	lines := strings.Split(readme, "\n")
	level := strings.Index(heading, " ")
	for i, l := range lines {
		if strings.TrimSpace(l) != heading {
			continue
		}
		var b strings.Builder
		for _, l := range lines[i+1:] {
			if n := strings.Index(l, " "); n > 0 && n <= level && strings.Trim(l[:n], "#") == "" {
				break
			}
			b.WriteString(l + "\n")
		}
		return b.String()
	}
	return ""
}
