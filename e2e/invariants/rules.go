package invariants

import (
	"net/netip"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// snapshot is everything one check looks at.
type snapshot struct {
	pods  []corev1.Pod           // in the checked namespaces
	weps  []cce.WorkloadEndpoint // every namespace (for the pool count)
	nodes []corev1.Node          // every node; scope is decided here
	enis  []ENI                  // the cloud's
	// For (g) only (Config.Claims): every IPClaim, the Subnet resources and
	// the PSTS objects of the checked namespaces.
	claims  []cce.IPClaim
	subnets []cce.Subnet
	spreads []cce.PodSubnetTopologySpread
	now     time.Time
}

// rules evaluates snapshots. It is pure apart from remembering since when
// each orphaned WorkloadEndpoint has been seen, for the grace period.
type rules struct {
	cfg         Config
	orphanSince map[string]time.Time // wep namespace/name/uid → first seen orphaned
	ghostSince  map[string]time.Time // wep namespace/name/uid/node/ip → first seen off its node's ENIs
	claimSince  map[string]time.Time // (g): a wep or an ENI address → first seen without its claim
}

func newRules(cfg Config) *rules {
	return &rules{
		cfg:         cfg,
		orphanSince: map[string]time.Time{},
		ghostSince:  map[string]time.Time{},
		claimSince:  map[string]time.Time{},
	}
}

func key(namespace, name string) string { return namespace + "/" + name }

func (r *rules) inNamespace(ns string) bool {
	if len(r.cfg.Namespaces) == 0 {
		return true
	}
	for _, n := range r.cfg.Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// inScope reports whether the IPAM is expected to serve node.
func (r *rules) inScope(n *corev1.Node) bool {
	if r.cfg.NodeSelector != nil {
		return r.cfg.NodeSelector.Matches(labels.Set(n.Labels))
	}
	return strings.HasPrefix(n.Spec.ProviderID, "cce://")
}

func instanceOf(n *corev1.Node) string {
	id, _ := strings.CutPrefix(n.Spec.ProviderID, "cce://")
	return id
}

// podIPs are the pod's addresses, PodIPs first.
func podIPs(p *corev1.Pod) []string {
	var out []string
	seen := map[string]bool{}
	for _, ip := range p.Status.PodIPs {
		if ip.IP != "" && !seen[ip.IP] {
			seen[ip.IP] = true
			out = append(out, ip.IP)
		}
	}
	if p.Status.PodIP != "" && !seen[p.Status.PodIP] {
		out = append(out, p.Status.PodIP)
	}
	return out
}

// live: not finished and not on the host's network.
func live(p *corev1.Pod) bool {
	return !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// indexed is a snapshot keyed for the rules: in-scope nodes by name, the
// addresses on each instance's in-use ENIs (and which of them lie outside
// their ENI's subnet: cross-subnet PSTS addresses), every wep and the
// checked pods by namespace/name.
type indexed struct {
	nodes    map[string]*corev1.Node
	cloudIPs map[string]map[string]bool // instance → addresses
	foreign  map[string]map[string]bool // instance → addresses outside their ENI's subnet CIDR
	weps     map[string]*cce.WorkloadEndpoint
	pods     map[string]*corev1.Pod
}

func (r *rules) evaluate(s snapshot) Violations {
	x := r.index(s)
	out := x.duplicateIPs()
	for k, p := range x.pods {
		out = append(out, r.checkRunningPod(k, p, x.weps[k], x.nodes, x.cloudIPs)...)
	}
	out = append(out, r.orphanWEPs(x, s.now)...)
	if r.cfg.WEPAddresses {
		out = append(out, r.checkWEPAddresses(s, x.nodes, x.cloudIPs, x.weps, x.pods)...)
	}
	if r.cfg.Claims {
		out = append(out, r.checkClaims(s, x)...)
	}
	if b := r.cfg.Pool; b != nil {
		out = append(out, x.poolBounds(b)...)
	}
	out.sort()
	return out
}

func (r *rules) index(s snapshot) indexed {
	x := indexed{
		nodes:    map[string]*corev1.Node{},
		cloudIPs: map[string]map[string]bool{},
		foreign:  map[string]map[string]bool{},
		weps:     map[string]*cce.WorkloadEndpoint{},
		pods:     map[string]*corev1.Pod{},
	}
	for i := range s.nodes {
		if r.inScope(&s.nodes[i]) {
			x.nodes[s.nodes[i].Name] = &s.nodes[i]
		}
	}
	// Cloud addresses per instance, on in-use ENIs only.
	for _, e := range s.enis {
		if !e.InUse || e.InstanceID == "" {
			continue
		}
		m := x.cloudIPs[e.InstanceID]
		if m == nil {
			m = map[string]bool{}
			x.cloudIPs[e.InstanceID] = m
		}
		own, ownErr := netip.ParsePrefix(e.SubnetCIDR)
		for _, ip := range e.IPs {
			m[canon(ip)] = true
			if a, err := netip.ParseAddr(ip); err == nil && ownErr == nil && !own.Masked().Contains(a.Unmap()) {
				if x.foreign[e.InstanceID] == nil {
					x.foreign[e.InstanceID] = map[string]bool{}
				}
				x.foreign[e.InstanceID][canon(ip)] = true
			}
		}
	}
	for i := range s.weps {
		w := &s.weps[i]
		x.weps[key(w.Namespace, w.Name)] = w
	}
	for i := range s.pods {
		p := &s.pods[i]
		if r.inNamespace(p.Namespace) {
			x.pods[key(p.Namespace, p.Name)] = p
		}
	}
	return x
}

// duplicateIPs applies (a): no two live pods share an IP. A terminating pod
// holds its IP only while its wep still names it: once the wep is gone (or
// names another IP) its sandbox was torn down (CNI DEL) and the IPAM may
// give the address out again, though the pod object, waiting for its
// kubelet to remove it, still shows the IP in its status.
func (x indexed) duplicateIPs() Violations {
	var out Violations
	holders := map[string][]string{}
	for k, p := range x.pods {
		if !live(p) {
			continue
		}
		for _, ip := range podIPs(p) {
			if w := x.weps[k]; p.DeletionTimestamp != nil && (w == nil || canon(w.Spec.IP) != canon(ip)) {
				continue
			}
			holders[canon(ip)] = append(holders[canon(ip)], k)
		}
	}
	for ip, ps := range holders {
		if len(ps) > 1 {
			sort.Strings(ps)
			out = append(out, Violation{
				Kind:   KindDuplicateIP,
				IP:     ip,
				Pods:   ps,
				Detail: "live pods share an IP",
			})
		}
	}
	return out
}

// orphanWEPs applies (c): no wep without its pod past the grace. It
// remembers since when each orphan has been seen and forgets the ones that
// are gone.
func (r *rules) orphanWEPs(x indexed, now time.Time) Violations {
	var out Violations
	seen := map[string]bool{}
	for k, w := range x.weps {
		if !r.inNamespace(w.Namespace) || w.IsFixedStatefulSet() || w.IsCustomReuse() {
			continue
		}
		if _, ok := x.pods[k]; ok {
			continue
		}
		id := k + "/" + string(w.UID)
		seen[id] = true
		since, ok := r.orphanSince[id]
		if !ok {
			since = now
			r.orphanSince[id] = since
		}
		if now.Sub(since) >= r.cfg.OrphanGrace {
			out = append(out, Violation{
				Kind:   KindOrphanWEP,
				WEP:    k,
				Node:   w.Spec.Node,
				IP:     w.Spec.IP,
				Detail: "WorkloadEndpoint without a pod for " + now.Sub(since).Round(time.Millisecond).String(),
			})
		}
	}
	for id := range r.orphanSince {
		if !seen[id] {
			delete(r.orphanSince, id)
		}
	}
	return out
}

// poolBounds applies (d): every cloud IP on a node is assigned or idle
// within the bounds. A cross-subnet address (outside its ENI's subnet) is
// never idle: the IPAM added it for one pod, so one not named by a wep is
// leaked.
func (x indexed) poolBounds(b *PoolBounds) Violations {
	var out Violations
	assigned := map[string]map[string]bool{} // node → IPs named by a wep
	for _, w := range x.weps {
		if assigned[w.Spec.Node] == nil {
			assigned[w.Spec.Node] = map[string]bool{}
		}
		assigned[w.Spec.Node][canon(w.Spec.IP)] = true
	}
	for name, n := range x.nodes {
		var idle, stray []string
		for ip := range x.cloudIPs[instanceOf(n)] {
			switch {
			case assigned[name][ip]:
			case x.foreign[instanceOf(n)][ip]:
				stray = append(stray, ip)
			default:
				idle = append(idle, ip)
			}
		}
		sortIPs(stray)
		for _, ip := range stray {
			out = append(out, Violation{
				Kind:   KindLeakedCrossSubnetIP,
				Node:   name,
				IP:     ip,
				Detail: "cross-subnet address on an ENI of instance " + instanceOf(n) + " named by no WorkloadEndpoint of the node",
			})
		}
		sortIPs(idle)
		switch {
		case len(idle) > b.Max:
			out = append(out, Violation{
				Kind:    KindLeakedIPs,
				Node:    name,
				IdleIPs: idle,
				Detail:  "idle cloud IPs above the pool maximum " + itoa(b.Max),
			})
		case len(idle) < b.Min:
			out = append(out, Violation{
				Kind:    KindPoolBelowMin,
				Node:    name,
				IdleIPs: idle,
				Detail:  "idle cloud IPs below the pool minimum " + itoa(b.Min),
			})
		}
	}
	return out
}

// checkRunningPod applies (b) to one pod.
func (r *rules) checkRunningPod(k string, p *corev1.Pod, w *cce.WorkloadEndpoint, nodes map[string]*corev1.Node,
	cloudIPs map[string]map[string]bool) Violations {
	if p.Status.Phase != corev1.PodRunning || p.Spec.HostNetwork || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return nil // a terminating pod's wep is released before the pod goes
	}
	n, ok := nodes[p.Spec.NodeName]
	if !ok {
		return nil // not a node the IPAM serves
	}
	ip := canon(p.Status.PodIP)
	var out Violations
	switch {
	case w == nil:
		out = append(out, Violation{Kind: KindMissingWEP, Pods: []string{k}, Node: n.Name, IP: ip,
			Detail: "Running pod has no WorkloadEndpoint"})
	case canon(w.Spec.IP) != ip || w.Spec.Node != p.Spec.NodeName:
		out = append(out, Violation{Kind: KindWEPMismatch, Pods: []string{k}, WEP: k, Node: n.Name, IP: ip,
			Detail: "pod has " + ip + " on " + p.Spec.NodeName + ", WorkloadEndpoint says " + w.Spec.IP + " on " + w.Spec.Node})
	}
	if !cloudIPs[instanceOf(n)][ip] {
		out = append(out, Violation{Kind: KindIPNotOnNode, Pods: []string{k}, Node: n.Name, IP: ip,
			Detail: "IP is on no in-use ENI of instance " + instanceOf(n)})
	}
	return out
}

// canon normalises an address so that equal IPs compare equal.
func canon(ip string) string {
	if a, err := netip.ParseAddr(ip); err == nil {
		return a.String()
	}
	return ip
}

func sortIPs(ips []string) {
	sort.Slice(ips, func(i, j int) bool {
		a, errA := netip.ParseAddr(ips[i])
		b, errB := netip.ParseAddr(ips[j])
		if errA != nil || errB != nil {
			return ips[i] < ips[j]
		}
		return a.Less(b)
	})
}

// checkWEPAddresses applies (e): no two weps of served nodes name one
// address (whatever their namespace), and the address a wep names is on an
// in-use ENI of the wep's node. A wep whose pod is live on that node must
// pass at once (WEPNotOnENI; a Running pod whose own IP is missing is
// already reported by (b)); any other wep (a fixed-IP reservation whose pod
// is away or moving, a pod terminating) gets cfg.GhostGrace (GhostWEP).
func (r *rules) checkWEPAddresses(s snapshot, nodes map[string]*corev1.Node, cloudIPs map[string]map[string]bool,
	weps map[string]*cce.WorkloadEndpoint, pods map[string]*corev1.Pod) Violations {
	var out Violations
	byIP := map[string][]string{}
	seen := map[string]bool{}
	for k, w := range weps {
		n, ok := nodes[w.Spec.Node]
		if !ok || w.Spec.IP == "" {
			continue
		}
		ip := canon(w.Spec.IP)
		byIP[ip] = append(byIP[ip], k)
		if cloudIPs[instanceOf(n)][ip] {
			continue
		}
		p := pods[k]
		if p != nil && live(p) && p.DeletionTimestamp == nil && p.Spec.NodeName == w.Spec.Node {
			if p.Status.Phase == corev1.PodRunning && canon(p.Status.PodIP) == ip {
				continue // (b) IPNotOnNode reports it
			}
			out = append(out, Violation{Kind: KindWEPNotOnENI, Pods: []string{k}, WEP: k, Node: n.Name, IP: ip,
				Detail: "the WorkloadEndpoint of a live pod names an IP on no in-use ENI of instance " + instanceOf(n)})
			continue
		}
		id := k + "/" + string(w.UID) + "/" + w.Spec.Node + "/" + ip
		seen[id] = true
		since, ok := r.ghostSince[id]
		if !ok {
			since = s.now
			r.ghostSince[id] = since
		}
		if s.now.Sub(since) >= r.cfg.GhostGrace {
			out = append(out, Violation{Kind: KindGhostWEP, WEP: k, Node: n.Name, IP: ip,
				Detail: "WorkloadEndpoint names an IP on no in-use ENI of instance " + instanceOf(n) + " for " +
					s.now.Sub(since).Round(time.Millisecond).String()})
		}
	}
	for id := range r.ghostSince {
		if !seen[id] {
			delete(r.ghostSince, id)
		}
	}
	for ip, ks := range byIP {
		if len(ks) > 1 {
			sort.Strings(ks)
			out = append(out, Violation{Kind: KindWEPSharedIP, IP: ip, WEP: strings.Join(ks, ","),
				Detail: "WorkloadEndpoints name the same IP"})
		}
	}
	return out
}
