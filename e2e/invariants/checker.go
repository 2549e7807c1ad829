package invariants

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	cceclient "github.com/cce-ipam/sharded/ipamcore/generated/clientset/versioned"
)

// PoolBounds are the idle IPs a node may hold once the pool has settled.
type PoolBounds struct {
	Min, Max int
}

// Config says what a Checker checks.
type Config struct {
	// Namespaces limits the pods and WorkloadEndpoints of checks (a)-(c);
	// empty means every namespace. The pool check (d) always counts every
	// WorkloadEndpoint, whatever its namespace.
	Namespaces []string
	// NodeSelector picks the nodes the IPAM serves (checks (b) and (d)).
	// Nil means every node whose providerID is cce://<instance>.
	NodeSelector labels.Selector
	// OrphanGrace is how long a WorkloadEndpoint may exist without its pod
	// (a release or GC in progress) before it is a violation. The Checker
	// remembers since when it saw each orphan, so the grace spans checks.
	OrphanGrace time.Duration
	// Pool enables check (d) with these bounds; nil skips it. Run (d) once
	// the cluster has settled: a pool legitimately overshoots while it grows
	// and while released IPs cool down.
	Pool *PoolBounds
	// WEPAddresses enables check (e): no two WorkloadEndpoints of served
	// nodes name one address, and the address a WorkloadEndpoint names is on
	// an in-use ENI of its node in the cloud (read the cloud's true state:
	// WorldView, not a lagging API read). A wep whose pod is live on that
	// node must pass at every check; any other wep (a fixed-IP reservation,
	// a pod terminating or moving) within GhostGrace.
	WEPAddresses bool
	GhostGrace   time.Duration
	// Pools enables check (f): the owner's datastore assigns exactly as
	// many addresses on a node as WorkloadEndpoints name there. Run (f) once
	// the cluster has settled (WaitClean); nil skips it.
	Pools PoolSource
	// Claims enables check (g), I7 for exclusive subnets (Subnet resources
	// with spec.exclusive) and the PSTS pods of the checked namespaces:
	//   - no two WorkloadEndpoints (any namespace) name one address of an
	//     exclusive subnet (WEPSharedIP; (e) reports those of served nodes
	//     when it runs);
	//   - a WorkloadEndpoint of the checked namespaces naming an address of
	//     an exclusive subnet has the IPClaim of that address, held by the
	//     wep's pod (UnclaimedWEP);
	//   - an address of an exclusive subnet on an in-use ENI of a served
	//     node has an IPClaim held by some pod (UnclaimedIP);
	//   - a Running PSTS pod's address lies in one of the subnets its PSTS
	//     lists (OutsidePSTS; CIDRs from the Subnet resources).
	// An IPClaim has at most one holder by construction (one holder field,
	// named by its address). It needs the IPClaim CRD.
	Claims bool
	// ClaimGrace is how long a wep or an ENI address may lack its claim
	// before it is a violation: a wep listed just before its pod's DEL
	// freed the claim, an address whose claim the leader's orphan GC freed
	// before the node's leaked-IP GC removed it from the ENI. The Checker
	// remembers since when it saw each, so the grace spans checks.
	ClaimGrace time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// PoolCounts is what a node's owner says about the node's addresses.
type PoolCounts struct {
	Total, Idle, Assigned, Held int
}

// PoolSource asks a node's owner for its counts (e.g. a replica's
// /shard/node endpoint).
type PoolSource func(ctx context.Context, node string) (PoolCounts, error)

// Checker checks the IPAM's invariants against a live cluster and cloud.
// It is safe for concurrent use; checks run one at a time.
type Checker struct {
	kube  kubernetes.Interface
	cce   cceclient.Interface
	cloud CloudView

	mu    sync.Mutex
	rules *rules
}

// New builds a Checker. All three sources are required.
func New(cfg Config, kube kubernetes.Interface, cce cceclient.Interface, cloud CloudView) (*Checker, error) {
	if kube == nil || cce == nil || cloud == nil {
		return nil, errors.New("invariants: kube client, cce client and cloud view are required")
	}
	if cfg.Pool != nil && (cfg.Pool.Min < 0 || cfg.Pool.Max < cfg.Pool.Min) {
		return nil, fmt.Errorf("invariants: pool bounds [%d,%d] are not a range", cfg.Pool.Min, cfg.Pool.Max)
	}
	if cfg.OrphanGrace < 0 || cfg.GhostGrace < 0 || cfg.ClaimGrace < 0 {
		return nil, errors.New("invariants: orphan grace must not be negative")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Checker{
		kube:  kube,
		cce:   cce,
		cloud: cloud,
		rules: newRules(cfg),
	}, nil
}

// Check takes one snapshot (nodes, pods, WorkloadEndpoints, then the cloud's
// ENIs, each a consistent list) and returns every violation, sorted by kind.
// A finding about a Running pod is confirmed by reading the pod and its
// WorkloadEndpoint again, so a pod deleted while the snapshot was taken is
// not reported. An error means the snapshot could not be taken.
func (c *Checker) Check(ctx context.Context) (Violations, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s snapshot
	nodes, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	s.nodes = nodes.Items
	for _, ns := range c.namespaces() {
		pods, err := c.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		s.pods = append(s.pods, pods.Items...)
	}
	weps, err := c.cce.CceV1alpha1().WorkloadEndpoints(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list WorkloadEndpoints: %w", err)
	}
	s.weps = weps.Items
	if c.rules.cfg.Claims {
		if err := c.listClaims(ctx, &s); err != nil {
			return nil, err
		}
	}
	if s.enis, err = c.cloud.ENIs(ctx); err != nil {
		return nil, fmt.Errorf("list cloud ENIs: %w", err)
	}
	s.now = c.rules.cfg.Now()
	found := c.rules.evaluate(s)
	if c.rules.cfg.Pools != nil {
		vs, err := c.checkPools(ctx, s)
		if err != nil {
			return nil, err
		}
		found = append(found, vs...)
	}
	return c.confirm(ctx, found, s)
}

// listClaims reads what (g) needs: every IPClaim, the Subnet resources and
// the PSTS objects of the checked namespaces.
func (c *Checker) listClaims(ctx context.Context, s *snapshot) error {
	claims, err := c.cce.CceV1alpha1().IPClaims().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list IPClaims: %w", err)
	}
	s.claims = claims.Items
	subnets, err := c.cce.CceV1alpha1().Subnets(cce.SubnetNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Subnets: %w", err)
	}
	s.subnets = subnets.Items
	for _, ns := range c.namespaces() {
		list, err := c.cce.CceV1alpha1().PodSubnetTopologySpreads(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list PodSubnetTopologySpreads: %w", err)
		}
		s.spreads = append(s.spreads, list.Items...)
	}
	return nil
}

// checkPools applies (f) to every served node of the snapshot.
func (c *Checker) checkPools(ctx context.Context, s snapshot) (Violations, error) {
	named := map[string]int{}
	for _, w := range s.weps {
		if w.Spec.IP != "" {
			named[w.Spec.Node]++
		}
	}
	var out Violations
	for i := range s.nodes {
		n := &s.nodes[i]
		if !c.rules.inScope(n) {
			continue
		}
		pc, err := c.rules.cfg.Pools(ctx, n.Name)
		if err != nil {
			return nil, fmt.Errorf("pool of %s: %w", n.Name, err)
		}
		if pc.Assigned != named[n.Name] {
			out = append(out, Violation{Kind: KindDatastoreMismatch, Node: n.Name,
				Detail: fmt.Sprintf("the owner's datastore assigns %d addresses (%d idle, %d held, %d in all), WorkloadEndpoints name %d",
					pc.Assigned, pc.Idle, pc.Held, pc.Total, named[n.Name])})
		}
	}
	return out, nil
}

func (c *Checker) namespaces() []string {
	if len(c.rules.cfg.Namespaces) == 0 {
		return []string{metav1.NamespaceAll}
	}
	return c.rules.cfg.Namespaces
}

// confirm re-reads the pod and WorkloadEndpoint behind every (b) finding
// and drops it unless the same pod still breaks the rule.
func (c *Checker) confirm(ctx context.Context, found Violations, s snapshot) (Violations, error) {
	var out Violations
	for _, v := range found {
		if v.Kind == KindWEPNotOnENI {
			ok, err := c.confirmWEPNotOnENI(ctx, v)
			if err != nil {
				return nil, err
			}
			if ok {
				out = append(out, v)
			}
			continue
		}
		if v.Kind != KindMissingWEP && v.Kind != KindWEPMismatch && v.Kind != KindIPNotOnNode {
			out = append(out, v)
			continue
		}
		ns, name := splitKey(v.Pods[0])
		pod, err := c.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("confirm %s: %w", v.Pods[0], err)
		}
		if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil || canon(pod.Status.PodIP) != v.IP {
			continue // it moved on since the snapshot
		}
		if v.Kind == KindIPNotOnNode {
			out = append(out, v)
			continue
		}
		var wep *cce.WorkloadEndpoint
		switch w, err := c.cce.CceV1alpha1().WorkloadEndpoints(ns).Get(ctx, name, metav1.GetOptions{}); {
		case err == nil:
			wep = w
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("confirm %s: %w", v.Pods[0], err)
		}
		nodes := map[string]*corev1.Node{}
		for i := range s.nodes {
			nodes[s.nodes[i].Name] = &s.nodes[i]
		}
		for _, again := range c.rules.checkRunningPod(v.Pods[0], pod, wep, nodes, nil) {
			if again.Kind == v.Kind {
				out = append(out, again)
			}
		}
	}
	out.sort()
	return out, nil
}

