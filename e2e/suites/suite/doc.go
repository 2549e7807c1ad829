// Package suite is what the e2e suites share: where they run and the
// workloads they drive.
//
// Each suite is an ordinary `go test` package (build tag integration) whose
// TestMain calls Main. With E2E_KUBECONFIG unset, Main starts a local
// control plane (etcd, kube-apiserver, kube-controller-manager) and Env.Fleet
// starts bce-sim and cce-ipam replicas as processes on it. With
// E2E_KUBECONFIG set (the kind path, e2e/kind/run.sh) Main starts nothing and
// Env.Fleet runs only the kubelet simulator against the IPAM named by
//
//	E2E_KUBECONFIG       kubeconfig of the cluster
//	E2E_CNI_ENDPOINTS    comma-separated host:port of the CNI gRPC service(s)
//	E2E_BCE_ENDPOINT     bce-sim base URL (BCE OpenAPI and /admin/)
//	E2E_CLUSTER_ID, E2E_VPC_ID, E2E_SUBNET_ID, E2E_SECURITY_GROUP
//	                     the world bce-sim and the replicas are set up with
//	E2E_SCHEDULER        cluster (default: kube-scheduler binds the pods) or
//	                     kubelet-sim (the simulator binds them)
//
// Suites that kill, pause or add replicas need Env.Local (they control the
// processes); the kind path runs the lifecycle suite.
//
//	var env *suite.Env
//	func TestMain(m *testing.M) { os.Exit(suite.Main(m, &env)) }
//	func TestX(t *testing.T) {
//		f := env.Fleet(t, fleet.Options{Name: "x", Nodes: 4})
//		ns := suite.Namespace(t, f.Kube)
//		suite.CreateDeployment(ctx, t, f, ns, "web", 10)
//		pods := suite.WaitPods(ctx, t, f.Kube, ns, "app=web", 10)
//	}
package suite
