package spread

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestConfig_DefaultsAreTheFlags(t *testing.T) {
	var flagged Config
	flagged.RegisterFlags(pflag.NewFlagSet("test", pflag.ContinueOnError))
	want := Config{Workers: 2, ResyncPeriod: 5 * time.Minute}
	if flagged != want || DefaultConfig() != want {
		t.Fatalf("flag default %+v, DefaultConfig %+v, want %+v", flagged, DefaultConfig(), want)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("the default rejected: %v", err)
	}
}

func TestConfig_Validate_Rejects(t *testing.T) {
	for _, c := range []Config{
		{Workers: 0, ResyncPeriod: time.Minute},
		{Workers: 1, ResyncPeriod: 0},
		{Workers: -1, ResyncPeriod: -time.Second},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestNew_RequiresClients(t *testing.T) {
	if _, err := New(DefaultConfig(), Deps{}, nil, nil); err == nil {
		t.Fatal("New accepted no clients")
	}
	if _, err := New(Config{}, Deps{}, nil, nil); err == nil {
		t.Fatal("New accepted an invalid config")
	}
}
