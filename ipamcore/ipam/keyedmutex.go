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
}

// lock locks key and returns its unlock func.
func (k *keyedMutex) lock(key string) func() { return k.lockAfter(key, nil) }

// others reports how many calls hold or wait for key besides one holder.
func (k *keyedMutex) others(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if m, ok := k.locks[key]; ok {
		return m.refs - 1
	}
	return 0
}

// lockAfter is lock; queued, if set, runs once this call counts among
// key's others and before it waits for the lock.
func (k *keyedMutex) lockAfter(key string, queued func()) func() {
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
	k.mu.Unlock()
	if queued != nil {
		queued()
	}

	m.Lock()
	return func() {
		m.Unlock()
		k.mu.Lock()
		m.refs--
		if m.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
