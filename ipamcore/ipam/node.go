package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/datastore"
	"github.com/cce-ipam/sharded/ipamcore/pool"
)

// node is what the IPAM keeps for one served node besides its datastore
// entry: the cloud view of its ENIs, the pool worker's wake-up channel, and
// the broadcast that allocations waiting for IPs block on.
type node struct {
	name       string
	instanceID string
	capacity   pool.Capacity // from the node's annotations
	cache      *nodeCache    // the node's pods and weps; set before the node is published

	wake     chan struct{} // capacity 1: a pending wake-up is never lost, never queued twice
	cancel   context.CancelFunc
	done     chan struct{}
	stopping chan struct{}  // closed by stop: waiting allocations give up
	inflight sync.WaitGroup // CNI calls, GC and ENI-sync work on the node (IPAM.acquire, acquireWork)
	// finishPending counts releases answered and not yet finished
	// (pendingFinish; their holds are in inflight).
	finishPending atomic.Int32
	stopOnce      sync.Once
	life          context.Context // ended by stop: acquireWork's contexts end with it
	endLife       context.CancelFunc

	mu       sync.Mutex
	missing  map[string]int          // ENI ID → syncs in a row that did not see it
	backoff  map[string]pool.Backoff // ENI ID → when it may grow again
	refilled chan struct{}           // closed and replaced whenever IPs are added
	waiting  int                     // allocations blocked on an empty pool
	lastErr  error                   // the pool's last cloud error
	planNote string                  // what the planner needs but cannot do

	drift ipDrift // per-address disagreements with the cloud (reconcile.go)
	// takenOverUntil: until then the addresses the takeover found wait for
	// their settling read and cooling, and waiting pods get fresh ones.
	takenOverUntil time.Time
	takenOverAt    time.Time     // the start of the takeover that built this node
	eniBackoff     time.Duration // after a failed ENI creation
	eniRetryAt     time.Time
	creatingENI    bool // an ENI creation runs (beginENI): at most one per node
	returns        map[string][]netip.Addr
}

func newNode(name, instanceID string, capacity pool.Capacity) *node {
	life, endLife := context.WithCancel(context.Background())
	return &node{
		life:       life,
		endLife:    endLife,
		name:       name,
		instanceID: instanceID,
		capacity:   capacity,
		wake:       make(chan struct{}, 1),
		done:       make(chan struct{}),
		stopping:   make(chan struct{}),
		missing:    map[string]int{},
		backoff:    map[string]pool.Backoff{},
		refilled:   make(chan struct{}),
	}
}

// poke wakes the pool worker without blocking.
func (n *node) poke() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *node) stop() {
	n.stopOnce.Do(func() { close(n.stopping) })
	n.endLife()
	if n.cancel != nil {
		n.cancel()
	}
}

// waitRefill registers a waiting allocation and returns the channel that is
// closed at the next refill, and a func to deregister.
func (n *node) waitRefill() (<-chan struct{}, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.waiting++
	return n.refilled, func() {
		n.mu.Lock()
		n.waiting--
		n.mu.Unlock()
	}
}

func (n *node) waiters() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.waiting
}

// refill wakes every allocation waiting for IPs.
func (n *node) refill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	close(n.refilled)
	n.refilled = make(chan struct{})
}

// The node labels that name a node's instance type: the deprecated beta one,
// which CCE sets and the reference reads, and its GA successor, which newer
// kubelets set alongside or instead.
const (
	LabelInstanceTypeBeta = "beta.kubernetes.io/instance-type"
	LabelInstanceType     = "node.kubernetes.io/instance-type"
)

// ErrNotBCCNode: the node is not one cce-ipam serves (ServesNode), on any
// replica.
var ErrNotBCCNode = errors.New("node is not a BCC node")

// bccInstanceTypes are the instance types whose pods get ENI secondary IPs
// (the reference's BCC nodes).
var bccInstanceTypes = []string{"BCC", "GPU", "DCC"}

