// Package kubeletsim plays the kubelets and the CNI plugin of many simulated
// CCE BCC nodes in one process, so that e2e suites and benchmarks can drive
// the IPAM the way a real cluster does without a single real node.
//
// RegisterNodes does what CCE provisioning and the node agent do for a new
// node: a BCC instance in bce-sim, one ENI created and attached to it, the
// IPPool ippool-<node>, and a Node with the instance-type labels, providerID
// cce://i-<node>, the capacity annotations (cce.io/max-ip-per-eni from the
// instance's memory, cce.io/max-eni-num), the extended resource
// cce.baidubce.com/ip (max-eni-num × max-ip-per-eni, which PSTS pods
// request) and a Ready status.
//
// Run then watches pods. An unscheduled pod is bound (pods/binding) to the
// least loaded simulated node (unless its schedulerName is ManualScheduler:
// the test binds those); a pod on a simulated node gets a sandbox with
// a fresh infra container ID and an AllocateIP call to the CNI endpoint,
// exactly the fields the reference plugin sends, and then its Running
// status with the IP. A failed ADD is recorded as a FailedCreatePodSandBox
// Event, its sandbox is torn down with ReleaseIP, and the pod is retried
// with a fresh sandbox after an exponential, capped backoff. A deleted pod
// gets ReleaseIP with its sandbox's container ID and is then removed with
// grace 0, as kubelet finishes a deletion. Pods are handled by a fixed number
// of workers over one work queue, never a goroutine per pod. With
// Config.NodeLeasePeriod set, one more goroutine renews every node's
// heartbeat Lease, as kubelet does. With several CNI endpoints
// (Config.CNIEndpoints, e.g. one per IPAM replica) each call goes to one
// picked at random, as through a Service.
//
//	cfg := kubeletsim.DefaultConfig() // the flag defaults; New never re-defaults
//	cfg.CNIEndpoint = "127.0.0.1:9997"
//	cfg.ClusterID, cfg.VPCID, cfg.SubnetID = "cce-1", "vpc-1", "sbn-1"
//	cfg.SecurityGroupIDs = []string{"g-1"}
//	deps := kubeletsim.Deps{Kube: kc, CCE: cc, Instances: kubeletsim.InProcessInstances(sim), ENIs: cloudClient}
//	sim, _ := kubeletsim.New(cfg, deps, logger, prometheus.NewRegistry())
//	_, err := sim.RegisterNodes(ctx, kubeletsim.NodeNames("sim", 0, 10))
//	go sim.Run(ctx) // returns after ctx ends and every worker stopped
//	// create pods without spec.nodeName; read sim.Stats() for counters
//
// cmd/kubelet-sim wraps the same Simulator for a bce-sim process.
package kubeletsim
