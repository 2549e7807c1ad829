package kubeletsim

import "container/heap"

// placement is the simulator's scheduler: it counts the pods on every
// simulated node and picks the least loaded one with room (ties go to the
// lowest name, so a fresh cluster fills round-robin). It is pure and not safe
// for concurrent use; the Simulator guards it with a mutex.
type placement struct {
	maxPods int // 0 means unlimited
	heap    slotHeap
	byName  map[string]*slot
	podNode map[string]string // pod key → node it counts against
	counts  map[string]int    // node → pods counted, eligible or not
}

type slot struct {
	name  string
	load  int
	index int
}

func newPlacement(maxPods int) *placement {
	return &placement{
		maxPods: maxPods,
		byName:  map[string]*slot{},
		podNode: map[string]string{},
		counts:  map[string]int{},
	}
}

// addNode makes a node eligible. Adding a known node is a no-op.
func (p *placement) addNode(name string) {
	if _, ok := p.byName[name]; ok {
		return
	}
	s := &slot{
		name: name,
		load: p.counts[name],
	}
	p.byName[name] = s
	heap.Push(&p.heap, s)
}

// removeNode makes a node ineligible; its pods stay counted against it in
// case it comes back.
func (p *placement) removeNode(name string) {
	s, ok := p.byName[name]
	if !ok {
		return
	}
	heap.Remove(&p.heap, s.index)
	delete(p.byName, name)
}

func (p *placement) hasNode(name string) bool {
	_, ok := p.byName[name]
	return ok
}

// assign counts pod against node (moving it if it counted elsewhere). It is
// idempotent, so every observation of a bound pod may call it.
func (p *placement) assign(pod, node string) {
	if old, ok := p.podNode[pod]; ok {
		if old == node {
			return
		}
		p.adjust(old, -1)
	}
	p.podNode[pod] = node
	p.adjust(node, +1)
}

// forget stops counting pod.
func (p *placement) forget(pod string) {
	if old, ok := p.podNode[pod]; ok {
		delete(p.podNode, pod)
		p.adjust(old, -1)
	}
}

func (p *placement) adjust(node string, d int) {
	p.counts[node] += d
	if p.counts[node] == 0 {
		delete(p.counts, node)
	}
	if s, ok := p.byName[node]; ok {
		s.load += d
		heap.Fix(&p.heap, s.index)
	}
}

// pick returns the least loaded node with room, or false when there is none.
func (p *placement) pick() (string, bool) {
	if len(p.heap) == 0 {
		return "", false
	}
	s := p.heap[0]
	if p.maxPods > 0 && s.load >= p.maxPods {
		return "", false
	}
	return s.name, true
}

// load returns the pods counted against node.
func (p *placement) load(node string) int {
	if s, ok := p.byName[node]; ok {
		return s.load
	}
	return 0
}

type slotHeap []*slot

func (h slotHeap) Len() int { return len(h) }
func (h slotHeap) Less(i, j int) bool {
	if h[i].load != h[j].load {
		return h[i].load < h[j].load
	}
	return h[i].name < h[j].name
}
func (h slotHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *slotHeap) Push(x any) {
	s := x.(*slot)
	s.index = len(*h)
	*h = append(*h, s)
}
func (h *slotHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return s
}
