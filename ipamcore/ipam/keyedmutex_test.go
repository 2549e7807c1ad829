package ipam

import (
	"testing"
	"time"
)

// others counts the calls besides the holder, and lockAfter's func runs
// once its call is counted and before it waits.
func TestKeyedMutex_OthersAndLockAfter(t *testing.T) {
	var k keyedMutex
	if n := k.others("p"); n != 0 {
		t.Fatalf("others of a free key = %d, want 0", n)
	}
	unlock := k.lock("p")
	if n := k.others("p"); n != 0 {
		t.Fatalf("others with one holder = %d, want 0", n)
	}
	queued := make(chan int, 1)
	got := make(chan struct{})
	go func() {
		u := k.lockAfter("p", func() { queued <- k.others("p") })
		close(got)
		u()
	}()
	select {
	case n := <-queued:
		if n != 1 {
			t.Errorf("others seen by the waiter's func = %d, want 1", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("lockAfter's func did not run while the key was held")
	}
	select {
	case <-got:
		t.Fatal("the waiter got the lock while it was held")
	case <-time.After(50 * time.Millisecond):
	}
	if n := k.others("q"); n != 0 {
		t.Errorf("others of another key = %d, want 0", n)
	}
	unlock()
	<-got
}
