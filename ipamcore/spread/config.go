package spread

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Config tunes the controllers. The default is the flags' (RegisterFlags,
// DefaultConfig).
type Config struct {
	// Workers is the number of reconciles each controller (PSTS status,
	// PSTT) runs at once. Defaults to 2.
	Workers int
	// ResyncPeriod is how often every PodSubnetTopologySpread and
	// PodSubnetTopologySpreadTable is reconciled without an event, to
	// repair what a missed event left behind. Defaults to 5m.
	ResyncPeriod time.Duration
}

// RegisterFlags binds the config to flags and sets the defaults.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.Workers, "spread-workers", 2,
		"reconciles each PodSubnetTopologySpread controller (status, table) runs at once")
	fs.DurationVar(&c.ResyncPeriod, "spread-resync-period", 5*time.Minute,
		"how often every PodSubnetTopologySpread and table is reconciled without an event")
}

// DefaultConfig is the config of a command line without flags.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("spread", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	if c.Workers <= 0 {
		return fmt.Errorf("spread: workers %d must be positive", c.Workers)
	}
	if c.ResyncPeriod <= 0 {
		return fmt.Errorf("spread: resync period %s must be positive", c.ResyncPeriod)
	}
	return nil
}
