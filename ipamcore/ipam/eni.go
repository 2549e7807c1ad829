package ipam

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
)

// Attach polling: BCE attaches asynchronously (attaching → inuse); the
// reference waits 5 s, then polls every 5 s for up to 50 s. Pods of a burst
// that outgrew the node's ENIs wait for the attach, so the polls start
// 100 ms after the attach call and double up to 1 s: an attach that takes
// a second costs a GetENI or two more than polling every second, and is
// seen 100 ms to 1 s after it happened.
const (
	attachPollFirst = 100 * time.Millisecond
	attachPollMax   = time.Second
	attachTimeout   = 50 * time.Second
)

// createENI creates an ENI for the node in a subnet of its top-priority
// IPPools (eniplan.go) chosen by the configured policy, attaches it and
// records it. At most one creation runs per node (beginENI), on the pool
// worker or on an ahead-of-demand goroutine of the ENI sync (eniahead.go).
// For the pool (forPool: waiting allocations or a pool below its minimum,
// not ahead of demand) it is created holding the addresses the pool wants
// beyond the attached ENIs' room (beyondRoom, eniAddresses), so a burst that
// outgrew the node's ENIs needs no batch adds on the new one, each a call at
// the replica's share of the per-operation limit. On failure the ENI is deleted again, so nothing
// leaks, and the node gets a Warning event.
func (i *IPAM) createENI(ctx context.Context, n *node, forPool bool) error {
	k8sNode, err := i.nodes.Get(n.name)
	if err != nil {
		return fmt.Errorf("get node: %w", err)
	}
	pl, err := i.eniPlacement(ctx, n, k8sNode)
	if err != nil {
		i.events.Eventf(k8sNode, corev1.EventTypeWarning, "CreateNewENIFailed", "%v", err)
		i.log.Warn("no placement for a new ENI", "node", n.name, "err", err)
		return err
	}
	subnet, err := i.chooseSubnet(ctx, n, pl.Subnets)
	if err != nil {
		i.events.Eventf(k8sNode, corev1.EventTypeWarning, "CreateNewENIFailed", "%v", err)
		i.log.Warn("no subnet with free IPs for a new ENI", "node", n.name, "err", err)
		return err
	}
	addrs := 0
	if forPool {
		addrs = i.eniAddresses(n, subnet, i.beyondRoom(n))
	}
	eniID, err := i.createAndAttach(ctx, n, pl, subnet.ID, addrs)
	if err != nil && addrs > 0 && refusedForItsAddresses(err) {
		// The cloud may cap the instance's addresses below what the node
		// says, have fewer free than it described, or not take secondary
		// addresses at creation at all: the reference's ENI, the primary
		// only, is still wanted, and batch adds bring the rest.
		i.log.Warn("creating an ENI with its addresses failed; creating it with its primary only",
			"node", n.name, "addresses", addrs, "err", err)
		refusal := err
		addrs = 0
		eniID, err = i.createAndAttach(ctx, n, pl, subnet.ID, 0)
		if err == nil && errors.Is(refusal, cloud.ErrInvalidRequest) {
			// Only the addresses made it a bad request (the same ENI
			// without them was taken): this cloud does not take them.
			i.createWithAddrsRefused.Store(true)
		}
	}
	if err != nil {
		i.events.Eventf(k8sNode, corev1.EventTypeWarning, "CreateNewENIFailed", "%v", err)
		return err
	}
	i.metrics.enisCreated.Inc()
	i.events.Eventf(k8sNode, corev1.EventTypeNormal, "CreateNewENI", "created and attached %s in subnet %s", eniID, subnet.ID)
	i.log.Info("created ENI", "node", n.name, "eni", eniID, "subnet", subnet.ID, "addresses", addrs)
	return nil
}

// eniAddresses is how many secondary addresses a new ENI is created with:
// want, within the ENI's capacity and the subnet's free addresses (the
// primary takes one). None when turned off (--eni-create-with-ips) or once
// the cloud refused such a creation as a bad request.
func (i *IPAM) eniAddresses(n *node, subnet *cloud.Subnet, want int) int {
	if !i.cfg.ENICreateWithIPs || i.createWithAddrsRefused.Load() {
		return 0
	}
	return max(0, min(want, n.capacity.MaxIPsPerENI-1, subnet.AvailableIP-1, cloud.MaxCreateSecondaryIPs))
}

