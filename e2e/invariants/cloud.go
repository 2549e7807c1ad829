package invariants

import (
	"context"
	"strings"

	"github.com/cce-ipam/sharded/cloud"
	"github.com/cce-ipam/sharded/cloud/bcesim"
)

// ENI is a cloud ENI as the checker sees it.
type ENI struct {
	ID         string
	Name       string
	InstanceID string // empty when unattached
	InUse      bool   // attached and usable ("inuse")
	// SubnetID and SubnetCIDR are the ENI's own subnet; SubnetCIDR is ""
	// when the view does not know it. An address outside SubnetCIDR was
	// added from another subnet (PSTS): it is never idle.
	SubnetID   string
	SubnetCIDR string
	// IPs are the secondary (non-primary) private addresses: the ones pods
	// get.
	IPs []string
}

// CloudView lists the cloud's ENIs. Implementations: SimView (an in-process
// bcesim.Server), WorldView (a bce-sim process's admin API) and ProviderView
// (the BCE API, e.g. the real cloud).
type CloudView interface {
	ENIs(ctx context.Context) ([]ENI, error)
}

// Dumper is what SimView reads: *bcesim.Server.
type Dumper interface {
	Dump() bcesim.WorldDump
}

// SimView reads an in-process simulator's world; only ENIs whose name starts
// with namePrefix (e.g. "<clusterID>/") count, all when it is empty.
func SimView(sim Dumper, namePrefix string) CloudView {
	return WorldView(func(context.Context) (bcesim.WorldDump, error) { return sim.Dump(), nil }, namePrefix)
}

// WorldSource returns a simulator's whole world, e.g. from bce-sim's
// GET /admin/world.
type WorldSource func(ctx context.Context) (bcesim.WorldDump, error)

// WorldView reads a simulator's world from src, ENIs filtered by namePrefix
// as in SimView. Unlike ProviderView it takes no token of the simulated
// API's per-operation limits, so checking does not throttle (or get
// throttled by) the replicas under test.
func WorldView(src WorldSource, namePrefix string) CloudView {
	return worldView{src, namePrefix}
}

type worldView struct {
	src    WorldSource
	prefix string
}

func (v worldView) ENIs(ctx context.Context) ([]ENI, error) {
	world, err := v.src(ctx)
	if err != nil {
		return nil, err
	}
	cidrs := map[string]string{}
	for _, sn := range world.Subnets {
		cidrs[sn.SubnetID] = sn.CIDR
	}
	var out []ENI
	for _, e := range world.ENIs {
		if !strings.HasPrefix(e.Name, v.prefix) {
			continue
		}
		x := ENI{
			ID:         e.ENIID,
			Name:       e.Name,
			InstanceID: e.InstanceID,
			InUse:      e.Status == bcesim.StatusInUse,
			SubnetID:   e.SubnetID,
			SubnetCIDR: cidrs[e.SubnetID],
		}
		for _, ip := range e.PrivateIPSet {
			if !ip.Primary {
				x.IPs = append(x.IPs, ip.PrivateIPAddress)
			}
		}
		out = append(out, x)
	}
	return out, nil
}

// ENILister is what ProviderView reads: cloud.Provider, *cloud.Client.
type ENILister interface {
	ListENIs(ctx context.Context, opts cloud.ListENIsOptions) ([]cloud.ENI, error)
}

// SubnetLister is what ProviderView also reads when the ENILister has it
// (cloud.Provider, *cloud.Client do): the VPC's subnets, for the ENIs'
// subnet CIDRs.
type SubnetLister interface {
	ListSubnets(ctx context.Context, opts cloud.ListSubnetsOptions) ([]cloud.Subnet, error)
}

// ProviderView lists the VPC's ENIs named with namePrefix through the BCE
// API (one paginated, VPC-wide list per check, and one subnet list when p
// is also a SubnetLister). Each check spends a token of the API's ListENIs
// limit: against bce-sim prefer WorldView.
func ProviderView(p ENILister, vpcID, namePrefix string) CloudView {
	return providerView{p, vpcID, namePrefix}
}

type providerView struct {
	p      ENILister
	vpc    string
	prefix string
}

func (v providerView) ENIs(ctx context.Context) ([]ENI, error) {
	enis, err := v.p.ListENIs(ctx, cloud.ListENIsOptions{
		VPCID:      v.vpc,
		NamePrefix: v.prefix,
	})
	if err != nil {
		return nil, err
	}
	cidrs := map[string]string{}
	if sl, ok := v.p.(SubnetLister); ok {
		subnets, err := sl.ListSubnets(ctx, cloud.ListSubnetsOptions{VPCID: v.vpc})
		if err != nil {
			return nil, err
		}
		for _, sn := range subnets {
			cidrs[sn.ID] = sn.CIDR
		}
	}
	out := make([]ENI, 0, len(enis))
	for _, e := range enis {
		x := ENI{
			ID:         e.ID,
			Name:       e.Name,
			InstanceID: e.InstanceID,
			InUse:      e.Status == cloud.ENIStatusInUse,
			SubnetID:   e.SubnetID,
			SubnetCIDR: cidrs[e.SubnetID],
		}
		for _, ip := range e.PrivateIPs {
			if !ip.Primary {
				x.IPs = append(x.IPs, ip.Address)
			}
		}
		out = append(out, x)
	}
	return out, nil
}
