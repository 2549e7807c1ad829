package ipam

import "sync"

// finishQueue orders the releases finished after their DEL's answer
// (pendingFinish): first come, first run, and how many run at once depends on
// the CNI path. While CNI calls are in flight on this replica one runs at a
// time, so that a burst of calls keeps nearly all of the API server's
// attention (with a fixed 4, at 8 DELs in flight the patches took a third of
// the writes, and with 3 replicas, 12 against 8); once no call is in flight
// finishSlots run, so that the backlog drains. One always may run: the
// backlog cannot starve under a steady stream of calls.
type finishQueue struct {
	busy func() bool // CNI calls are in flight here

	mu      sync.Mutex
	running int
	waiting []chan struct{} // granted by close, in order
}

func (q *finishQueue) limitLocked() int {
	if q.busy != nil && q.busy() {
		return 1
	}
	return finishSlots
}

// wait returns once this finish may run, or when stop is closed (then it
// runs without a slot: granted is false). done must be called after a
// granted run.
func (q *finishQueue) wait(stop <-chan struct{}) (granted bool) {
	q.mu.Lock()
	if len(q.waiting) == 0 && q.running < q.limitLocked() {
		q.running++
		q.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	q.waiting = append(q.waiting, ch)
	q.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-stop:
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, w := range q.waiting {
		if w == ch {
			q.waiting = append(q.waiting[:k], q.waiting[k+1:]...)
			return false
		}
	}
	return true // granted meanwhile
}

// done ends a granted run.
func (q *finishQueue) done() {
	q.mu.Lock()
	q.running--
	q.grantLocked()
	q.mu.Unlock()
}

// kick lets waiting finishes run if the limit allows more now (the CNI
// path went quiet).
func (q *finishQueue) kick() {
	q.mu.Lock()
	q.grantLocked()
	q.mu.Unlock()
}

func (q *finishQueue) grantLocked() {
	for len(q.waiting) > 0 && q.running < q.limitLocked() {
		close(q.waiting[0])
		q.waiting = q.waiting[1:]
		q.running++
	}
}
