package cloud_test

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

const (
	testAK   = "AKIDEXAMPLE0001"
	testSK   = "SKEXAMPLEsecret0001"
	testVPC  = "vpc-conf"
	testZone = "cn-bj-a"
)

// env is a started simulator plus a cloud.Client pointed at it.
type env struct {
	srv    *bcesim.Server
	client *cloud.Client
	reg    *prometheus.Registry
	clock  *clocktesting.FakeClock // the simulator's (its Config.Now takes a func() time.Time)
	subnet string                  // 10.0.0.0/24
	small  string                  // small subnet 10.0.1.0/28 (13 usable)
	sg     string
	// instances
	i4g   string // 2 vCPU, 4 GB: 2 ENIs, 8 IPs per ENI
	i128g string // 16 vCPU, 128 GB: 8 ENIs, 40 IPs per ENI
	// gate is what the client's gate asks (nil: open).
	gate atomic.Pointer[func() error]
}

// setGate makes the client's gate ask g; nil opens it.
func (e *env) setGate(g func() error) {
	if g == nil {
		e.gate.Store(nil)
		return
	}
	e.gate.Store(&g)
}

// testClientConfig is the tests' client: the defaults with fast retries, an
// unlimited rate and the simulator's keys, under the settings a test gives
// in o (its non-zero fields).
func testClientConfig(o cloud.Config) cloud.Config {
	c := cloud.DefaultConfig()
	c.OpLimits = nil // none unless the test sets some
	c.AccessKeyID, c.SecretAccessKey = testAK, testSK
	c.Rate, c.Burst = 1e6, 1e6
	c.SDKRetryBase = time.Millisecond // keep the retries of 5xx fast
	c.ThrottleBackoff = time.Millisecond
	if o.AccessKeyID != "" || o.CredentialsDir != "" {
		c.AccessKeyID, c.SecretAccessKey, c.CredentialsDir = o.AccessKeyID, o.SecretAccessKey, o.CredentialsDir
	}
	if o.Rate != 0 {
		c.Rate, c.Burst = o.Rate, o.Burst
	}
	for _, f := range []struct {
		dst *int
		src int
	}{{&c.ThrottleRetries, o.ThrottleRetries}, {&c.SDKRetries, o.SDKRetries}, {&c.PageSize, o.PageSize}} {
		if f.src != 0 {
			*f.dst = f.src
		}
	}
	for _, f := range []struct {
		dst *time.Duration
		src time.Duration
	}{{&c.ThrottleBackoff, o.ThrottleBackoff}, {&c.SDKRetryBase, o.SDKRetryBase}, {&c.Timeout, o.Timeout}} {
		if f.src != 0 {
			*f.dst = f.src
		}
	}
	if o.OpLimits != nil {
		c.OpLimits = o.OpLimits
	}
	return c
}

type envOpts struct {
	sim    bcesim.Config
	client cloud.Config
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	e := &env{clock: clocktesting.NewFakeClock(time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC))}
	cfg := o.sim
	if cfg.Credentials == nil {
		cfg.Credentials = map[string]string{testAK: testSK}
	}
	if cfg.Now == nil {
		cfg.Now = e.clock.Now
	}
	srv, err := bcesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	e.srv = srv
	must := func(id string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	e.subnet = must(srv.AddSubnet(bcesim.SubnetSpec{
		ID:       "sbn-main",
		ZoneName: testZone,
		CIDR:     "10.0.0.0/24",
		VPCID:    testVPC,
	}))
	e.small = must(srv.AddSubnet(bcesim.SubnetSpec{
		ID:       "sbn-small",
		ZoneName: testZone,
		CIDR:     "10.0.1.0/28",
		VPCID:    testVPC,
	}))
	e.sg = must(srv.AddSecurityGroup(bcesim.SecurityGroupSpec{
		ID:    "g-conf",
		VPCID: testVPC,
	}))
	e.i4g = must(srv.AddInstance(bcesim.InstanceSpec{
		ID:       "i-4g",
		SubnetID: e.subnet,
		CPUCount: 2,
		MemoryGB: 4,
	}))
	e.i128g = must(srv.AddInstance(bcesim.InstanceSpec{
		ID:       "i-128g",
		SubnetID: e.subnet,
		CPUCount: 16,
		MemoryGB: 128,
	}))

	cc := testClientConfig(o.client)
	cc.Endpoint = srv.URL()
	e.reg = prometheus.NewRegistry()
	// The client's gate is fixed at construction; tests swap what it asks.
	cl, err := cloud.New(cc, slog.New(slog.DiscardHandler), e.reg, cloud.WithGate(func() error {
		if g := e.gate.Load(); g != nil {
			return (*g)()
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.client = cl
	return e
}

// metricValue reads one counter, gauge or histogram count from reg; labels
// are given as name, value pairs. It returns 0 when the series is absent.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
