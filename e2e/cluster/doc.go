// Package cluster starts a real, throw-away Kubernetes control plane for tests
// and tools: etcd and kube-apiserver, plus kube-controller-manager when asked
// (so that StatefulSets and ServiceAccounts are real).
//
// The binaries are the pinned ones that `make tools` builds into bin/ from the
// Go module proxy; nothing here downloads anything. Every process binds to a
// free 127.0.0.1 port, runs in a temporary directory under e2e/supervisor (its
// own process group, a parent-death signal), and is stopped by Close. If the
// test binary itself dies (SIGKILL, a panic, `go test -timeout`), the kernel
// kills the children too.
//
// A typical test package shares one control plane across its tests:
//
//	var cp *cluster.Cluster
//
//	func TestMain(m *testing.M) {
//		os.Exit(cluster.RunTests(m, cluster.Options{}, &cp))
//	}
//
//	func TestSomething(t *testing.T) {
//		ns := cp.Namespace(t) // a fresh namespace, deleted when the test ends
//		cs := kubernetes.NewForConfigOrDie(cp.Config)
//		...
//	}
//
// Start writes an admin kubeconfig to Cluster.Kubeconfig so that tools such as
// kubectl, helm or our own binaries can talk to the same API server.
package cluster
