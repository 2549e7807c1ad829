package bench

import (
	"os"
	"testing"
)

func TestProcMem_ReadsOwnProcess(t *testing.T) {
	hwm, rss, anon := procMem(os.Getpid())
	if anon <= 0 || rss < anon || hwm < rss {
		t.Fatalf("procMem(self) = hwm %v, rss %v, anon %v; want 0 < anon ≤ rss ≤ hwm", hwm, rss, anon)
	}
	if h, r, a := procMem(0); h != 0 || r != 0 || a != 0 {
		t.Fatalf("procMem(0) = %v %v %v, want zeros", h, r, a)
	}
}
