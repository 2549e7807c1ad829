package ipam

import (
	"sync/atomic"
	"testing"
	"time"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A watching holder learns when another call comes for its key, and only
// then: not from calls for other keys, nor from a call that came for an
// earlier holding. A holder that finds a call already waiting learns at once.
func TestKeyedMutex_LockWatchedSignalsWaiters(t *testing.T) {
	var k keyedMutex
	unlock, waited := k.lockWatched("p")
	k.lock("q")()
	if closed(waited) {
		t.Fatal("waited closed by a call for another key")
	}
	got := make(chan func())
	go func() { got <- k.lock("p") }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("waited not closed while a call waits for the key")
	}
	select {
	case <-got:
		t.Fatal("the waiting call got the lock while it was held")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	unlock2 := <-got

	// A holding watched after that one: its channel is its own.
	third := make(chan func())
	go func() {
		u, w := k.lockWatched("p")
		if closed(w) {
			t.Error("a fresh holding's waited is closed with no one waiting")
		}
		third <- u
	}()
	// The third call now waits behind unlock2's holding, which does not watch.
	time.Sleep(50 * time.Millisecond)
	unlock2()
	unlock3 := <-third

	// A call already waiting when a watched holding begins: closed at once.
	// Which of the two waiters gets the lock first is the runtime's choice;
	// whenever the watcher does, the other still waits.
	var bGot atomic.Bool
	bDone := make(chan struct{})
	go func() {
		u := k.lock("p")
		bGot.Store(true)
		u()
		close(bDone)
	}()
	waiting := func(n int) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.locks["p"] != nil && k.locks["p"].refs == n
	}
	for !waiting(2) { // b waits behind unlock3's holding
		time.Sleep(time.Millisecond)
	}
	cDone := make(chan struct{})
	go func() {
		defer close(cDone)
		u, w := k.lockWatched("p")
		if first := !bGot.Load(); first && !closed(w) {
			t.Error("a watched holding began with a call waiting, and its waited is open")
		} else if !first && closed(w) {
			t.Error("a watched holding began with no call waiting, and its waited is closed")
		}
		u()
	}()
	time.Sleep(80 * time.Millisecond)
	unlock3()
	<-bDone
	<-cDone
}
