package kubeletsim

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestPlacement_Pick_LeastLoadedThenByName(t *testing.T) {
	p := newPlacement(0)
	if _, ok := p.pick(); ok {
		t.Fatal("picked a node from an empty placement")
	}
	for _, n := range []string{"c", "a", "b"} {
		p.addNode(n)
	}
	var got []string
	for k := range 6 {
		n, ok := p.pick()
		if !ok {
			t.Fatal("no node")
		}
		p.assign(fmt.Sprint("pod-", k), n)
		got = append(got, n)
	}
	if fmt.Sprint(got) != "[a b c a b c]" {
		t.Fatalf("picks %v, want round-robin by name", got)
	}
	p.forget("pod-1") // b drops to 1
	if n, _ := p.pick(); n != "b" {
		t.Fatalf("after forgetting a pod of b, picked %s", n)
	}
}

func TestPlacement_Pick_FullNodes(t *testing.T) {
	p := newPlacement(2)
	p.addNode("a")
	p.assign("x", "a")
	p.assign("y", "a")
	if n, ok := p.pick(); ok {
		t.Fatalf("picked full node %s", n)
	}
	p.assign("y", "a") // idempotent
	if p.load("a") != 2 {
		t.Fatalf("load %d after a repeated assign", p.load("a"))
	}
	p.forget("x")
	if n, ok := p.pick(); !ok || n != "a" {
		t.Fatalf("pick %q %v after room was made", n, ok)
	}
}

func TestPlacement_Nodes_ComeAndGo(t *testing.T) {
	p := newPlacement(0)
	p.assign("early", "a") // a pod seen before its node
	p.addNode("a")
	p.addNode("b")
	if p.load("a") != 1 {
		t.Fatalf("a pod assigned before its node was added is not counted: %d", p.load("a"))
	}
	p.removeNode("b")
	if p.hasNode("b") {
		t.Fatal("removed node still eligible")
	}
	if n, _ := p.pick(); n != "a" {
		t.Fatalf("picked %s, only a is left", n)
	}
	p.assign("early", "c") // moves off a
	if p.load("a") != 0 {
		t.Fatalf("moved pod still counted on a: %d", p.load("a"))
	}
}

// A seeded random walk against a simple reference: loads always equal the
// pods counted per node, and pick returns a least loaded eligible node.
func TestPlacement_RandomAgainstReference(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	p := newPlacement(0)
	ref := map[string]string{} // pod → node
	nodes := map[string]bool{}
	for step := range 5000 {
		switch op := rng.IntN(10); {
		case op == 0:
			n := fmt.Sprint("n", rng.IntN(8))
			p.addNode(n)
			nodes[n] = true
		case op == 1:
			n := fmt.Sprint("n", rng.IntN(8))
			p.removeNode(n)
			delete(nodes, n)
		case op < 6:
			pod := fmt.Sprint("p", rng.IntN(200))
			n := fmt.Sprint("n", rng.IntN(8))
			p.assign(pod, n)
			ref[pod] = n
		default:
			pod := fmt.Sprint("p", rng.IntN(200))
			p.forget(pod)
			delete(ref, pod)
		}
		load := map[string]int{}
		for _, n := range ref {
			load[n]++
		}
		for n := range nodes {
			if p.load(n) != load[n] {
				t.Fatalf("step %d: node %s load %d, reference %d", step, n, p.load(n), load[n])
			}
		}
		got, ok := p.pick()
		if ok != (len(nodes) > 0) {
			t.Fatalf("step %d: pick ok=%v with %d nodes", step, ok, len(nodes))
		}
		for n := range nodes {
			if load[n] < load[got] || (load[n] == load[got] && n < got) {
				t.Fatalf("step %d: picked %s (load %d), but %s has %d", step, got, load[got], n, load[n])
			}
		}
	}
}
