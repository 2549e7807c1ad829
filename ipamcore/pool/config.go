package pool

import (
	"errors"
	"fmt"
	"time"
)

// Config holds the per-node pool bounds. The zero value is not valid; use
// DefaultConfig or fill every field.
type Config struct {
	// MinIdle: the pool grows when fewer idle addresses remain. The
	// reference's --idle-ip-pool-min-size (default 0, forced to 1).
	MinIdle int
	// MaxIdle: the pool is trimmed when more idle addresses remain. The
	// reference's --idle-ip-pool-max-size (default 6); the reference only
	// consulted it on release and never trimmed.
	MaxIdle int
	// Batch is the smallest growth step, at most MaxIPsPerCall. The
	// reference's --batch-add-ip-num (default 4).
	Batch int
	// TrimBatch is the most addresses one trim plan returns, so a large
	// excess is given back over several rounds (each costs a cloud call).
	TrimBatch int
	// MinLifetime: an address younger than this is not returned to the
	// cloud, because a delete right after an add may miss the replica and
	// leak (reference: 5s).
	MinLifetime time.Duration
	// Backoff paces retries on an ENI that reported it cannot take more.
	Backoff BackoffPolicy
}

// DefaultConfig matches the reference's defaults.
func DefaultConfig() Config {
	return Config{
		MinIdle: 1, MaxIdle: 6, Batch: 4, TrimBatch: 10,
		MinLifetime: 5 * time.Second,
		Backoff:     DefaultBackoffPolicy(),
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.MinIdle < 1 {
		errs = append(errs, fmt.Errorf("min idle %d: need at least 1", c.MinIdle))
	}
	if c.MaxIdle < c.MinIdle {
		errs = append(errs, fmt.Errorf("max idle %d below min idle %d", c.MaxIdle, c.MinIdle))
	}
	if c.Batch < 1 || c.Batch > MaxIPsPerCall {
		errs = append(errs, fmt.Errorf("batch %d: want 1..%d", c.Batch, MaxIPsPerCall))
	}
	if c.TrimBatch < 1 {
		errs = append(errs, fmt.Errorf("trim batch %d: need at least 1", c.TrimBatch))
	}
	if c.MinLifetime < 0 {
		errs = append(errs, fmt.Errorf("negative min lifetime %s", c.MinLifetime))
	}
	if err := c.Backoff.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
