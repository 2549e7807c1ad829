//go:build integration

package migration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/cce-ipam/sharded/e2e/fleet"
	"github.com/cce-ipam/sharded/e2e/freeport"
	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// referenceMetricsAnswer runs a real Prometheus that scrapes the fleet's
// replicas and evaluates the chart's recording rules (rendered by helm for
// this cluster), and asks it in the reference's names. Series counts are
// compared with ours, so a bucket bound missing from the rules' table fails.
func referenceMetricsAnswer(ctx context.Context, t *testing.T, f *fleet.Fleet) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed: run `make tools` (charts/tools/install-prometheus.sh)")
	}
	dir := t.TempDir()
	rules := renderReferenceRules(t, f)
	var targets []string
	for _, r := range f.Live() {
		targets = append(targets, strconv.Quote(r.MetricsAddr()))
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: cce-ipam
    static_configs:
      - targets: [%s]
`, rules, strings.Join(targets, ", "))
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeport.Addr(t)
	p := supervisor.StartT(t, supervisor.Spec{Name: "prometheus", Bin: promBin, Env: []string{"HOME=" + dir}, Args: []string{
		"--config.file=" + configPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr, "--log.level=warn"}})
	base := "http://" + addr

	one := func(expr string) (float64, int, error) {
		if !p.Running() {
			return 0, 0, fmt.Errorf("prometheus exited:\n%s", p.LogTail(20))
		}
		return promQuery(ctx, base, expr)
	}
	// The names a reference dashboard or alert queries, with their labels.
	for _, q := range []struct{ expr, why string }{
		{`cni_rpc_latency_count{rpc_api="AllocateIP",error="false",cluster="` + f.ClusterID + `",ip_type="BCCMultiENIMultiIPType"}`, "AllocateIP latency"},
		{`histogram_quantile(0.99, sum by (le) (cni_rpc_latency_bucket{rpc_api="AllocateIP"}))`, "p99 AllocateIP latency (ms)"},
		{`cni_rpc_latency_count{rpc_api="ReleaseIP"}`, "ReleaseIP latency"},
		{`bce_openapi_latency_count{api!=""}`, "BCE call latency"},
		{`multi_eni_multi_ip_eniip_count > 0`, "IPs on ENIs"},
		{`multi_eni_multi_ip_eni_count > 0`, "ENIs"},
		{`subnet_available_ip_count{subnet="` + f.SubnetID + `"}`, "free IPs of the subnet"},
		{`memory_usage_percent`, "memory"},
	} {
		err := waitFor(ctx, time.Minute, func() error {
			_, n, err := one(q.expr)
			if err == nil && n == 0 {
				err = fmt.Errorf("no data")
			}
			return err
		})
		if err != nil {
			t.Errorf("%s: %s: %v", q.why, q.expr, err)
		}
	}
	// Every bucket of ours has its reference twin.
	for _, pair := range [][2]string{
		{`count(cni_rpc_latency_bucket)`, `count(cce_ipam_cni_request_duration_seconds_bucket{hop="entry",result=~"ok|error"})`},
		{`count(bce_openapi_latency_bucket)`, `count(cce_ipam_cloud_api_duration_seconds_bucket)`},
	} {
		err := waitFor(ctx, 30*time.Second, func() error {
			ref, _, err1 := one(pair[0])
			ours, _, err2 := one(pair[1])
			switch {
			case err1 != nil || err2 != nil:
				return errors.Join(err1, err2)
			case ref != ours || ours == 0:
				return fmt.Errorf("%s = %v, %s = %v", pair[0], ref, pair[1], ours)
			}
			return nil
		})
		if err != nil {
			t.Errorf("bucket table of the recording rules: %v", err)
		}
	}
	v, _, _ := one(`histogram_quantile(0.99, sum by (le) (cni_rpc_latency_bucket{rpc_api="AllocateIP"}))`)
	ips, _, _ := one(`multi_eni_multi_ip_eniip_count`)
	t.Logf("in the reference's names: p99 AllocateIP since start %.0f ms; %v IPs on ENIs", v, ips)
}

// renderReferenceRules renders the chart's PrometheusRule for the fleet's
// cluster with the pinned helm and writes its groups as a rule file.
func renderReferenceRules(t *testing.T, f *fleet.Fleet) string {
	t.Helper()
	home := t.TempDir()
	chart := filepath.Join("..", "..", "..", "charts", "cce-ipam") // from this package
	cmd := exec.Command(filepath.Join(f.Options().BinDir, "helm"), "template", "mig", chart,
		"--kube-version", "1.31.0", // the chart needs >= 1.31; the pinned helm's default is v1.20.0
		"--show-only", "templates/prometheusrule-reference.yaml",
		"--set", "serviceMonitor.enabled=true", "--set", "cluster.id="+f.ClusterID, "--set", "cluster.vpcID="+f.VPCID,
		"--set", "bce.region="+fleet.Region, "--set", "bce.credentials.accessKeyID=x", "--set", "bce.credentials.secretAccessKey=y")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	var pr struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &pr); err != nil || len(pr.Spec.Groups) == 0 {
		t.Fatalf("rendered PrometheusRule: %v\n%s", err, out)
	}
	data, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(home, "reference-metrics.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// promQuery runs an instant query and returns the first sample's value and
// the number of series.
func promQuery(ctx context.Context, base, expr string) (float64, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, 0, err
	}
	if r.Status != "success" {
		return 0, 0, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	if len(r.Data.Result) == 0 {
		return 0, 0, nil
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, len(r.Data.Result), err
}
