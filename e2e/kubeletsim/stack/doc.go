// Package stack starts, inside one test process, everything an e2e suite
// needs around a control plane: an in-process bce-sim, the IPAM (ipam + cni
// server on a real gRPC listener on 127.0.0.1), and a kubeletsim.Simulator
// with registered nodes. Everything it starts is stopped by t.Cleanup, in
// reverse order, and the nodes and IPPools it created are deleted.
//
//	st := stack.Start(t, cp.Config, stack.Options{Name: "web", Nodes: 10, Namespace: ns})
//	// create pods without spec.nodeName in ns; they become Running
//	chk := st.Checker(invariants.Config{Namespaces: []string{ns}})
//	vs, err := chk.Check(ctx) // scoped to the stack's nodes and bce-sim
//
// Suites that need the pieces separately (a bce-sim process, several IPAM
// replicas) wire kubeletsim and invariants themselves; Stack is the
// shortest path for a single-replica test.
package stack
