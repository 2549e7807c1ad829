package ipclaim

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestConfig_DefaultsAreTheFlags(t *testing.T) {
	var flagged Config
	flagged.RegisterFlags(pflag.NewFlagSet("test", pflag.ContinueOnError))
	want := Config{Cooling: 5 * time.Second, InUseBackoff: time.Minute, OrphanGrace: 2 * time.Minute,
		KeeperPeriod: 30 * time.Second, PickAttempts: 32}
	if flagged != want || DefaultConfig() != want {
		t.Fatalf("flag default %+v, DefaultConfig %+v, want %+v", flagged, DefaultConfig(), want)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("the default rejected: %v", err)
	}
}

func TestConfig_Validate_RejectsEachBadField(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Config)
		want   string
	}{
		"negative cooling": {func(c *Config) { c.Cooling = -time.Second }, "cooling"},
		"zero backoff":     {func(c *Config) { c.InUseBackoff = 0 }, "in-use backoff"},
		"zero grace":       {func(c *Config) { c.OrphanGrace = 0 }, "orphan grace"},
		"zero period":      {func(c *Config) { c.KeeperPeriod = 0 }, "keeper period"},
		"zero attempts":    {func(c *Config) { c.PickAttempts = 0 }, "pick attempts"},
	} {
		c := DefaultConfig()
		tc.change(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error about %s", name, err, tc.want)
		}
	}
	c := DefaultConfig()
	c.Cooling = 0 // no cooling is a valid choice
	if err := c.Validate(); err != nil {
		t.Errorf("zero cooling rejected: %v", err)
	}
}

func TestNew_PanicsOnInvalidConfig(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted a zero config")
		}
	}()
	New(Config{}, nil, nil, nil, nil, nil)
}

func TestNewKeeper_RejectsInvalidConfigAndMissingDeps(t *testing.T) {
	if _, err := NewKeeper(Config{}, KeeperDeps{}, nil, nil); err == nil {
		t.Error("NewKeeper accepted a zero config")
	}
	if _, err := NewKeeper(DefaultConfig(), KeeperDeps{}, nil, nil); err == nil {
		t.Error("NewKeeper accepted no client and no informers")
	}
}
