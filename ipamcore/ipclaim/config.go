package ipclaim

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Config tunes the Ledger and the Keeper. The defaults are the flags'
// (RegisterFlags, DefaultConfig).
type Config struct {
	// Cooling is how long a freed address stays untouchable: Reserve refuses
	// a free claim until ReleasedAt + Cooling, while the old pod's datapath
	// drains. Defaults to 5s (the reference's address cooling period).
	Cooling time.Duration
	// InUseBackoff is how long Block keeps everyone off an address the
	// cloud says is in use outside the ledger. Defaults to 1m.
	InUseBackoff time.Duration
	// OrphanGrace is how long a held claim whose holder has no wep naming
	// the address is left alone before the Keeper frees it; far above the
	// 30 s ADD deadline, so that the node's owner can finish. A Reserve by
	// the holder refreshes the claim once half of it has passed. Defaults
	// to 2m.
	OrphanGrace time.Duration
	// KeeperPeriod is how often the Keeper goes over every claim and wep
	// (besides the passes that events trigger). Defaults to 30s.
	KeeperPeriod time.Duration
	// PickAttempts bounds the API attempts (lost races) of one Pick.
	// Defaults to 32.
	PickAttempts int
}

// RegisterFlags binds the config to flags and sets the defaults.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&c.Cooling, "claim-cooling-period", 5*time.Second,
		"how long a freed exclusive-subnet address (IPClaim) cannot be taken again")
	fs.DurationVar(&c.InUseBackoff, "claim-in-use-backoff", time.Minute,
		"how long nobody takes an exclusive-subnet address that the cloud said is in use outside the ledger")
	fs.DurationVar(&c.OrphanGrace, "claim-orphan-grace", 2*time.Minute,
		"how long a held IPClaim without a wep naming its address is kept before the leader frees it")
	fs.DurationVar(&c.KeeperPeriod, "claim-keeper-period", 30*time.Second,
		"how often the leader checks every IPClaim (orphans, adoption of reference weps, claims of unlisted subnets)")
	fs.IntVar(&c.PickAttempts, "claim-pick-attempts", 32,
		"most reservations one pick of an exclusive-subnet address tries before it reports the subnet as contended")
}

// DefaultConfig is the config of a command line without flags.
func DefaultConfig() Config {
	var c Config
	c.RegisterFlags(pflag.NewFlagSet("ipclaim", pflag.ContinueOnError))
	return c
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Cooling < 0 {
		errs = append(errs, fmt.Errorf("cooling period %s must not be negative", c.Cooling))
	}
	if c.InUseBackoff <= 0 {
		errs = append(errs, fmt.Errorf("in-use backoff %s must be positive", c.InUseBackoff))
	}
	if c.OrphanGrace <= 0 {
		errs = append(errs, fmt.Errorf("orphan grace %s must be positive", c.OrphanGrace))
	}
	if c.KeeperPeriod <= 0 {
		errs = append(errs, fmt.Errorf("keeper period %s must be positive", c.KeeperPeriod))
	}
	if c.PickAttempts <= 0 {
		errs = append(errs, fmt.Errorf("pick attempts %d must be positive", c.PickAttempts))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ipclaim: %w", err)
	}
	return nil
}
