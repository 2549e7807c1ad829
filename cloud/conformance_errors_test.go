package cloud_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// Each case provokes one BCE error through the real SDK and checks that the
// client classifies it by code: Class, the errors.Is sentinel, and the code.
func TestConformance_ErrorCodes(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name     string
		sim      bcesim.Config
		provoke  func(t *testing.T, e *env) error
		class    cloud.Class
		sentinel error
		code     string
		status   int
	}{
		{
			name: "unknown ENI",
			provoke: func(t *testing.T, e *env) error {
				_, err := e.client.GetENI(ctx, "eni-missing")
				return err
			},
			class: cloud.ClassENINotFound, sentinel: cloud.ErrENINotFound, code: bcesim.CodeEniID, status: 400,
		},
		{
			name: "subnet has no more IP",
			provoke: func(t *testing.T, e *env) error {
				id := createENI(t, e, "n", e.small) // 13 usable: 12 left
				if _, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{Count: 10}); err != nil {
					t.Fatal(err)
				}
				_, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{Count: 3})
				return err
			},
			class: cloud.ClassSubnetHasNoMoreIP, sentinel: cloud.ErrSubnetHasNoMoreIP, code: bcesim.CodeSubnetNoMoreIP, status: 400,
		},
		{
			name: "VM memory cannot attach more IP",
			provoke: func(t *testing.T, e *env) error {
				id := createENI(t, e, "n", e.subnet)
				attach(t, e, id, e.i4g) // 4 GB: 8 addresses per ENI, primary included
				if _, err := e.client.BatchAddPrivateIPs(ctx, id, cloud.BatchAddRequest{Count: 7}); err != nil {
					t.Fatal(err)
				}
				_, err := e.client.AddPrivateIP(ctx, id, "")
				return err
			},
			class: cloud.ClassVMMemoryCannotAttachMoreIP, sentinel: cloud.ErrVMMemoryCannotAttachMoreIP, code: bcesim.CodeVMMemoryIPCap, status: 400,
		},
		{
			name: "private IP in use",
			provoke: func(t *testing.T, e *env) error {
				a := createENI(t, e, "a", e.subnet)
				b := createENI(t, e, "b", e.subnet)
				got, _ := e.client.GetENI(ctx, a)
				_, err := e.client.BatchAddPrivateIPs(ctx, b, cloud.BatchAddRequest{IPs: []string{got.PrimaryIP()}})
				return err
			},
			class: cloud.ClassPrivateIPInUse, sentinel: cloud.ErrPrivateIPInUse, code: bcesim.CodePrivateIPInUse, status: 400,
		},
		{
			name: "private IP not on the ENI",
			provoke: func(t *testing.T, e *env) error {
				return e.client.DeletePrivateIP(ctx, createENI(t, e, "n", e.subnet), "10.0.0.99")
			},
			class: cloud.ClassPrivateIPNotFound, sentinel: cloud.ErrPrivateIPNotFound, code: bcesim.CodePrivateIPNotExist, status: 400,
		},
		{
			name: "VPC quota of unattached ENIs",
			sim:  bcesim.Config{World: bcesim.WorldConfig{MaxUnattachedENIsPerVPC: 1}},
			provoke: func(t *testing.T, e *env) error {
				createENI(t, e, "first", e.subnet)
				_, err := e.client.CreateENI(ctx, cloud.CreateENIRequest{Name: "second", SubnetID: e.subnet, SecurityGroupIDs: []string{e.sg}})
				return err
			},
			class: cloud.ClassQuotaExceeded, sentinel: cloud.ErrQuotaExceeded, code: bcesim.CodeQuotaLimitExceeded, status: 400,
		},
		{
			name: "unknown subnet",
			provoke: func(t *testing.T, e *env) error {
				_, err := e.client.DescribeSubnet(ctx, "sbn-missing")
				return err
			},
			class: cloud.ClassNotFound, sentinel: cloud.ErrNotFound, code: bcesim.CodeNoSuchObject, status: 404,
		},
		{
			name: "rate limit answered 429, retried, then given up",
			sim:  bcesim.Config{RateLimits: map[bcesim.Op]bcesim.RateLimit{bcesim.OpGetInstance: {QPS: 0.001, Burst: 1}}},
			provoke: func(t *testing.T, e *env) error {
				if _, err := e.client.GetInstance(ctx, e.i4g); err != nil {
					t.Fatal(err)
				}
				_, err := e.client.GetInstance(ctx, e.i4g)
				if n := metricValue(t, e.reg, "cce_ipam_cloud_api_throttled_total", "operation", "GetInstance"); n != 2 {
					t.Errorf("throttled_total = %v, want 2 (first try and one retry)", n)
				}
				if n := e.srv.Stats().Ops[bcesim.OpGetInstance].Throttled; n != 2 {
					t.Errorf("simulator saw %d throttled calls, want 2", n)
				}
				return err
			},
			class: cloud.ClassRateLimit, sentinel: cloud.ErrRateLimit, code: bcesim.CodeRateLimit, status: 429,
		},
		{
			name: "invalid request caught before calling",
			provoke: func(t *testing.T, e *env) error {
				return e.client.DeletePrivateIP(ctx, "eni-x", "10.0.0.1/../../x")
			},
			class: cloud.ClassInvalidRequest, sentinel: cloud.ErrInvalidRequest,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{sim: tc.sim, client: cloud.Config{ThrottleRetries: 1}})
			err := tc.provoke(t, e)
			var ce *cloud.Error
			if !errors.As(err, &ce) {
				t.Fatalf("want *cloud.Error, got %T %v", err, err)
			}
			if ce.Class != tc.class || !errors.Is(err, tc.sentinel) || ce.Code != tc.code || ce.StatusCode != tc.status {
				t.Fatalf("got class %v code %q status %d (%v); want %v %q %d", ce.Class, ce.Code, ce.StatusCode, err, tc.class, tc.code, tc.status)
			}
			if res := metricValue(t, e.reg, "cce_ipam_cloud_api_calls_total", "operation", ce.Op, "result", tc.class.String()); tc.code != "" && res != 1 {
				t.Fatalf("calls_total{%s,%s} = %v, want 1", ce.Op, tc.class, res)
			}
			if err := e.srv.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestConformance_BadSignatureKeepsSecretsOutOfErrors(t *testing.T) {
	const wrongSK = "SK-wrong-but-still-secret"
	e := newEnv(t, envOpts{client: cloud.Config{AccessKeyID: testAK, SecretAccessKey: wrongSK}})
	_, err := e.client.GetENI(context.Background(), "eni-x")
	var ce *cloud.Error
	if !errors.As(err, &ce) || ce.Class != cloud.ClassAuth || ce.Code != bcesim.CodeSignatureMismatch || ce.StatusCode != 400 {
		t.Fatalf("wrong secret: %v", err)
	}
	if strings.Contains(err.Error(), wrongSK) || strings.Contains(err.Error(), testAK) {
		t.Fatalf("error leaks a credential: %v", err)
	}
}

