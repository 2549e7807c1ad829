// Package lifecycle is the e2e suite for what users do to workloads:
// Deployments scaled up and down, fixed-IP StatefulSets restarted, scaled
// down and deleted, a node deleted under its pods, and a subnet running out
// of IPs. It runs against the local control plane (make e2e, make test) or
// a kind cluster (make e2e-kind); see package suite for the environment.
package lifecycle
