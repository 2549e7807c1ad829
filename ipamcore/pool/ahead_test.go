package pool

import (
	"testing"
	"time"
)

func TestPlanAhead(t *testing.T) {
	capc := Capacity{MaxIPsPerENI: 16, MaxENIs: 3, WarmIPTarget: 8, PreAttachedENIs: 2, AheadOfDemand: true}
	full := ENIState{ID: "eni-full", Total: 15, Assigned: 15}          // no room
	roomy := ENIState{ID: "eni-roomy", Total: 4, Idle: 2, Assigned: 2} // room 11 + idle 2
	low := ENIState{ID: "eni-low", Total: 12, Idle: 2, Assigned: 10}   // room 3 + idle 2 = 5
	exhausted := roomy
	exhausted.ID, exhausted.SubnetExhausted = "eni-exh", true // only its 2 idle count
	for _, tc := range []struct {
		name    string
		capc    Capacity
		st      NodeState
		backoff map[string]Backoff
		want    bool
	}{
		{"annotations off", Capacity{MaxIPsPerENI: 16, MaxENIs: 3, WarmIPTarget: 8, PreAttachedENIs: 2}, NodeState{}, nil, false},
		{"no ENI, below pre-attached", capc, NodeState{}, nil, true},
		{"one roomy ENI, still below pre-attached", capc, NodeState{ENIs: []ENIState{roomy}}, nil, true},
		{"pre-attached reached, spare 13 >= 8", capc, NodeState{ENIs: []ENIState{roomy, roomy}}, nil, false},
		{"spare 5 < warm 8", capc, NodeState{ENIs: []ENIState{full, low}}, nil, true},
		{"exhausted subnet counts idle only: 2 < 8", capc, NodeState{ENIs: []ENIState{full, exhausted}}, nil, true},
		{"backed-off ENI counts idle only", capc, NodeState{ENIs: []ENIState{full, roomy}},
			map[string]Backoff{"eni-roomy": {Until: t0.Add(time.Minute)}}, true},
		{"expired backoff counts its room", capc, NodeState{ENIs: []ENIState{full, roomy}},
			map[string]Backoff{"eni-roomy": {Until: t0.Add(-time.Minute)}}, false},
		{"max ENIs caps", capc, NodeState{ENIs: []ENIState{full, full, full}}, nil, false},
		{"max caps the pre-attached count", Capacity{MaxIPsPerENI: 16, MaxENIs: 1, WarmIPTarget: 8, PreAttachedENIs: 3,
			AheadOfDemand: true}, NodeState{ENIs: []ENIState{roomy}}, nil, false},
		{"an ENI in flight", capc, NodeState{ENIPending: true}, nil, false},
		{"warm target 0 never asks beyond pre-attached", Capacity{MaxIPsPerENI: 16, MaxENIs: 3, PreAttachedENIs: 1,
			AheadOfDemand: true}, NodeState{ENIs: []ENIState{full}}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := PlanAhead(tc.capc, tc.st, tc.backoff, t0)
			if got != tc.want {
				t.Fatalf("PlanAhead = %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}