// ServesNode reports whether cce-ipam serves a node, and if not why. It is a
// pure function of the Node object, so that every replica agrees on the set
// of served nodes.
//
// Served: a node with a cce:// providerID whose instance type label (the
// beta one, else the GA one) is BCC, GPU or DCC, as the reference selects
// them — or that has neither label. The reference skips an unlabelled node;
// we serve it as BCC, because CCE's BCC nodes carry the label and a node
// without it is an old or hand-joined one whose pods would otherwise get no
// address and no error saying why; a BBC, EBC or other instance is always
// labelled, and its label keeps it unserved (no ENI is ever attached to it).
func ServesNode(n *corev1.Node) (bool, string) {
	if n.DeletionTimestamp != nil {
		return false, "node is being deleted"
	}
	if _, err := instanceIDFromProviderID(n.Spec.ProviderID); err != nil {
		return false, err.Error()
	}
	label := LabelInstanceTypeBeta
	typ, ok := n.Labels[label]
	if !ok {
		label = LabelInstanceType
		if typ, ok = n.Labels[label]; !ok {
			return true, ""
		}
	}
	for _, t := range bccInstanceTypes {
		if strings.EqualFold(typ, t) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("instance type %s=%q is not BCC, GPU or DCC: its pods are not served by cce-ipam", label, typ)
}

// instanceIDFromProviderID reads "cce://i-xxxx" (CCE's providerID format).
func instanceIDFromProviderID(providerID string) (string, error) {
	id, ok := strings.CutPrefix(providerID, "cce://")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", fmt.Errorf("providerID %q is not cce://<instance-id>", providerID)
	}
	return id, nil
}

// rebuild builds a node's datastore entry from the cloud's ENIs of its
// instance (byInstance: a VPC-wide list taken after the node was won) and a
// quorum read of the WorkloadEndpoints on it (not the informer cache, which
// may lag behind a previous owner's last commits).
//
// claims, when not nil, are the node's wep claims from a bulk read that was
// also taken after the node was won (see ServeNodes); nil means read them.
//
// start is when the takeover began: the previous owner was fenced before it,
// so its last release and its last cloud write came earlier. Unclaimed
// addresses cool from then (its releases are recorded nowhere) and are held
// unsettled until a read ReadLag after it confirms them (settle.go).
func (i *IPAM) rebuild(ctx context.Context, name string, byInstance map[string][]cloud.ENI, claims []datastore.Claim,
	start time.Time) (*node, error) {
	// The node object only gives the instance and capacity, which do not
	// change: the cache will do, the API server when the cache lacks it.
	k8sNode, err := i.nodes.Get(name)
	if err != nil {
		if k8sNode, err = i.deps.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("get node: %w", err)
		}
	}
	if ok, why := ServesNode(k8sNode); !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotBCCNode, why)
	}
	instanceID, err := instanceIDFromProviderID(k8sNode.Spec.ProviderID)
	if err != nil {
		return nil, err
	}
	capacity, err := pool.CapacityFromAnnotations(k8sNode.Annotations, pool.DefaultCapacity())
	if err != nil {
		// One node's bad annotation must not stop it being served: the
		// defaults apply and the cloud stays the authority on what fits.
		i.log.Warn("node capacity annotations malformed; using defaults", "node", name, "err", err)
	}

	in := datastore.RestoreInput{
		CoolFrom:  start,
		Unsettled: true,
	}
	for _, e := range byInstance[instanceID] {
		if e.Status != cloud.ENIStatusInUse || e.InstanceID != instanceID {
			continue // attaching or detaching ENIs carry no pod IPs yet
		}
		de, ips, err := i.toDatastoreENI(ctx, e, capacity.MaxIPsPerENI)
		if err != nil {
			return nil, err
		}
		in.ENIs = append(in.ENIs, datastore.RestoreENI{
			ENI: de,
			IPs: ips,
		})
	}

	if claims == nil {
		var err error
		if claims, err = i.nodeClaims(ctx, name); err != nil {
			return nil, err
		}
	}
	in.Claims = claims

	if i.store.HasNode(name) {
		_, _ = i.store.RemoveNode(name)
	}
	report, err := i.store.Restore(name, in, i.deps.Clock.Now())
	if err != nil {
		return nil, fmt.Errorf("restore datastore: %w", err)
	}
	for _, c := range report.Conflicts {
		if c.Kind == datastore.ConflictUnclaimedCrossSubnet && c.Held {
			// No wep names it and it can serve no other pod: a release
			// whose cloud delete the previous owner did not finish, or an
			// ADD it never committed. Held, nothing would ever resolve it;
			// forgotten, the ENI sync deletes it once two reads agree (or
			// gives it to a wep that names it by then).
			if _, err := i.store.RemoveIP(name, c.Addr); err == nil {
				i.log.Info("rebuild: a cross-subnet address no wep names is left to the ENI sync", "node", name, "ip", c.Addr)
				continue
			}
		}
		i.log.Warn("conflict while rebuilding node; address held out of the pool", "node", name, "conflict", c.String())
	}
	n := newNode(name, instanceID, capacity)
	n.takenOverAt, n.takenOverUntil = start, start.Add(max(i.cfg.ReadLag, i.cfg.Cooldown))
	return n, nil
}