// refusedForItsAddresses: a creation or attach that failed because of the
// addresses asked for with the ENI.
func refusedForItsAddresses(err error) bool {
	return errors.Is(err, cloud.ErrVMMemoryCannotAttachMoreIP) || errors.Is(err, cloud.ErrSubnetHasNoMoreIP) ||
		errors.Is(err, cloud.ErrInvalidRequest)
}

// createAndAttach creates the ENI with addrs secondary addresses, attaches
// it and records it with them; an ENI that cannot be attached is deleted.
func (i *IPAM) createAndAttach(ctx context.Context, n *node, pl placement, subnetID string, addrs int) (string, error) {
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	name := fmt.Sprintf("%s/%s/%s/%s", i.cfg.ClusterID, n.instanceID, n.name, hex.EncodeToString(suffix))
	eniID, err := i.deps.Cloud.CreateENI(ctx, cloud.CreateENIRequest{
		Name:                       name,
		SubnetID:                   subnetID,
		SecurityGroupIDs:           pl.SecurityGroups,
		EnterpriseSecurityGroupIDs: pl.EnterpriseGroups,
		Description:                "auto created by cce-ipam, do not modify",
		SecondaryIPs:               addrs,
	})
	if err != nil {
		return "", fmt.Errorf("create ENI in %s: %w", subnetID, err)
	}
	eni, err := i.attach(ctx, eniID, n.instanceID)
	if err != nil {
		i.discardENI(ctx, eniID, n.instanceID)
		return "", fmt.Errorf("attach %s: %w", eniID, err)
	}
	de, ips, err := i.toDatastoreENI(ctx, *eni, n.capacity.MaxIPsPerENI)
	if err == nil {
		err = i.store.AddENI(n.name, de)
	}
	if err == nil && len(ips) > 0 {
		err = i.store.AddIPs(n.name, de.ID, ips, i.deps.Clock.Now())
	}
	if err != nil {
		// Attached but unrecorded: the next ENI sync adopts it.
		return "", fmt.Errorf("record ENI %s: %w", eniID, err)
	}
	if len(ips) > 0 {
		i.metrics.poolAdded.Add(float64(len(ips)))
		n.refill() // the allocations waiting for them
	}
	return eniID, nil
}

// Subnet selection policies for new ENIs.
const (
	// SubnetMostFreeIP picks the candidate subnet with the most free IPs.
	SubnetMostFreeIP = "MostFreeIP"
	// SubnetLeastENI picks the candidate subnet holding the fewest of the
	// node's ENIs (spreading a node over subnets), then the most free IPs.
	SubnetLeastENI = "LeastENI"
)