// confirmWEPNotOnENI reads the pod, its wep and the cloud again: the
// finding stands if the pod is still live on the wep's node, the wep still
// names the address, and the node's ENIs still lack it.
func (c *Checker) confirmWEPNotOnENI(ctx context.Context, v Violation) (bool, error) {
	ns, name := splitKey(v.WEP)
	pod, err := c.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("confirm %s: %w", v.WEP, err)
	}
	w, err := c.cce.CceV1alpha1().WorkloadEndpoints(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("confirm %s: %w", v.WEP, err)
	}
	if !live(pod) || pod.DeletionTimestamp != nil || pod.Spec.NodeName != v.Node || w.Spec.Node != v.Node || canon(w.Spec.IP) != v.IP {
		return false, nil
	}
	node, err := c.kube.CoreV1().Nodes().Get(ctx, v.Node, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("confirm %s: %w", v.WEP, err)
	}
	enis, err := c.cloud.ENIs(ctx)
	if err != nil {
		return false, fmt.Errorf("confirm %s: list cloud ENIs: %w", v.WEP, err)
	}
	for _, e := range enis {
		if e.InUse && e.InstanceID == instanceOf(node) {
			for _, ip := range e.IPs {
				if canon(ip) == v.IP {
					return false, nil
				}
			}
		}
	}
	return true, nil
}

func splitKey(k string) (string, string) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return "", k
}

// WaitClean checks every interval until a check finds no violation or ctx
// ends; then it returns the last violations and ctx's error. Use it where
// the system is expected to converge (after GC, after a pool settles).
func (c *Checker) WaitClean(ctx context.Context, interval time.Duration) (Violations, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last Violations
	for {
		vs, err := c.Check(ctx)
		switch {
		case err == nil && len(vs) == 0:
			return nil, nil
		case err == nil:
			last = vs
		case ctx.Err() == nil:
			last = Violations{{
				Kind:   KindCheckFailed,
				Detail: err.Error(),
			}}
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-t.C:
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