// nodeClaims is a quorum read (no resourceVersion) of one node's weps,
// filtered by the server on the CRD's selectable field spec.node: only this
// node's weps travel. A CRD without that field (the reference's, see
// wepselect.go) refuses the selector: then every wep is read in pages and
// filtered here.
func (i *IPAM) nodeClaims(ctx context.Context, name string) ([]datastore.Claim, error) {
	now := i.deps.Clock.Now()
	if i.wepSel.useField(now) {
		weps, err := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.node", name).String(),
		})
		switch {
		case err == nil:
			if i.wepSel.worked() {
				i.log.Info("the WorkloadEndpoint CRD accepts the spec.node field selector again; node reads are filtered by the API server")
			}
			claims := []datastore.Claim{}
			for k := range weps.Items {
				if w := &weps.Items[k]; w.Spec.Node == name { // defensive: a server without the selectable field
					claims = i.appendClaim(claims, w)
				}
			}
			return claims, nil
		case !IsFieldSelectorUnsupported(err):
			return nil, fmt.Errorf("list WorkloadEndpoints of the node: %w", err)
		}
		if i.wepSel.refused(now) {
			i.log.Warn("the WorkloadEndpoint CRD has no spec.node selectable field (a CRD installed by the reference?): "+
				"reading all weps and filtering them here until it is upgraded (see README, \"Migrating from cce-eni-ipam\")",
				"err", err)
		}
	}
	claims, err := i.bulkClaims(ctx, map[string]bool{name: true})
	if err != nil {
		return nil, err
	}
	return claims[name], nil
}

// bulkClaims reads every wep once, in pages of one quorum snapshot, and
// keeps the claims on the given nodes. A takeover of many nodes uses it:
// the server scans all weps once instead of once per node.
func (i *IPAM) bulkClaims(ctx context.Context, nodes map[string]bool) (map[string][]datastore.Claim, error) {
	out := make(map[string][]datastore.Claim, len(nodes))
	for name := range nodes {
		out[name] = []datastore.Claim{}
	}
	client := i.deps.CCE.CceV1alpha1().WorkloadEndpoints(metav1.NamespaceAll)
	opts := metav1.ListOptions{Limit: bulkClaimsPage}
	for {
		page, err := client.List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list WorkloadEndpoints: %w", err)
		}
		for k := range page.Items {
			if w := &page.Items[k]; nodes[w.Spec.Node] {
				out[w.Spec.Node] = i.appendClaim(out[w.Spec.Node], w)
			}
		}
		if page.Continue == "" {
			return out, nil
		}
		opts.Continue = page.Continue
	}
}

// bulkClaimsPage is the page size of bulkClaims' read.
const bulkClaimsPage = 1000

