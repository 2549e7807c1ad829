package subnet

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestConfig_DefaultsAreTheFlags(t *testing.T) {
	var flagged Config
	flagged.RegisterFlags(pflag.NewFlagSet("test", pflag.ContinueOnError))
	want := Config{SyncPeriod: 15 * time.Second}
	if flagged != want || DefaultConfig() != want {
		t.Fatalf("flag default %+v, DefaultConfig %+v, want %+v", flagged, DefaultConfig(), want)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("the default rejected: %v", err)
	}
}

func TestConfig_Validate_RejectsNonPositivePeriod(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		if err := (Config{SyncPeriod: d}).Validate(); err == nil {
			t.Errorf("sync period %s accepted", d)
		}
	}
}

func TestNewController_PanicsOnInvalidConfig(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewController accepted a zero sync period")
		}
	}()
	NewController(Config{}, nil, nil, nil, nil)
}
