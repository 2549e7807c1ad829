package cloud_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

func TestClient_SetRateAndWaitMetrics(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{Rate: 1000, Burst: 1}})
	for range 3 {
		if _, err := e.client.GetInstance(context.Background(), e.i4g); err != nil {
			t.Fatal(err)
		}
	}
	if n := metricValue(t, e.reg, "cce_ipam_cloud_api_ratelimit_wait_seconds", "operation", "GetInstance"); n != 3 {
		t.Fatalf("wait histogram has %v samples, want 3", n)
	}
	if n := metricValue(t, e.reg, "cce_ipam_cloud_api_duration_seconds", "operation", "GetInstance"); n != 3 {
		t.Fatalf("latency histogram has %v samples, want 3", n)
	}
	if r := metricValue(t, e.reg, "cce_ipam_cloud_api_ratelimit_rate"); r != 1000 {
		t.Fatalf("rate gauge = %v, want 1000", r)
	}
	if err := e.client.SetRate(2.5, 7); err != nil {
		t.Fatal(err)
	}
	if r, b := metricValue(t, e.reg, "cce_ipam_cloud_api_ratelimit_rate"), metricValue(t, e.reg, "cce_ipam_cloud_api_ratelimit_burst"); r != 2.5 || b != 7 {
		t.Fatalf("gauges after SetRate = %v, %v", r, b)
	}
	if err := e.client.SetRate(-1, 7); err == nil {
		t.Fatal("negative rate accepted")
	}
	if r, b := e.client.Rate(); r != 2.5 || b != 7 {
		t.Fatalf("Rate() = %v, %v after a rejected SetRate", r, b)
	}
}

func TestConfig_ValidateAndRedact(t *testing.T) {
	good := cloud.DefaultConfig()
	good.AccessKeyID, good.SecretAccessKey = "AK-visible-nowhere", "SK-visible-nowhere"
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*cloud.Config){
		"no credentials":     func(c *cloud.Config) { c.AccessKeyID, c.SecretAccessKey = "", "" },
		"half a key pair":    func(c *cloud.Config) { c.SecretAccessKey = "" },
		"negative rate":      func(c *cloud.Config) { c.Rate = -1 },
		"zero rate":          func(c *cloud.Config) { c.Rate = 0 },
		"page size":          func(c *cloud.Config) { c.PageSize = 1001 },
		"zero page size":     func(c *cloud.Config) { c.PageSize = 0 },
		"short timeout":      func(c *cloud.Config) { c.Timeout = 1 },
		"endpoint with a sp": func(c *cloud.Config) { c.Endpoint = "bad host" },
		"no region":          func(c *cloud.Config) { c.Region = "" },
	} {
		c := good
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted %v", name, c)
		}
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("start", "cloud", good)
	out := buf.String() + fmt.Sprint(good) + fmt.Sprintf("%+v", good)
	if strings.Contains(out, "visible-nowhere") {
		t.Fatalf("credentials leaked: %s", out)
	}
}

func TestConfig_RegisterFlags(t *testing.T) {
	var c cloud.Config
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"--bce-endpoint=127.0.0.1:9", "--bce-rate=3.5", "--bce-burst=4", "--bce-credentials-dir=/secret"}); err != nil {
		t.Fatal(err)
	}
	if c.Endpoint != "127.0.0.1:9" || c.Rate != 3.5 || c.Burst != 4 || c.CredentialsDir != "/secret" {
		t.Fatalf("parsed %+v", c)
	}
}

// A call that finds the bucket empty waits for a token and never reaches BCE
// if its context ends first; SetRate with a larger burst does not refill it.
func TestClient_EmptyBucketBlocksCalls(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{Rate: 0.001, Burst: 1}})
	if _, err := e.client.GetInstance(context.Background(), e.i4g); err != nil {
		t.Fatal(err)
	}
	if err := e.client.SetRate(0.001, 50); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := e.client.GetInstance(ctx, e.i4g)
	if cloud.ClassOf(err) != cloud.ClassCanceled || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second call: %v, want canceled while waiting for a token", err)
	}
	if n := e.srv.Stats().Ops[bcesim.OpGetInstance].Calls; n != 1 {
		t.Fatalf("%d calls reached the simulator, want 1", n)
	}
	if n := metricValue(t, e.reg, "cce_ipam_cloud_api_calls_total", "operation", "GetInstance", "result", "canceled"); n != 1 {
		t.Fatalf("calls_total{GetInstance,canceled} = %v, want 1", n)
	}
}