// appendClaim adds a wep's claim on its IP; a wep with an unparsable IP
// claims nothing (and is reported).
func (i *IPAM) appendClaim(claims []datastore.Claim, w *cce.WorkloadEndpoint) []datastore.Claim {
	addr, err := netip.ParseAddr(w.Spec.IP)
	if err != nil {
		i.log.Warn("WorkloadEndpoint with an unparsable IP ignored", "wep", w.Namespace+"/"+w.Name, "ip", w.Spec.IP)
		return claims
	}
	return append(claims, datastore.Claim{Addr: addr, Owner: datastore.Owner{
		Namespace: w.Namespace, Name: w.Name, ContainerID: w.Spec.ContainerID,
	}})
}

// toDatastoreENI converts a cloud ENI, looking up its subnet's CIDR so that
// cross-subnet addresses are told apart.
func (i *IPAM) toDatastoreENI(ctx context.Context, e cloud.ENI, maxIPs int) (datastore.ENI, []netip.Addr, error) {
	de := datastore.ENI{
		ID:       e.ID,
		SubnetID: e.SubnetID,
		MAC:      e.MACAddress,
		Capacity: maxIPs,
	}
	if sn, err := i.subnetCIDR(ctx, e.SubnetID); err == nil {
		de.SubnetCIDR = sn
	} else {
		i.log.Warn("subnet CIDR unknown; treating all ENI addresses as in-subnet", "eni", e.ID, "subnet", e.SubnetID, "err", err)
	}
	var ips []netip.Addr
	var skipped []string
	for _, p := range e.PrivateIPs {
		a, err := netip.ParseAddr(p.Address)
		switch {
		case err != nil && p.Primary:
			// Without its primary the ENI cannot be recorded at all.
			return de, nil, fmt.Errorf("ENI %s has an unparsable primary address %q", e.ID, p.Address)
		case err != nil:
			// One garbled secondary address must not leave the whole
			// node unserved (retried, listing the VPC each time): skip
			// it; it is never handed out, and a later read may show it
			// whole.
			skipped = append(skipped, p.Address)
		case p.Primary:
			de.PrimaryIP = a
		default:
			ips = append(ips, a)
		}
	}
	if len(skipped) > 0 {
		i.log.Warn("ENI has unparsable addresses in the cloud's reply; skipped them", "eni", e.ID,
			"skipped", len(skipped), "addresses", skipped)
	}
	return de, ips, nil
}

// subnetCIDR reads the Subnet CR first (kept by the subnet controller) and
// asks the cloud only when it is missing.
func (i *IPAM) subnetCIDR(ctx context.Context, subnetID string) (netip.Prefix, error) {
	var cidr string
	sn, err := i.subnets.Subnets(cce.SubnetNamespace).Get(subnetID)
	if err != nil {
		sn, err = i.deps.CCE.CceV1alpha1().Subnets(cce.SubnetNamespace).Get(ctx, subnetID, metav1.GetOptions{})
	}
	switch {
	case err == nil:
		cidr = sn.Spec.CIDR
	case apierrors.IsNotFound(err):
		s, err := i.deps.Cloud.DescribeSubnet(ctx, subnetID)
		if err != nil {
			return netip.Prefix{}, err
		}
		cidr = s.CIDR
	default:
		return netip.Prefix{}, err
	}
	return netip.ParsePrefix(cidr)
}

// instancesOf returns the instances of the named nodes from the node cache,
// to keep only their ENIs from a VPC-wide list; nil (keep every ENI) when a
// node is not cached or has no usable providerID, for rebuild then reads
// the node from the API server and must find its ENIs in the list.
func (i *IPAM) instancesOf(names []string) map[string]bool {
	out := make(map[string]bool, len(names))
	for _, name := range names {
		id, ok := i.instanceOf(name)
		if !ok {
			return nil
		}
		out[id] = true
	}
	return out
}

// instanceOf is the node's BCC instance, from the Node informer.
func (i *IPAM) instanceOf(name string) (string, bool) {
	k8sNode, err := i.nodes.Get(name)
	if err != nil {
		return "", false
	}
	id, err := instanceIDFromProviderID(k8sNode.Spec.ProviderID)
	return id, err == nil
}
