package shard

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
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
	annoGossip  = "cce.io/gossip-addr"
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
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '.' {
			return fmt.Errorf("shard: member name %q must be lower-case letters, digits, '-' and '.'", m)
		}
	}
	return nil
}

// casAnnotations reads the named Lease (a new one labelled kind when there is
// none), lets edit change its annotations, and writes it back by
// compare-and-swap on the version read. A write that lost a race fails with
// the API's Conflict or AlreadyExists, for the caller to retry or drop.
func casAnnotations(ctx context.Context, client coordclient.LeaseInterface, name, kind string,
	edit func(annotations map[string]string)) error {
	l, err := client.Get(ctx, name, metav1.GetOptions{})
	create := apierrors.IsNotFound(err)
	if err != nil && !create {
		return err
	}
	if create {
		l = &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{labelKind: kind},
		}}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	edit(l.Annotations)
	if create {
		_, err = client.Create(ctx, l, metav1.CreateOptions{})
	} else {
		_, err = client.Update(ctx, l, metav1.UpdateOptions{})
	}
	return err
}
