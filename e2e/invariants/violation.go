package invariants

import (
	"fmt"
	"sort"
	"strings"
)

// Kind names the invariant a Violation breaks.
type Kind string

// Violation kinds, grouped by the invariant they belong to.
const (
	// (a) I3: two live pods hold the same IP.
	KindDuplicateIP Kind = "DuplicateIP"
	// (b) a Running pod has no WorkloadEndpoint.
	KindMissingWEP Kind = "MissingWEP"
	// (b) a Running pod's IP or node differs from its WorkloadEndpoint's.
	KindWEPMismatch Kind = "WEPMismatch"
	// (b) a Running pod's IP is not on any in-use ENI of its node's instance.
	KindIPNotOnNode Kind = "IPNotOnNode"
	// (c) a WorkloadEndpoint has had no pod for longer than the grace.
	KindOrphanWEP Kind = "OrphanWEP"
	// (d) I4: a node holds more idle cloud IPs (neither named by a
	// WorkloadEndpoint nor reserved) than the pool's maximum: leaked.
	KindLeakedIPs Kind = "LeakedIPs"
	// (d) a node holds fewer idle IPs than the pool's minimum.
	KindPoolBelowMin Kind = "PoolBelowMin"
	// (d) I4: an address outside its ENI's subnet (added from a PSTS
	// subnet) is named by no WorkloadEndpoint of its node: such an address
	// is never idle, so it leaked.
	KindLeakedCrossSubnetIP Kind = "LeakedCrossSubnetIP"
	// (e) the WorkloadEndpoint of a live pod names an IP that is on no
	// in-use ENI of the wep's node in the cloud.
	KindWEPNotOnENI Kind = "WEPNotOnENI"
	// (e) a ghost: a WorkloadEndpoint without a live pod on its node (a
	// fixed-IP reservation, a pod terminating) has named an IP on no in-use
	// ENI of its node for longer than the grace.
	KindGhostWEP Kind = "GhostWEP"
	// (e) a ghost: two WorkloadEndpoints name the same IP.
	KindWEPSharedIP Kind = "WEPSharedIP"
	// (f) a ghost: a node's owner holds fewer (or more) addresses assigned
	// in its datastore than WorkloadEndpoints name on the node, so some wep
	// names an address the owner keeps idle, or an address is assigned
	// with no wep. Only meaningful once the cluster has settled.
	KindDatastoreMismatch Kind = "DatastoreMismatch"
	// (g) I7: a WorkloadEndpoint names an address of an exclusive subnet
	// and no IPClaim of that address is held by the wep's pod (past the
	// claim grace).
	KindUnclaimedWEP Kind = "UnclaimedWEP"
	// (g) I7: an address of an exclusive subnet is on an in-use ENI of a
	// served node and no IPClaim of it is held (past the claim grace).
	KindUnclaimedIP Kind = "UnclaimedIP"
	// (g) a Running PSTS pod's address lies in none of its PSTS's subnets.
	KindOutsidePSTS Kind = "OutsidePSTS"
	// I5: more BCE API calls reached the cloud in one second than the
	// replicas' global rate + burst.
	KindBudgetExceeded Kind = "BudgetExceeded"
	// KindCheckFailed is reported by WaitClean when the last check could
	// not take its snapshot.
	KindCheckFailed Kind = "CheckFailed"
)

// Violation is one broken invariant, with the objects involved.
type Violation struct {
	Kind    Kind
	Node    string   // the node involved, if any
	Pods    []string // namespace/name of the pods involved
	WEP     string   // namespace/name of the WorkloadEndpoint involved
	IP      string   // the address involved
	IdleIPs []string // for KindLeakedIPs / KindPoolBelowMin: the node's idle IPs
	Detail  string
}

// String renders the violation on one line.
func (v Violation) String() string {
	var b strings.Builder
	b.WriteString(string(v.Kind))
	add := func(k, val string) {
		if val != "" {
			fmt.Fprintf(&b, " %s=%s", k, val)
		}
	}
	add("node", v.Node)
	add("pods", strings.Join(v.Pods, ","))
	add("wep", v.WEP)
	add("ip", v.IP)
	if len(v.IdleIPs) > 0 || v.Kind == KindLeakedIPs || v.Kind == KindPoolBelowMin {
		add("idle", fmt.Sprintf("%d[%s]", len(v.IdleIPs), strings.Join(v.IdleIPs, ",")))
	}
	if v.Detail != "" {
		b.WriteString(": ")
		b.WriteString(v.Detail)
	}
	return b.String()
}

// Violations is the result of a check; empty means every invariant held.
type Violations []Violation

// String renders one violation per line, for test logs.
func (vs Violations) String() string {
	if len(vs) == 0 {
		return "no violations"
	}
	lines := make([]string, len(vs))
	for i, v := range vs {
		lines[i] = v.String()
	}
	return fmt.Sprintf("%d violation(s):\n  %s", len(vs), strings.Join(lines, "\n  "))
}

// Of returns the violations of one kind.
func (vs Violations) Of(k Kind) Violations {
	var out Violations
	for _, v := range vs {
		if v.Kind == k {
			out = append(out, v)
		}
	}
	return out
}

// Kinds counts the violations per kind.
func (vs Violations) Kinds() map[Kind]int {
	out := map[Kind]int{}
	for _, v := range vs {
		out[v.Kind]++
	}
	return out
}

func (vs Violations) sort() {
	sort.SliceStable(vs, func(i, j int) bool {
		if vs[i].Kind != vs[j].Kind {
			return vs[i].Kind < vs[j].Kind
		}
		return vs[i].String() < vs[j].String()
	})
}
