package ipam

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/ipclaim"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// PSTS allocation: PSTS.md says what and why; psts holds the rules.

// ClaimLedger is the exclusive-subnet address ledger (ipclaim.Ledger): one
// holder per address across every replica (PSTS.md, I7).
type ClaimLedger interface {
	Reserve(ctx context.Context, subnetID string, addr netip.Addr, h ipclaim.Holder, at ipclaim.Attachment) error
	Pick(ctx context.Context, subnetID string, ranges []psts.Range, usable func(netip.Addr) bool, h ipclaim.Holder,
		at ipclaim.Attachment) (netip.Addr, error)
	Free(ctx context.Context, addr netip.Addr, h ipclaim.Holder) error
	Block(ctx context.Context, addr netip.Addr, h ipclaim.Holder) error
	// Lookup is the ledger's cached copy of addr's claim (no request).
	Lookup(addr netip.Addr) (*cce.IPClaim, bool)
}

// ErrPSTS wraps every refusal of a PSTS allocation that kubelet's retry will
// not cure by itself (no usable subnet, a strategy the pod cannot use).
var ErrPSTS = errors.New("PodSubnetTopologySpread")

// pathPSTS labels PSTS allocations and releases in the metrics.
const pathPSTS = "psts"

// pickAttempts bounds how many picked addresses an ADD tries when the cloud
// says each is in use outside the ledger.
const pickAttempts = 3

