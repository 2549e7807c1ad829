package bcesim

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// testSeed returns BCESIM_SEED if set, else a fresh seed; it is logged so a
// failing random run can be replayed.
func testSeed(t testing.TB) uint64 {
	if s := os.Getenv("BCESIM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("BCESIM_SEED=%q: %v", s, err)
		}
		t.Logf("seed %d (from BCESIM_SEED)", v)
		return v
	}
	v := uint64(time.Now().UnixNano())
	t.Logf("seed %d (replay with BCESIM_SEED=%d)", v, v)
	return v
}