// chooseSubnet picks a subnet with free IPs by the configured policy among
// the placement's (already stripped of exclusive, disabled and exhausted
// ones); the cloud's DescribeSubnet has the last word on free IPs.
func (i *IPAM) chooseSubnet(ctx context.Context, n *node, ids []string) (*cloud.Subnet, error) {
	perSubnet := map[string]int{}
	for _, e := range i.nodeENIs(n.name) {
		perSubnet[e.SubnetID]++
	}
	var best *cloud.Subnet
	var errs []error
	for _, id := range ids {
		s, err := i.deps.Cloud.DescribeSubnet(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if s.AvailableIP <= 0 {
			continue
		}
		switch {
		case best == nil:
			best = s
		case i.cfg.SubnetSelection == SubnetLeastENI && perSubnet[s.ID] != perSubnet[best.ID]:
			if perSubnet[s.ID] < perSubnet[best.ID] {
				best = s
			}
		case s.AvailableIP > best.AvailableIP:
			best = s
		}
	}
	switch {
	case best == nil && len(errs) > 0:
		return nil, fmt.Errorf("no subnet of %v has a free IP for a new ENI: %w", ids, errors.Join(errs...))
	case best == nil:
		return nil, fmt.Errorf("no subnet of %v has a free IP for a new ENI", ids)
	}
	return best, nil
}

// attach attaches the ENI and waits until BCE reports it in use.
func (i *IPAM) attach(ctx context.Context, eniID, instanceID string) (*cloud.ENI, error) {
	if err := i.deps.Cloud.AttachENI(ctx, eniID, instanceID); err != nil {
		return nil, err
	}
	deadline := i.deps.Clock.Now().Add(attachTimeout)
	wait := attachPollFirst
	for {
		// No poll straight after the call: BCE has not attached yet, and a
		// GetENI spends the node owner's share of the budget that the
		// burst's address batches wait for.
		i.sleep(ctx, wait)
		wait = min(2*wait, attachPollMax)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		eni, err := i.deps.Cloud.GetENI(ctx, eniID)
		switch {
		case err != nil:
		case eni.Status == cloud.ENIStatusInUse && eni.InstanceID == instanceID:
			return eni, nil
		case eni.Status == cloud.ENIStatusAvailable, eni.Status == cloud.ENIStatusDetaching:
			return nil, fmt.Errorf("ENI went %s while attaching", eni.Status)
		}
		if i.deps.Clock.Now().After(deadline) {
			return nil, fmt.Errorf("ENI not in use after %s", attachTimeout)
		}
	}
}

// discardENI detaches (if needed) and deletes an ENI that could not be put to
// use. Failures are left to the leaked-ENI sweep of the ENI sync. It runs on
// even when ctx has ended (an attach cut short), for 30 s at most, but with
// ctx's node permission: a fenced replica sends nothing.
func (i *IPAM) discardENI(ctx context.Context, eniID, instanceID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if eni, err := i.deps.Cloud.GetENI(ctx, eniID); err == nil && eni.Status != cloud.ENIStatusAvailable {
		_ = i.deps.Cloud.DetachENI(ctx, eniID, instanceID)
	}
	if err := i.deps.Cloud.DeleteENI(ctx, eniID); err != nil {
		i.log.Warn("could not delete an unusable ENI; the ENI sync will retry", "eni", eniID, "err", err)
	}
}

// syncLoop runs syncENIs every ENISyncPeriod until ctx ends.
func (i *IPAM) syncLoop(ctx context.Context) {
	tick := i.deps.Clock.NewTicker(i.cfg.ENISyncPeriod)
	defer tick.Stop()
	// However many takeovers there are (nodes joining every few seconds),
	// a sync this overdue runs anyway.
	overdue := max(3*i.cfg.ENISyncPeriod, time.Minute)
	lastSync := i.deps.Clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
			// The sync yields the scarce ListENIs tokens to takeovers (see
			// cloud.NoWait): when none is free, or a takeover is listing or
			// has just listed, it tries again a little later; an overdue
			// sync waits for its token.
			for try := 0; ; try++ {
				sctx := cloud.NoWait(ctx)
				if i.deps.Clock.Since(lastSync) > overdue {
					sctx = ctx
				}
				err := i.SyncENIs(sctx)
				if errors.Is(err, cloud.ErrWouldWait) && try < 10 {
					i.sleep(ctx, time.Second+time.Duration(mrand.Int64N(int64(time.Second))))
					continue
				}
				if err != nil && ctx.Err() == nil {
					i.log.Warn("ENI sync failed", "err", err)
				}
				if err == nil {
					lastSync = i.deps.Clock.Now()
				}
				break
			}
		}
	}
}

