package ipam

import "sync"

// keyedMutex serialises work per key (a pod) without one lock for all keys:
// ADD and DEL of the same pod take turns, different pods never wait.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
	// waited is the watching holder's channel (lockWatched), closed when
	// another call comes for the key; nil once closed or not watched.
	waited chan struct{}
}

// lock locks key and returns its unlock func.
func (k *keyedMutex) lock(key string) func() {
	unlock, _ := k.acquire(key, false)
	return unlock
}

// lockWatched is lock, and also returns a channel closed once another call
// waits for key while this one holds it: a holder that could go faster
// when someone waits (a release finishing after its answer) learns so.
func (k *keyedMutex) lockWatched(key string) (unlock func(), waited <-chan struct{}) {
	return k.acquire(key, true)
}

func (k *keyedMutex) acquire(key string, watch bool) (func(), <-chan struct{}) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*refMutex{}
	}
	m, ok := k.locks[key]
	if !ok {
		m = &refMutex{}
		k.locks[key] = m
	}
	m.refs++
	if m.waited != nil {
		close(m.waited)
		m.waited = nil
	}
	k.mu.Unlock()

	m.Lock()
	var waited chan struct{}
	if watch {
		waited = make(chan struct{})
		k.mu.Lock()
		if m.refs > 1 {
			close(waited)
		} else {
			m.waited = waited
		}
		k.mu.Unlock()
	}
	return func() {
		// Counted out before the unlock, so that the next holder counts
		// only calls still to come (refs is not a lock: the holding is
		// over once this runs).
		k.mu.Lock()
		if waited != nil && m.waited == waited {
			m.waited = nil
		}
		m.refs--
		if m.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
		m.Unlock()
	}, waited
}
