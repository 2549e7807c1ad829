package shard

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// The flags keep their names and defaults (users' command lines must not
// change), and those defaults are a config that works.
func TestConfig_DefaultsAreTheFlagsAndValid(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	c := DefaultConfig()
	want := Config{
		Namespace:       "kube-system",
		Ring:            RingConfig{Partitions: 271, ReplicationFactor: 200, Load: 1.05, NodeLoad: 1.05},
		LeaseDuration:   6 * time.Second,
		RenewDeadline:   4 * time.Second,
		RenewPeriod:     time.Second,
		OwnerWait:       20 * time.Second,
		LeaveTimeout:    20 * time.Second,
		ColdStartSettle: 2 * time.Second,
		FencingPolicy:   "cce-ipam-wep-fencing",
	}
	if c != want {
		t.Fatalf("DefaultConfig() = %+v, want %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("the defaults do not validate: %v", err)
	}
	t.Setenv("POD_NAMESPACE", "ipam")
	if ns := DefaultConfig().Namespace; ns != "ipam" {
		t.Fatalf("namespace with POD_NAMESPACE=ipam: %q", ns)
	}
	var parsed Config
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	parsed.RegisterFlags(fs)
	if err := fs.Parse([]string{"--shard-partitions=7", "--shard-owner-wait=0", "--namespace=ns"}); err != nil {
		t.Fatal(err)
	}
	if parsed.Ring.Partitions != 7 || parsed.OwnerWait != 0 || parsed.Namespace != "ns" || parsed.LeaseDuration != 6*time.Second {
		t.Fatalf("parsed flags: %+v", parsed)
	}
}

// Validate refuses what the coordinator cannot use, and fills nothing in.
func TestConfig_ValidateRefusesUnusableValues(t *testing.T) {
	cases := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"zero config", func(c *Config) { *c = Config{} }, "namespace"},
		{"no namespace", func(c *Config) { c.Namespace = "" }, "namespace"},
		{"zero lease duration", func(c *Config) { c.LeaseDuration = 0 }, "positive"},
		{"negative owner wait", func(c *Config) { c.OwnerWait = -time.Second }, "negative"},
		{"deadline too close to the duration", func(c *Config) { c.RenewDeadline = 5 * time.Second }, "3/4"},
		{"period too long for the deadline", func(c *Config) { c.RenewPeriod = 3 * time.Second }, "two renewals"},
		{"ring not prime", func(c *Config) { c.Ring.Partitions = 100 }, "prime"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.change(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}
