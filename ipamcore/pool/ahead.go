package pool

import "time"

// PlanAhead decides whether the ENI sync creates an ENI for the node before
// its pool runs dry (spec §7.2.4), for a node whose annotations ask for it
// (Capacity.AheadOfDemand): yes below PreAttachedENIs, never at MaxENIs
// (the cap wins over the pre-attached count), otherwise yes when the spare
// room Σ(MaxIPsPerENI−1−used) over the attached ENIs is below WarmIPTarget,
// counting only idle addresses on an ENI whose subnet is exhausted or that
// backs off (it cannot grow now). Never while an ENI is being created
// (st.ENIPending, which the caller also sets for an ENI the cloud lists as
// available or attaching for the node).
func PlanAhead(capc Capacity, st NodeState, backoff map[string]Backoff, now time.Time) (bool, string) {
	if !capc.AheadOfDemand {
		return false, "node does not ask for enis ahead of demand"
	}
	return NeedENI(capc, st, backoff, 0, now)
}