// SyncENIs lists the cluster's ENIs once (VPC-wide, paginated: one call per
// 1000 ENIs instead of one per node) and, for every served node, adopts new
// in-use ENIs, drops vanished ones, keeps the node's IPPool status current
// (writing only when it changed) and deletes leaked unattached ENIs.
//
// The list keeps only the served nodes' ENIs (and unattached ones), so a
// replica holds its share of the VPC's ENIs, not all of them; a node served
// after the list was taken waits for the next sync (its rebuild read a
// fresher list anyway).
func (i *IPAM) SyncENIs(ctx context.Context) error {
	servedNodes := i.ServedNodes()
	instances := make(map[string]bool, len(servedNodes))
	for _, name := range servedNodes {
		if n, ok := i.node(name); ok {
			instances[n.instanceID] = true
		}
	}
	enis, err := i.deps.Cloud.ListENIs(ctx, cloud.ListENIsOptions{VPCID: i.cfg.VPCID, NamePrefix: i.cfg.ClusterID + "/",
		Instances: instances})
	if err != nil {
		return fmt.Errorf("list ENIs: %w", err)
	}
	byInstance := byInstanceOf(enis)
	now := i.deps.Clock.Now()
	for _, name := range servedNodes {
		i.syncNode(ctx, name, byInstance)
	}
	i.mu.Lock()
	run := i.runCtx
	i.mu.Unlock()
	if run != nil {
		i.createENIsAhead(run, servedNodes, enis)
	}
	// Leaked: ours, unattached, older than LeakedENIAge, for a served node
	// (its creator crashed between create and attach) or, on the leader,
	// for a node that no longer exists.
	for _, e := range enis {
		if e.Status != cloud.ENIStatusAvailable || e.CreatedTime.IsZero() || now.Sub(e.CreatedTime) < i.cfg.LeakedENIAge {
			continue
		}
		parts := strings.Split(e.Name, "/")
		if len(parts) != 4 {
			continue
		}
		i.deleteLeakedENI(ctx, e, parts[2])
	}
	return nil
}

// syncNode brings one served node in line with the list, as in-flight work
// of the node (acquireWork): StopServingNode waits for it, and its cloud
// calls carry the node's permission.
func (i *IPAM) syncNode(ctx context.Context, name string, byInstance map[string][]cloud.ENI) {
	ctx, n, done, ok := i.acquireWork(ctx, name)
	if !ok {
		return
	}
	defer done()
	if i.mayAct(name) != nil {
		return
	}
	var inUse []cloud.ENI
	for _, e := range byInstance[n.instanceID] {
		if e.Status == cloud.ENIStatusInUse {
			inUse = append(inUse, e)
		}
	}
	i.adoptENIs(ctx, n, inUse)
	i.reconcileIPs(ctx, n, inUse)
	i.writePoolStatus(ctx, n, inUse)
}

// deleteLeakedENI deletes a leaked ENI named for node. For a served node
// the delete is in-flight work of the node under its permission. A node
// that no longer exists is served by nobody: with a fence, the holder of
// its partition deletes the ENI, under the node's fence as for a served
// node; without one, the leader, under forLeaderSweep. Other ENIs are left
// to their node's owner.
func (i *IPAM) deleteLeakedENI(ctx context.Context, e cloud.ENI, node string) {
	if nctx, _, done, ok := i.acquireWork(ctx, node); ok {
		defer done()
		if i.mayAct(node) != nil {
			return
		}
		ctx = nctx
	} else {
		switch {
		case i.deps.Fence != nil:
			if _, err := i.deps.Fence.MayAct(node); err != nil {
				return // another replica's partition (no refusal to count)
			}
			ctx = i.forNode(ctx, node)
		case i.deps.IsLeader != nil && !i.deps.IsLeader():
			return
		default:
			ctx = i.forLeaderSweep(ctx, node)
		}
		if !i.nodeGone(ctx, node) {
			return
		}
	}
	if err := i.deps.Cloud.DeleteENI(ctx, e.ID); err == nil {
		i.metrics.gcActions.WithLabelValues("leaked_eni").Inc()
		i.log.Info("deleted a leaked unattached ENI", "eni", e.ID, "name", e.Name)
	}
}

