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

// The defaults live in RegisterFlags only; DefaultConfig is exactly what the
// flags give, and valid once the one required field is set.
func TestConfig_DefaultsAreTheFlags(t *testing.T) {
	var flags Config
	flags.RegisterFlags(pflag.NewFlagSet("t", pflag.ContinueOnError))
	def := DefaultConfig()
	if def.JoinInterval != flags.JoinInterval || def.DeadNodeReclaimTime != 30*time.Second || def.NamePrefix == "" ||
		def.ProbeInterval != time.Second || def.SuspicionMult != 4 || def.ClusterLabel != "cce-ipam" {
		t.Fatalf("DefaultConfig = %+v, want the flag defaults", def)
	}
	def.GRPCAddr = "10.0.0.9:9090"
	if err := def.Validate(); err != nil {
		t.Fatal(err)
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
		"negative interval": {func(c *Config) { c.JoinInterval = -1 }, "must be positive"},
		"zero timeout":      {func(c *Config) { c.TCPTimeout = 0 }, "must be positive"},
		"no name prefix":    {func(c *Config) { c.NamePrefix = "" }, "name prefix is required"},
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
	okLeader := DefaultLeaderConfig()
	if err := okLeader.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*LeaderConfig){
		"no namespace":        func(l *LeaderConfig) { l.Namespace = "" },
		"no name":             func(l *LeaderConfig) { l.Name = "" },
		"lease ≤ renew":       func(l *LeaderConfig) { l.LeaseDuration, l.RenewDeadline = 2*time.Second, 2*time.Second },
		"renew ≤ 1.2 × retry": func(l *LeaderConfig) { l.RenewDeadline, l.RetryPeriod = time.Second, time.Second },
		"no retry period":     func(l *LeaderConfig) { l.RetryPeriod = 0 },
	} {
		l := okLeader
		mod(&l)
		if err := l.Validate(); err == nil {
			t.Errorf("%s: LeaderConfig.Validate accepted %+v", name, l)
		}
	}
}