func TestConformance_CredentialsFromSecretDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, cloud.AccessKeyIDFile), []byte(testAK+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, cloud.SecretAccessKeyFile), []byte(testSK+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOpts{client: cloud.Config{CredentialsDir: dir}})
	if _, err := e.client.GetInstance(context.Background(), e.i4g); err != nil {
		t.Fatalf("signed with keys from %s: %v", dir, err)
	}

	os.Remove(filepath.Join(dir, cloud.SecretAccessKeyFile))
	cfg := cloud.DefaultConfig()
	cfg.Endpoint, cfg.CredentialsDir = "127.0.0.1:1", dir
	_, err := cloud.New(cfg, nil, nil)
	if err == nil || !strings.Contains(err.Error(), cloud.SecretAccessKeyFile) || strings.Contains(err.Error(), testAK) {
		t.Fatalf("missing secret file: %v", err)
	}
}

// With the SDK's retries disabled a 5xx after the mutation reaches the caller
// as ClassServer (retryable), and the mutation stays applied exactly once.
func TestConformance_ServerErrorWithoutSDKRetry(t *testing.T) {
	e := newEnv(t, envOpts{client: cloud.Config{SDKRetries: -1}})
	id := createENI(t, e, "n", e.subnet)
	if err := e.srv.SetFaults(bcesim.Faults{FailAfterMutation: map[bcesim.Op]int{bcesim.OpBatchAddPrivateIP: 1}}); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.BatchAddPrivateIPs(context.Background(), id, cloud.BatchAddRequest{Count: 2})
	if cloud.ClassOf(err) != cloud.ClassServer || !cloud.ClassOf(err).Retryable() {
		t.Fatalf("want a retryable server error, got %v", err)
	}
	if calls := e.srv.Stats().Ops[bcesim.OpBatchAddPrivateIP].Calls; calls != 1 {
		t.Fatalf("%d calls reached the simulator, want 1", calls)
	}
	if got, _ := e.client.GetENI(context.Background(), id); len(got.PrivateIPs) != 3 {
		t.Fatalf("eni holds %d addresses, want 3", len(got.PrivateIPs))
	}
}
