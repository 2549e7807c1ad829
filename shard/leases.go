package shard

import (
	"fmt"
	"strconv"
	"strings"
)

// The coordination objects, all coordination.k8s.io Leases in one namespace,
// told apart by the kind label.
const (
	labelKind         = "cce.io/shard-object"
	kindReplica       = "replica"
	kindPartition     = "partition"
	kindBudget        = "budget"
	kindBalance       = "balance"
	replicaLeasePrefx = "cce-ipam-replica-"
	partitionPrefix   = "cce-ipam-partition-"
	budgetLeaseName   = "cce-ipam-budget"
	balanceLeaseName  = "cce-ipam-balance"

	// Annotations of a replica Lease: how to reach it, and whether it is
	// leaving (others then drop it from the ring at once).
	annoGRPC    = "cce.io/grpc-addr"
	annoHTTP    = "cce.io/http-addr"
	annoLeaving = "cce.io/leaving"
	annoMember  = "cce.io/member"
	// annoShares on the budget Lease: JSON {member: {rate, burst}}.
	annoShares = "cce.io/budget-shares"
	// annoPartitionNodes on the balance Lease: the node count of every
	// partition, comma-separated (EncodePartitionNodes).
	annoPartitionNodes = "cce.io/partition-nodes"
)

// ReplicaLeaseName is the Lease a replica renews.
func ReplicaLeaseName(member string) string { return replicaLeasePrefx + member }

// PartitionLeaseName is a partition's claim object.
func PartitionLeaseName(p int) string { return partitionPrefix + strconv.Itoa(p) }

// partitionFromLease parses a claim's name.
func partitionFromLease(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, partitionPrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(s)
	return p, err == nil && p >= 0
}

// checkMemberName refuses names that cannot be part of a Lease name.
func checkMemberName(m string) error {
	if m == "" || len(replicaLeasePrefx)+len(m) > 253 {
		return fmt.Errorf("shard: member name %q is empty or too long", m)
	}
	for _, r := range m {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return fmt.Errorf("shard: member name %q must be lower-case letters, digits, '-' and '.'", m)
		}
	}
	return nil
}
