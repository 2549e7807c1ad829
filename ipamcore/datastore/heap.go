package datastore

import "time"

// idleHeap orders one ENI's idle addresses by (readyAt, seq): the head is
// the address that became usable first, i.e. the one idle longest. Released
// addresses get readyAt = release time + cooldown and fresh ones readyAt =
// add time, so if the head is still cooling every other entry is too and
// Allocate can decide in O(1). A hand-written heap (instead of
// container/heap) keeps the hot path free of interface boxing and lets each
// record remember its index for O(log n) removal.
type idleHeap []*ipRecord

func less(a, b *ipRecord) bool {
	if !a.readyAt.Equal(b.readyAt) {
		return a.readyAt.Before(b.readyAt)
	}
	return a.seq < b.seq
}

func (h *idleHeap) push(r *ipRecord) {
	r.heapIndex = len(*h)
	*h = append(*h, r)
	h.up(r.heapIndex)
}

func (h idleHeap) peek() *ipRecord {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}

// remove takes r out of the heap; r must be in it.
func (h *idleHeap) remove(r *ipRecord) {
	old := *h
	i := r.heapIndex
	last := len(old) - 1
	if i != last {
		old[i] = old[last]
		old[i].heapIndex = i
	}
	old[last] = nil
	*h = old[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	r.heapIndex = -1
}

func (h idleHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(h[i], h[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down reports whether the element moved.
func (h idleHeap) down(i int) bool {
	start := i
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && less(h[r], h[l]) {
			c = r
		}
		if !less(h[c], h[i]) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i != start
}

func (h idleHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex = i
	h[j].heapIndex = j
}

// readyHead returns the head if it may be handed out at now.
func (h idleHeap) readyHead(now time.Time) *ipRecord {
	r := h.peek()
	if r == nil || r.readyAt.After(now) {
		return nil
	}
	return r
}