// nodeGone confirms with the API server that a node no longer exists.
func (i *IPAM) nodeGone(ctx context.Context, name string) bool {
	if _, err := i.nodes.Get(name); err == nil {
		return false
	}
	_, err := i.deps.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// adoptENIs reconciles the node's datastore ENIs with the cloud's in-use
// ones. Addresses on a new ENI enter the pool idle. An ENI is dropped only
// when two syncs in a row miss it: the list may predate an ENI the pool
// worker created meanwhile, and dropping its records would let its assigned
// IPs come back as idle.
func (i *IPAM) adoptENIs(ctx context.Context, n *node, inUse []cloud.ENI) {
	want := map[string]bool{}
	for _, e := range inUse {
		want[e.ID] = true
	}
	have := map[string]bool{}
	for _, e := range i.nodeENIs(n.name) {
		have[e.ID] = true
		n.mu.Lock()
		if want[e.ID] {
			delete(n.missing, e.ID)
			n.mu.Unlock()
			continue
		}
		n.missing[e.ID]++
		drop := n.missing[e.ID] >= 2
		if drop {
			delete(n.missing, e.ID)
		}
		n.mu.Unlock()
		if !drop {
			continue
		}
		if dropped, err := i.store.RemoveENI(n.name, e.ID); err == nil {
			for _, ip := range dropped {
				if ip.State == datastore.StateAssigned {
					i.log.Warn("ENI vanished with an assigned IP", "node", n.name, "eni", e.ID, "ip", ip.Addr, "owner", ip.Owner.String())
				}
			}
		}
	}
	for _, e := range inUse {
		if have[e.ID] {
			continue
		}
		de, ips, err := i.toDatastoreENI(ctx, e, n.capacity.MaxIPsPerENI)
		if err != nil {
			i.log.Warn("ENI sync: cannot adopt ENI", "eni", e.ID, "err", err)
			continue
		}
		if err := i.store.AddENI(n.name, de); err != nil {
			continue // raced with createENI, which recorded it
		}
		if len(ips) > 0 {
			if err := i.store.AddIPs(n.name, de.ID, ips, i.deps.Clock.Now()); err != nil {
				i.log.Warn("ENI sync: adopting the ENI's IPs failed", "eni", e.ID, "err", err)
			}
		}
		i.log.Info("ENI sync: adopted ENI", "node", n.name, "eni", e.ID)
	}
}

// nodeENIs returns the node's ENIs as the datastore records them (the one
// place that knows them).
func (i *IPAM) nodeENIs(node string) []datastore.ENI {
	snap, err := i.store.Snapshot(node)
	if err != nil {
		return nil
	}
	out := make([]datastore.ENI, len(snap.ENIs))
	for k, e := range snap.ENIs {
		out[k] = e.ENI
	}
	return out
}

// writePoolStatus sets the node's IPPool status.eni.enis to its in-use ENIs,
// only when it differs, keeping the agent's interfaceIndex.
func (i *IPAM) writePoolStatus(ctx context.Context, n *node, inUse []cloud.ENI) {
	client := i.deps.CCE.CceV1alpha1().IPPools(cce.IPPoolNamespace)
	pool, err := client.Get(ctx, cce.IPPoolName(n.name), metav1.GetOptions{})
	if err != nil {
		return // the node agent creates the pool; nothing to keep current yet
	}
	want := map[string]cce.ENI{}
	for _, e := range inUse {
		idx := int32(-1)
		if old, ok := pool.Status.ENI.ENIs[e.ID]; ok {
			idx = old.InterfaceIndex
		}
		s := cce.ENI{ID: e.ID, MAC: e.MACAddress, AvailabilityZone: e.ZoneName, Description: e.Description,
			InterfaceIndex: idx, Subnet: e.SubnetID, VPC: e.VPCID, SecurityGroups: slices.Clone(e.SecurityGroupIDs)}
		for _, p := range e.PrivateIPs {
			s.PrivateIPSet = append(s.PrivateIPSet, cce.PrivateIP{
				IsPrimary:        p.Primary,
				PrivateIPAddress: p.Address,
				PublicIPAddress:  p.PublicIP,
			})
		}
		want[e.ID] = s
	}
	if reflect.DeepEqual(pool.Status.ENI.ENIs, want) {
		return
	}
	upd := pool.DeepCopy()
	upd.Status.ENI.ENIs = want
	if _, err := client.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		i.log.Info("IPPool status update failed; next sync retries", "pool", pool.Name, "err", err)
	}
}
