package bench

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/shard"
)

// Item 5b's replica flags parse as the replica parses them: the budget set,
// the per-operation limits gone (the shared budget alone bounds the calls),
// follow-demand as asked.
func TestBudgetScaleArgs(t *testing.T) {
	for _, follow := range []bool{false, true} {
		var cc cloud.Config
		var sc shard.Config
		fs := pflag.NewFlagSet("replica", pflag.ContinueOnError)
		cc.RegisterFlags(fs)
		sc.RegisterFlags(fs)
		fs.Int("batch-add-ip-num", 0, "")
		fs.Int("idle-ip-pool-min-size", 0, "")
		fs.Int("idle-ip-pool-max-size", 0, "")
		if err := fs.Parse(budgetScaleArgs(follow)); err != nil {
			t.Fatal(err)
		}
		if cc.Rate != budgetScaleRate || cc.Burst != budgetScaleRate {
			t.Errorf("budget %v/%v, want %d/%d", cc.Rate, cc.Burst, budgetScaleRate, budgetScaleRate)
		}
		if len(cc.OpLimits) != 0 {
			t.Errorf("per-operation limits %v, want none", cc.OpLimits)
		}
		if sc.BudgetFollowDemand != follow {
			t.Errorf("follow-demand %v, want %v", sc.BudgetFollowDemand, follow)
		}
	}
}
