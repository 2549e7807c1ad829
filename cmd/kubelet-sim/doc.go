// kubelet-sim registers simulated CCE BCC nodes and plays their kubelets and
// CNI plugin against a real API server, so that cce-ipam can be exercised
// with thousands of nodes without a real one.
//
// A local session, next to a bce-sim process and a cce-ipam replica:
//
//	bce-sim --listen 127.0.0.1:8080 --credential AK:SK --vpc vpc-sim \
//	    --subnet sbn-a,cn-bj-a,10.0.0.0/16
//	cce-ipam --kubeconfig kc --cluster-id cce-demo --vpc-id vpc-sim \
//	    --bce-endpoint 127.0.0.1:8080 --bce-access-key-id AK --bce-secret-access-key SK
//	kubelet-sim --kubeconfig kc --cni-endpoint 127.0.0.1:9997 \
//	    --bce-endpoint 127.0.0.1:8080 --bce-access-key-id AK --bce-secret-access-key SK \
//	    --cluster-id cce-demo --vpc-id vpc-sim --subnet-id sbn-a --zone cn-bj-a \
//	    --security-group g-sim --nodes 100
//
// Then create pods (a Deployment, with kube-controller-manager running) and
// watch them become Running with IPs. Instances are created through bce-sim's
// admin API (--bce-admin-url, default http://<bce-endpoint>), ENIs through
// the BCE API with the given credentials. Registering is idempotent per node
// name, so a restarted kubelet-sim keeps its nodes and adopts their pods'
// sandboxes from the pod statuses it wrote. Logs are structured (slog);
// --metrics-listen serves Prometheus metrics; a stats line is logged every
// --stats-period.
//
// With kube-controller-manager running, pass --node-lease-period 10s: the
// simulated kubelets then renew their nodes' heartbeat Leases, and the node
// lifecycle controller keeps the nodes Ready instead of tainting them and
// evicting their pods.
package main
