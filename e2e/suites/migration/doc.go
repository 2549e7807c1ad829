// Package migration tests the switch-over from the reference (cce-eni-ipam)
// to cce-ipam, end to end (integration tag), on a control plane of its own:
// the reference's CRDs are schema-less and cluster-wide, so no other suite's
// control plane may have them.
//
// A test builds the world the reference leaves behind: its CRDs
// (testdata/reference-crds, installed first, so that cce-ipam's chart CRDs
// are only added where missing, as `helm install` does), Subnet resources
// and WorkloadEndpoints in the reference's exact JSON, nodes labelled and
// annotated as its node agent does, running pods with their IPs, and the
// matching ENIs and addresses in bce-sim. Then three cce-ipam replicas start
// and take over: every pod keeps its IP (CheckIP through the replicas, the
// invariant checker with the owners' datastores), new pods allocate, deleted
// pods release, and a real Prometheus evaluating the chart's recording rules
// against the replicas answers queries in the reference's metric names.
//
//	go test -race -count=1 -tags integration ./e2e/suites/migration/
package migration
