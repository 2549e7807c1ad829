package membership

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestConfig_RegisterFlags(t *testing.T) {
	var c Config
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{
		"--memberlist-join=10.0.0.1:7946,cce-ipam-1.gossip:7946", "--memberlist-join-dns=cce-ipam-gossip.kube-system.svc",
		"--memberlist-grpc-advertise-addr=10.0.0.9:9090", "--memberlist-name-prefix=cce-ipam-0",
	}); err != nil {
		t.Fatal(err)
	}
	if c.BindPort != DefaultPort || c.BindAddr != "0.0.0.0" || c.JoinInterval != 10*time.Second || c.ProbeInterval != time.Second ||
		len(c.JoinSeeds) != 2 || c.ClusterLabel != "cce-ipam" {
		t.Fatalf("flags gave %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var l LeaderConfig
	l.RegisterFlags(fs)
	if err := fs.Parse([]string{"--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=500ms"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Validate(); err != nil || l.Namespace != "kube-system" || l.LeaseDuration != 3*time.Second {
		t.Fatalf("leader flags gave %+v, %v", l, err)
	}
}

func TestConfig_Validate(t *testing.T) {
	ok := fastConfig("ipam-a")
	for name, tc := range map[string]struct {
		mod  func(*Config)
		want string
	}{
		"no gRPC address":   {func(c *Config) { c.GRPCAddr = "" }, "gRPC advertise address is required"},
		"bad gRPC address":  {func(c *Config) { c.GRPCAddr = "nohost" }, "gRPC address"},
		"meta too long":     {func(c *Config) { c.Version = strings.Repeat("v", 600) }, "memberlist allows 512"},
		"bind not an IP":    {func(c *Config) { c.BindAddr = "localhost" }, "bind address"},
		"bad seed":          {func(c *Config) { c.JoinSeeds = []string{"10.0.0.1"} }, "join seed"},
		"bad DNS port":      {func(c *Config) { c.JoinDNS = "svc:x" }, "join DNS"},
		"negative interval": {func(c *Config) { c.JoinInterval = -1 }, "must not be negative"},
		"probe timeout":     {func(c *Config) { c.ProbeTimeout = time.Second }, "probe timeout"},
	} {
		c := ok
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want %q", name, err, tc.want)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]LeaderConfig{
		"no namespace":         {},
		"lease ≤ renew":        {Namespace: "ns", LeaseDuration: 2 * time.Second, RenewDeadline: 2 * time.Second},
		"renew ≤ 1.2 × retry ": {Namespace: "ns", RenewDeadline: time.Second, RetryPeriod: time.Second},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("%s: LeaderConfig.Validate accepted %+v", name, l)
		}
	}
}
