package invariants

import (
	"strings"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/cloud/bcesim"
)

func TestCallLog_Budget(t *testing.T) {
	var l CallLog
	l.Window = 10
	from := time.Unix(1000, 0)
	// A read during second 1003 sees it partly; the next one whole.
	l.Add(time.Unix(1003, 0), []bcesim.SecondStats{{Unix: 995, Calls: 500}, {Unix: 1001, Calls: 70}, {Unix: 1003, Calls: 5}})
	l.Add(time.Unix(1010, 0), []bcesim.SecondStats{{Unix: 1003, Calls: 71}, {Unix: 1009, Calls: 3}})
	to := time.Unix(1010, 0)
	vs := l.Budget(from, to, 70)
	if len(vs) != 1 || vs[0].Kind != KindBudgetExceeded || !strings.HasPrefix(vs[0].Detail, "71 BCE calls") {
		t.Fatalf("want one second over the budget (71 at 1003; 500 at 995 is before the run):\n%s", vs)
	}
	if s, n := l.Busiest(from, to); s != 1003 || n != 71 {
		t.Fatalf("busiest: %d calls at %d", n, s)
	}
	if secs, calls := l.Seconds(from, to); secs != 11 || calls != 144 {
		t.Fatalf("seconds %d calls %d", secs, calls)
	}
	// A gap longer than the window loses seconds.
	l.Add(time.Unix(1030, 0), nil)
	vs = l.Budget(from, time.Unix(1030, 0), 100)
	if len(vs) != 1 || vs[0].Kind != KindCheckFailed {
		t.Fatalf("want the coverage gap reported:\n%s", vs)
	}
	l.Add(time.Unix(1020, 0), nil)
	if vs := l.Budget(from, time.Unix(1030, 0), 100); len(vs) != 0 {
		t.Fatalf("covered now:\n%s", vs)
	}
}