// pstsOf returns the PSTS the pod takes its IP from: the one its annotation
// names; for a pod without the annotation (admitted while the webhook was
// down), the PSTS the webhook would have chosen, if the pod was created
// after it (an older pod keeps the subnet it always had). nil: an ordinary
// pod.
func (i *IPAM) pstsOf(ctx context.Context, pod *corev1.Pod) (*cce.PodSubnetTopologySpread, error) {
	name := pod.Annotations[cce.AnnotationPodSubnetTopologySpread]
	if name == "" {
		list, err := i.spreads.PodSubnetTopologySpreads(pod.Namespace).List(labels.Everything())
		if err != nil || len(list) == 0 {
			return nil, nil //nolint:nilerr // a lister error means no PSTS known: an ordinary pod
		}
		p := psts.Match(pod, list)
		if p == nil || pod.CreationTimestamp.Before(&p.CreationTimestamp) {
			return nil, nil
		}
		return p, nil
	}
	p, err := i.spreads.PodSubnetTopologySpreads(pod.Namespace).Get(name)
	if apierrors.IsNotFound(err) {
		// Just created: the informer may not have it yet.
		p, err = i.deps.CCE.CceV1alpha1().PodSubnetTopologySpreads(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w %s/%s named by the pod does not exist", ErrPSTS, pod.Namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("get PodSubnetTopologySpread %s/%s: %w", pod.Namespace, name, err)
	}
	return p, nil
}

// pstsSubnet is one subnet a PSTS pod may take its address from.
type pstsSubnet struct {
	id       string
	cidr     netip.Prefix
	subnet   *cce.Subnet
	alloc    cce.SubnetAllocation
	strategy cce.IPAllocationStrategy
}

// candidateSubnets are the PSTS's subnets a pod of the node may use: a
// Subnet resource that is enabled, in the zone of the node's ENIs, not
// declared exhausted; most available addresses first. They are read from
// the Subnet resources, not from the PSTS status, so that a lagging status
// controller cannot stop allocations.
func (i *IPAM) candidateSubnets(p *cce.PodSubnetTopologySpread, zone string) ([]pstsSubnet, []string) {
	var (
		out  []pstsSubnet
		skip []string
	)
	for id, alloc := range p.Spec.Subnets {
		sn, err := i.subnets.Subnets(cce.SubnetNamespace).Get(id)
		switch {
		case err != nil:
			skip = append(skip, id+": no Subnet resource yet")
			continue
		case !sn.Status.Enable:
			skip = append(skip, id+": disabled")
			continue
		case sn.Status.HasNoMoreIP:
			skip = append(skip, id+": no more IP")
			continue
		case zone != "" && sn.Spec.AvailabilityZone != "" && sn.Spec.AvailabilityZone != zone:
			skip = append(skip, id+": in zone "+sn.Spec.AvailabilityZone+", the node is in "+zone)
			continue
		}
		cidr, err := netip.ParsePrefix(sn.Spec.CIDR)
		if err != nil {
			skip = append(skip, fmt.Sprintf("%s: unparsable CIDR %q", id, sn.Spec.CIDR))
			continue
		}
		out = append(out, pstsSubnet{id: id, cidr: cidr.Masked(), subnet: sn, alloc: alloc, strategy: psts.Resolve(p, id)})
	}
	slices.SortFunc(out, func(a, b pstsSubnet) int {
		if c := cmp.Compare(b.subnet.Status.AvailableIPNum, a.subnet.Status.AvailableIPNum); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	slices.Sort(skip)
	return out, skip
}

// zoneOf is the zone of the node's ENIs, from their subnets' resources; ""
// when unknown (no zone filter then: the cloud refuses a wrong zone).
func (i *IPAM) zoneOf(enis []datastore.ENI) string {
	for _, e := range enis {
		if sn, err := i.subnets.Subnets(cce.SubnetNamespace).Get(e.SubnetID); err == nil && sn.Spec.AvailabilityZone != "" {
			return sn.Spec.AvailabilityZone
		}
	}
	return ""
}

// pstsTake is an address a PSTS ADD holds before its commit.
type pstsTake struct {
	info   datastore.IPInfo
	subnet pstsSubnet
	// kept: the pod's reserved address (Fixed, custom reuse), which stays
	// the pod's if the commit fails; otherwise a failed commit gives it up.
	kept bool
	// claimed: the address is held in the ledger for the pod.
	claimed bool
}

// allocatePSTS gives a PSTS pod an address of one of its PSTS's subnets and
// commits its wep.
func (i *IPAM) allocatePSTS(ctx context.Context, pod *corev1.Pod, n *node, owner datastore.Owner,
	p *cce.PodSubnetTopologySpread) (*cce.WorkloadEndpoint, error) {
	enis := i.nodeENIs(n.name)
	if len(enis) == 0 {
		return nil, fmt.Errorf("node %s has no ENI yet for the PSTS pod %s", n.name, owner.Pod())
	}
	zone := i.zoneOf(enis)
	cands, skipped := i.candidateSubnets(p, zone)
	if len(cands) == 0 {
		return nil, fmt.Errorf("%w %s/%s has no usable subnet for node %s (zone %q): %v",
			ErrPSTS, p.Namespace, p.Name, n.name, zone, skipped)
	}
	old, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		old = nil
	case err != nil:
		return nil, fmt.Errorf("get WorkloadEndpoint: %w", err)
	}
	take, err := i.takePSTS(ctx, pod, n, owner, p, cands, old)
	if err != nil {
		return nil, err
	}
	wep, err := i.commit(ctx, n, i.newPSTSWEP(pod, n, take, p))
	if err != nil && !take.kept {
		i.dropPSTS(ctx, n, owner.Pod(), take.info.Addr, take.info.ENIID, take.claimed)
	}
	return wep, err
}

// takePSTS finds the pod's address: the one it holds here already (a new
// sandbox, a retried ADD), else from the first candidate subnet that gives
// one.
func (i *IPAM) takePSTS(ctx context.Context, pod *corev1.Pod, n *node, owner datastore.Owner,
	p *cce.PodSubnetTopologySpread, cands []pstsSubnet, old *cce.WorkloadEndpoint) (pstsTake, error) {
	if held, err := i.store.LookupPod(n.name, owner.Pod()); err == nil && held.State == datastore.StateAssigned {
		for _, c := range cands {
			if !c.cidr.Contains(held.Addr) {
				continue
			}
			if psts.NeedsExclusive(c.strategy.Type) && i.deps.Claims != nil {
				// Held here (a new sandbox, a retried ADD, an address
				// adopted from a reference wep at the rebuild): make
				// sure the ledger says so too, or another replica could
				// pick it.
				err := i.deps.Claims.Reserve(ctx, c.id, held.Addr, ipclaim.Holder{Namespace: pod.Namespace, Name: pod.Name},
					ipclaim.Attachment{Node: n.name, ENIID: held.ENIID, PSTS: p.Name})
				if err != nil {
					return pstsTake{}, fmt.Errorf("claim the pod's address %s: %w", held.Addr, err)
				}
			}
			info, err := i.store.Allocate(n.name, datastore.Request{Owner: owner}, i.deps.Clock.Now())
			if err != nil {
				return pstsTake{}, err
			}
			return pstsTake{info: info, subnet: c, kept: psts.KeepsAddress(c.strategy), claimed: psts.NeedsExclusive(c.strategy.Type)}, nil
		}
	}
	var errs []error
	for _, c := range cands {
		var (
			t   pstsTake
			err error
		)
		if psts.NeedsExclusive(c.strategy.Type) {
			t, err = i.takeExclusive(ctx, pod, n, owner, p, c, old)
		} else {
			t, err = i.takeElastic(ctx, n, owner, c)
		}
		if err == nil {
			return t, nil
		}
		errs = append(errs, fmt.Errorf("subnet %s: %w", c.id, err))
		if ctx.Err() != nil || errors.Is(err, ErrFenced) || cloud.ClassOf(err).Retryable() {
			break // the next subnet would not fare better now
		}
	}
	return pstsTake{}, fmt.Errorf("%w %s/%s: no subnet gave %s an address: %w", ErrPSTS, p.Namespace, p.Name,
		owner.Pod(), errors.Join(errs...))
}

// takeElastic lets the cloud pick an address of the subnet.
func (i *IPAM) takeElastic(ctx context.Context, n *node, owner datastore.Owner, c pstsSubnet) (pstsTake, error) {
	if c.subnet.Spec.Exclusive {
		return pstsTake{}, errors.New("exclusive: an Elastic strategy cannot allocate from it")
	}
	info, err := i.addCrossSubnet(ctx, n, owner, cloud.CrossSubnetAddRequest{SubnetID: c.id, Count: 1})
	if err != nil {
		return pstsTake{}, err
	}
	return pstsTake{info: info, subnet: c}, nil
}

// takeExclusive picks an address of an exclusive subnet through the
// ledger: the pod's old one when its strategy keeps addresses, else a free
// one of the allowed ranges.
func (i *IPAM) takeExclusive(ctx context.Context, pod *corev1.Pod, n *node, owner datastore.Owner,
	p *cce.PodSubnetTopologySpread, c pstsSubnet, old *cce.WorkloadEndpoint) (pstsTake, error) {
	if !c.subnet.Spec.Exclusive {
		return pstsTake{}, fmt.Errorf("not exclusive: strategy %s needs an exclusive subnet", c.strategy.Type)
	}
	if i.deps.Claims == nil {
		return pstsTake{}, fmt.Errorf("strategy %s needs the IP claim ledger, which this replica was not given", c.strategy.Type)
	}
	if c.strategy.Type == cce.IPAllocTypeFixed {
		if _, _, ok := cce.StatefulSetName(pod.Name); !ok {
			return pstsTake{}, fmt.Errorf("strategy Fixed needs a pod named <statefulset>-<ordinal>, not %q", pod.Name)
		}
	}
	ranges, err := psts.AllowedRanges(c.cidr, c.alloc, c.strategy.Type)
	if err != nil {
		return pstsTake{}, fmt.Errorf("address ranges: %w", err)
	}
	holder := ipclaim.Holder{Namespace: pod.Namespace, Name: pod.Name}
	at := ipclaim.Attachment{Node: n.name, PSTS: p.Name}
	if addr, ok := keptAddress(old, p, c, ranges); ok {
		switch err := i.deps.Claims.Reserve(ctx, c.id, addr, holder, at); {
		case err == nil:
			info, err := i.placeKept(ctx, n, owner, old, addr, c.id)
			if err != nil {
				return pstsTake{}, err
			}
			return pstsTake{info: info, subnet: c, kept: true, claimed: true}, nil
		case errors.Is(err, ipclaim.ErrTaken):
			// Freed (its TTL passed) and taken by another pod since: this
			// pod gets a new address.
			i.log.Info("the pod's old PSTS address is held by another pod; picking a new one", "pod", owner.Pod().String(), "ip", addr)
		default:
			return pstsTake{}, fmt.Errorf("reserve the pod's address %s: %w", addr, err)
		}
	}
	usable := func(a netip.Addr) bool {
		if !psts.Usable(c.cidr, a, i.cfg.SubnetAvailableIndex) {
			return false
		}
		_, err := i.store.LookupIP(a)
		return errors.Is(err, datastore.ErrUnknownIP)
	}
	for range pickAttempts {
		addr, err := i.deps.Claims.Pick(ctx, c.id, ranges, usable, holder, at)
		if err != nil {
			return pstsTake{}, err
		}
		info, err := i.addCrossSubnet(ctx, n, owner, cloud.CrossSubnetAddRequest{SubnetID: c.id, IPs: []string{addr.String()}})
		switch {
		case err == nil:
			return pstsTake{info: info, subnet: c, kept: psts.KeepsAddress(c.strategy), claimed: true}, nil
		case errors.Is(err, cloud.ErrPrivateIPInUse):
			// In use outside the ledger (an adopted address not yet
			// claimed, another system): keep everyone off it for a while.
			if berr := i.deps.Claims.Block(ctx, addr, holder); berr != nil {
				i.log.Warn("could not block an address the cloud says is in use", "ip", addr, "err", berr)
			}
			continue
		case definiteRefusal(err):
			if ferr := i.deps.Claims.Free(ctx, addr, holder); ferr != nil {
				i.log.Warn("could not free the claim of an address the cloud refused", "ip", addr, "err", ferr)
			}
			return pstsTake{}, err
		default:
			// The add may have happened (a cut connection, a 5xx after
			// the write): keep the claim; the claim keeper frees it once
			// no wep names the address, and the cloud refuses it to
			// others while it is on the ENI.
			return pstsTake{}, err
		}
	}
	return pstsTake{}, fmt.Errorf("%d picked addresses were in use in the cloud", pickAttempts)
}

// definiteRefusal: the cloud answered and did not apply the request.
func definiteRefusal(err error) bool {
	switch cloud.ClassOf(err) {
	case cloud.ClassServer, cloud.ClassTransport:
		return false
	}
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// keptAddress is the pod's previous address when its strategy keeps it: the
// pod's wep was written for this PSTS and subnet, keeps its address (Fixed,
// custom reuse), and the address is still in the allowed ranges.
func keptAddress(old *cce.WorkloadEndpoint, p *cce.PodSubnetTopologySpread, c pstsSubnet, ranges []psts.Range) (netip.Addr, bool) {
	if old == nil || !psts.KeepsAddress(c.strategy) || old.Spec.SubnetTopologyReference != p.Name || old.Spec.SubnetID != c.id {
		return netip.Addr{}, false
	}
	if !old.IsFixedStatefulSet() && !old.IsCustomReuse() {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(old.Spec.IP)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, r := range ranges {
		if r.Contains(addr) {
			return addr, true
		}
	}
	return netip.Addr{}, false
}

// placeKept puts the pod's reserved address on this node: already here (a
// restart on the same node), or moved from its old node (freed there by
// that node's owner, as a fixed IP's move) and added here.
func (i *IPAM) placeKept(ctx context.Context, n *node, owner datastore.Owner, old *cce.WorkloadEndpoint,
	addr netip.Addr, subnetID string) (datastore.IPInfo, error) {
	if cur, err := i.store.LookupIP(addr); err == nil && cur.Node == n.name {
		if cur.State == datastore.StateAssigned && cur.Owner.Pod() == owner.Pod() {
			return i.store.Allocate(n.name, datastore.Request{Owner: owner}, i.deps.Clock.Now())
		}
		return datastore.IPInfo{}, fmt.Errorf("the pod's address %s is %s on the node", addr, cur.State)
	}
	if old.Spec.Node != "" && old.Spec.Node != n.name && old.Spec.ENIID != "" {
		if err := i.freeOnOldNode(ctx, old.Spec.Node, owner, addr, old.Spec.ENIID); err != nil {
			return datastore.IPInfo{}, fmt.Errorf("free the pod's address %s on its old node %s: %w", addr, old.Spec.Node, err)
		}
	}
	return i.addCrossSubnet(ctx, n, owner, cloud.CrossSubnetAddRequest{SubnetID: subnetID, IPs: []string{addr.String()}})
}

// addCrossSubnet adds one address of another subnet to an ENI of the node
// with room (the fullest-first ENIs are tried last) and records it assigned
// to owner.
func (i *IPAM) addCrossSubnet(ctx context.Context, n *node, owner datastore.Owner,
	req cloud.CrossSubnetAddRequest) (datastore.IPInfo, error) {
	st, err := i.store.Stats(n.name, i.deps.Clock.Now())
	if err != nil {
		return datastore.IPInfo{}, err
	}
	enis := st.ENIs
	slices.SortStableFunc(enis, func(a, b datastore.ENIStats) int {
		return cmp.Compare(a.Total-a.Capacity, b.Total-b.Capacity)
	})
	var lastErr error
	for _, e := range enis {
		added, err := i.deps.Cloud.BatchAddPrivateIPsCrossSubnet(i.forNode(ctx, n.name), e.ID, req)
		if errors.Is(err, cloud.ErrVMMemoryCannotAttachMoreIP) {
			lastErr = err
			continue
		}
		if errors.Is(err, cloud.ErrSubnetHasNoMoreIP) {
			i.declareNoMoreIP(ctx, req.SubnetID, err)
			return datastore.IPInfo{}, err
		}
		if err != nil {
			return datastore.IPInfo{}, err
		}
		if len(added) != 1 {
			return datastore.IPInfo{}, fmt.Errorf("cloud added %v to %s, asked for one", added, e.ID)
		}
		addr, err := netip.ParseAddr(added[0])
		if err != nil || (len(req.IPs) == 1 && added[0] != req.IPs[0]) {
			i.deleteStray(ctx, n.name, e.ID, added[0])
			return datastore.IPInfo{}, fmt.Errorf("cloud added %q to %s, asked for %v", added[0], e.ID, req.IPs)
		}
		info, err := i.store.AddAssignedIP(n.name, e.ID, addr, owner, i.deps.Clock.Now())
		if err != nil {
			// Recorded nowhere: give it back so it cannot leak.
			i.deleteStray(ctx, n.name, e.ID, added[0])
			return datastore.IPInfo{}, err
		}
		return info, nil
	}
	return datastore.IPInfo{}, fmt.Errorf("no ENI of node %s can take another address: %w", n.name, lastErr)
}

func (i *IPAM) deleteStray(ctx context.Context, node, eniID, addr string) {
	if err := i.deps.Cloud.DeletePrivateIP(i.forNode(ctx, node), eniID, addr); err != nil {
		i.log.Warn("could not delete an address recorded nowhere; the ENI sync will find it", "node", node, "eni", eniID,
			"ip", addr, "err", err)
	}
}

// declareNoMoreIP marks the subnet the cloud says is full (for a PSTS pod
// the one asked for: the reference marked the ENI's; for the pool the ENI's),
// with a Warning Event on it, so that no new ENI or PSTS pod tries it until
// the Subnet controller sees addresses free again. A subnet without a Subnet
// resource is left to the controller, which creates one.
func (i *IPAM) declareNoMoreIP(ctx context.Context, subnetID string, cause error) {
	if subnetID == "" {
		return
	}
	client := i.deps.CCE.CceV1alpha1().Subnets(cce.SubnetNamespace)
	sn, err := client.Get(ctx, subnetID, metav1.GetOptions{})
	if err != nil || sn.Status.HasNoMoreIP {
		return
	}
	sn.Status.HasNoMoreIP = true
	sn.Status.Reason = cause.Error()
	updated, err := client.Update(ctx, sn, metav1.UpdateOptions{})
	if err != nil {
		i.log.Info("could not declare a subnet exhausted", "subnet", subnetID, "err", err)
		return
	}
	i.log.Warn("subnet has no more IP", "subnet", subnetID, "cause", cause)
	i.events.Event(updated, corev1.EventTypeWarning, reasonSubnetExhausted,
		"the cloud refused an address in subnet "+subnetID+" (no more IP): new ENIs and PodSubnetTopologySpread pods skip it")
}

// reasonSubnetExhausted is the Event reason package subnet also uses.
const reasonSubnetExhausted = "SubnetExhausted"

// eniSubnet is the subnet of one of the node's ENIs as the datastore has
// it ("" when unknown).
func (i *IPAM) eniSubnet(node, eniID string) string {
	snap, err := i.store.Snapshot(node)
	if err != nil {
		return ""
	}
	for _, e := range snap.ENIs {
		if e.ENI.ID == eniID {
			return e.ENI.SubnetID
		}
	}
	return ""
}

// newPSTSWEP is the wep of a PSTS pod (the reference's shape).
func (i *IPAM) newPSTSWEP(pod *corev1.Pod, n *node, t pstsTake, p *cce.PodSubnetTopologySpread) *cce.WorkloadEndpoint {
	w := i.newWEP(pod, n, t.info)
	s := t.subnet.strategy
	delete(w.Labels, cce.LabelOwner)
	w.Labels[cce.LabelSubnetID] = t.subnet.id
	w.Spec.SubnetID = t.subnet.id
	w.Spec.ENISubnetID = t.info.SubnetID
	w.Spec.SubnetTopologyReference = p.Name
	w.Spec.Phase = cce.WorkloadEndpointPhasePodRunning
	w.Spec.Type = cce.WorkloadEndpointTypePod
	w.Spec.EnableFixIP = "false"
	w.Spec.FixIPDeletePolicy = string(s.ReleaseStrategy)
	switch {
	case s.Type == cce.IPAllocTypeFixed:
		if sts, _, ok := cce.StatefulSetName(pod.Name); ok {
			w.Spec.Type = cce.WorkloadEndpointTypeStatefulSet
			w.Spec.EnableFixIP = cce.EnableFixIPTrue
			w.Labels[cce.LabelOwner] = sts
		}
	case s.Type == cce.IPAllocTypeCustom && s.EnableReuseIPAddress:
		w.Spec.Type = cce.WorkloadEndpointTypeReuseIPPod
		w.Spec.EnableFixIP = cce.EnableFixIPTrue
		w.Spec.Release = &cce.WorkloadEndpointRelease{TTL: metav1.Duration{Duration: psts.TTL(s)}}
	}
	return w
}

// dropPSTS gives up a PSTS address of a served node: out of the datastore
// and the cloud (under the node's fence), then its claim, which goes last
// so that nobody can take the address while it is still on the ENI.
func (i *IPAM) dropPSTS(ctx context.Context, n *node, pod datastore.PodKey, addr netip.Addr, eniID string, claimed bool) {
	if err := i.dropAddress(ctx, n, pod, addr, eniID); err != nil {
		// The claim stays: the keeper frees it once no wep names it.
		i.log.Warn("could not delete a PSTS address from the cloud; the ENI sync settles it", "node", n.name, "ip", addr,
			"err", err)
		return
	}
	if claimed && i.deps.Claims != nil {
		if err := i.deps.Claims.Free(ctx, addr, ipclaim.Holder{Namespace: pod.Namespace, Name: pod.Name}); err != nil {
			i.log.Warn("could not free the claim of a released PSTS address; the claim keeper will", "ip", addr, "err", err)
		}
	}
}
