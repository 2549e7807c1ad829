package ipam

import (
	"sync/atomic"
	"testing"
	"time"
)

// The finish queue runs one finish at a time while CNI calls are in flight
// and finishSlots once none is, in the order they came, and a finish whose
// node stops waiting leaves the queue without a slot.
func TestFinishQueue_LimitFollowsTheCNIPath(t *testing.T) {
	var busy atomic.Bool
	q := &finishQueue{busy: busy.Load}
	busy.Store(true)
	if !q.wait(nil) {
		t.Fatal("the first finish did not get a slot while nothing ran")
	}
	started := make(chan int, 10)
	stop := make(chan struct{})
	granted := make(chan bool, 10)
	for k := 1; k <= 5; k++ {
		go func() {
			var s <-chan struct{}
			if k == 5 {
				s = stop
			}
			g := q.wait(s)
			granted <- g
			if g {
				started <- k
			}
		}()
		waitFor(t, func() bool { q.mu.Lock(); defer q.mu.Unlock(); return len(q.waiting) == k })
	}
	select {
	case k := <-started:
		t.Fatalf("finish %d started beside another while CNI calls were in flight", k)
	case <-time.After(50 * time.Millisecond):
	}
	q.done() // the first ends: the next in line runs, one at a time
	if k := <-started; k != 1 {
		t.Fatalf("finish %d started first, want 1 (the order they came)", k)
	}
	busy.Store(false)
	q.kick() // the CNI path went quiet: up to finishSlots run
	got := map[int]bool{}
	for range finishSlots - 1 {
		got[<-started] = true
	}
	if !got[2] || !got[3] || !got[4] {
		t.Fatalf("after the CNI path went quiet, finishes %v started; want 2, 3 and 4", got)
	}
	close(stop) // finish 5's node stops being served: it goes without a slot
	for range 5 {
		if g := <-granted; !g {
			q.mu.Lock()
			running := q.running
			q.mu.Unlock()
			if running != finishSlots {
				t.Errorf("running = %d after a finish left without a slot, want %d", running, finishSlots)
			}
			return
		}
	}
	t.Fatal("finish 5 never left the queue")
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached within 5 s")
}
