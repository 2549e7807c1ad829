package webhook

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cce-ipam/sharded/cloud"
	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
	"github.com/cce-ipam/sharded/ipamcore/psts"
)

// subnetUse is one subnet of an admitted PSTS: what the cloud says of it and
// whether its strategy needs it exclusive.
type subnetUse struct {
	id        string
	cloud     *cloud.Subnet
	typ       cce.IPAllocType
	exclusive bool
	pools     []*cce.IPPool // every IPPool, read for this review
}

// reviewPSTS answers the PSTS webhook: a PSTS whose spec is new (a CREATE,
// or an UPDATE that changes the spec) is checked against its own rules, the
// cloud and the subnets' other users; on admit (not a dry run) its subnets
// get their Subnet resources, exclusive where the strategy needs it.
func (s *Server) reviewPSTS(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	op := req.Operation
	if (op != admissionv1.Create && op != admissionv1.Update) || req.Resource.Resource != "podsubnettopologyspreads" ||
		req.SubResource != "" {
		return allow(), nil
	}
	var p cce.PodSubnetTopologySpread
	if err := decodeObject(req.Object.Raw, &p); err != nil {
		return nil, err
	}
	if p.Namespace == "" {
		p.Namespace = req.Namespace
	}
	if op == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		var old cce.PodSubnetTopologySpread
		if err := decodeObject(req.OldObject.Raw, &old); err != nil {
			return nil, err
		}
		// Metadata changes (finalizers, labels, deletion) pass: the spec was
		// checked when it was written, and must not be held hostage by a
		// cloud outage.
		if equality.Semantic.DeepEqual(old.Spec, p.Spec) || p.DeletionTimestamp != nil {
			return allow(), nil
		}
	}
	uses, err := s.checkPSTS(ctx, &p)
	if err != nil {
		return nil, err
	}
	if req.DryRun != nil && *req.DryRun {
		return allow(), nil
	}
	if err := s.ensureSubnets(ctx, uses); err != nil {
		return nil, err
	}
	return allow(), nil
}

// checkPSTS checks p and returns its subnets, or the refusal: invalid for
// a spec that cannot work, unavailable when the cloud could not be asked.
func (s *Server) checkPSTS(ctx context.Context, p *cce.PodSubnetTopologySpread) ([]subnetUse, error) {
	who := fmt.Sprintf("PodSubnetTopologySpread %s/%s", p.Namespace, p.Name)
	if errs := specErrors(p); len(errs) > 0 {
		return nil, invalid("%s: %s", who, strings.Join(errs, "; "))
	}
	ids := make([]string, 0, len(p.Spec.Subnets))
	for id := range p.Spec.Subnets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	pools, err := s.listPools(ctx)
	if err != nil {
		return nil, unavailable("%s: cannot read the IPPools now, try again: %v", who, err)
	}
	sortPools(pools)
	subnets, unknown, outage := s.describeSubnets(ctx, ids)
	if len(outage) > 0 {
		return nil, unavailable("%s: cannot check its subnets with the cloud now, try again: %s", who, strings.Join(outage, "; "))
	}
	if len(unknown) > 0 {
		return nil, invalid("%s: %s", who, strings.Join(unknown, "; "))
	}
	var (
		uses []subnetUse
		errs []string
	)
	for _, id := range ids {
		u := subnetUse{id: id, cloud: subnets[id], typ: psts.Resolve(p, id).Type, pools: pools}
		u.exclusive = psts.NeedsExclusive(u.typ)
		errs = append(errs, s.subnetErrors(p, u)...)
		uses = append(uses, u)
	}
	if len(errs) > 0 {
		return nil, invalid("%s: %s", who, strings.Join(errs, "; "))
	}
	return uses, nil
}

// specErrors are the mistakes visible in the spec alone.
func specErrors(p *cce.PodSubnetTopologySpread) []string {
	var errs []string
	if len(p.Spec.Subnets) == 0 {
		errs = append(errs, "spec.subnets is empty: list at least one subnet")
	}
	if p.Spec.Strategy != nil {
		errs = append(errs, strategyErrors("spec.strategy", *p.Spec.Strategy)...)
	}
	ids := make([]string, 0, len(p.Spec.Subnets))
	for id := range p.Spec.Subnets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if p.Spec.Strategy == nil { // otherwise the subnet's own strategy is not used
			errs = append(errs, strategyErrors("subnet "+id, p.Spec.Subnets[id].IPAllocationStrategy)...)
		}
	}
	if p.Spec.Selector != nil {
		if _, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err != nil {
			errs = append(errs, fmt.Sprintf("spec.selector: %v", err))
		}
	}
	switch p.Spec.WhenUnsatisfiable {
	case "", cce.DoNotSchedule, cce.ScheduleAnyway:
	default:
		errs = append(errs, fmt.Sprintf("spec.whenUnsatisfiable %q: want %s or %s", p.Spec.WhenUnsatisfiable,
			cce.DoNotSchedule, cce.ScheduleAnyway))
	}
	if p.Spec.MaxSkew < 0 {
		errs = append(errs, fmt.Sprintf("spec.maxSkew %d is negative", p.Spec.MaxSkew))
	}
	return errs
}

func strategyErrors(where string, st cce.IPAllocationStrategy) []string {
	var errs []string
	if !psts.Known(st.Type) {
		errs = append(errs, fmt.Sprintf("%s: unknown strategy type %q (want Elastic, Fixed, Manual or Custom)", where, st.Type))
	}
	switch st.ReleaseStrategy {
	case "", cce.ReleaseStrategyTTL, cce.ReleaseStrategyNever:
	default:
		errs = append(errs, fmt.Sprintf("%s: unknown release strategy %q (want TTL or Never)", where, st.ReleaseStrategy))
	}
	if st.TTL != nil && st.TTL.Duration < 0 {
		errs = append(errs, fmt.Sprintf("%s: ttl %s is negative", where, st.TTL.Duration))
	}
	return errs
}

// describeSubnets asks the cloud about every subnet, four at a time. It
// returns the subnets found, the refusals for the ones the cloud does not
// know, and the failures to ask (an outage: worth a retry).
func (s *Server) describeSubnets(ctx context.Context, ids []string) (map[string]*cloud.Subnet, []string, []string) {
	var (
		mu              sync.Mutex
		found           = map[string]*cloud.Subnet{}
		unknown, outage []string
	)
	g := errgroup.Group{}
	g.SetLimit(4)
	for _, id := range ids {
		g.Go(func() error {
			sn, err := s.cloud.DescribeSubnet(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch cloud.ClassOf(err) {
			case cloud.ClassUnknown:
				if err == nil {
					found[id] = sn
					return nil
				}
				outage = append(outage, fmt.Sprintf("subnet %s: %v", id, err))
			case cloud.ClassNotFound:
				unknown = append(unknown, fmt.Sprintf("subnet %s does not exist in the cloud (DescribeSubnet: not found)", id))
			case cloud.ClassInvalidRequest:
				unknown = append(unknown, fmt.Sprintf("subnet %q is not a valid subnet ID", id))
			default:
				outage = append(outage, fmt.Sprintf("subnet %s: %v", id, err))
			}
			return nil
		})
	}
	_ = g.Wait() // the goroutines return nil
	slices.Sort(unknown)
	slices.Sort(outage)
	return found, unknown, outage
}

// subnetErrors are the refusals for one subnet of p: ranges that do not fit
// it, and a use that conflicts with its other users.
func (s *Server) subnetErrors(p *cce.PodSubnetTopologySpread, u subnetUse) []string {
	what := fmt.Sprintf("subnet %s (%s strategy)", u.id, u.typ)
	cidr, err := netip.ParsePrefix(u.cloud.CIDR)
	if err != nil {
		return []string{fmt.Sprintf("%s: the cloud reports CIDR %q: %v", what, u.cloud.CIDR, err)}
	}
	var errs []string
	if _, err := psts.AllowedRanges(cidr, p.Spec.Subnets[u.id], u.typ); err != nil {
		errs = append(errs, fmt.Sprintf("%s: addresses do not fit the subnet %s: %v", what, cidr, err))
	}
	cr, _ := s.subnetLister.Subnets(cce.SubnetNamespace).Get(u.id)
	if !u.exclusive {
		if cr != nil && cr.Spec.Exclusive {
			errs = append(errs, fmt.Sprintf("%s: the subnet is exclusive (reserved for Fixed, Manual and Custom addresses); "+
				"Elastic needs a subnet that is not", what))
		}
		if other := s.otherPSTS(p, u.id, true); other != "" {
			errs = append(errs, fmt.Sprintf("%s: the subnet is used by %s, which needs it exclusive", what, other))
		}
		return errs
	}
	if pool := poolListing(u.pools, u.id); pool != "" {
		errs = append(errs, fmt.Sprintf("%s: the subnet is an ENI subnet of IPPool %s (spec.eni.subnets); "+
			"%s needs a subnet that no ENI uses", what, pool, u.typ))
	}
	if cr == nil || !cr.Spec.Exclusive {
		if eni := eniUsing(u.pools, u.id, cidr); eni != "" {
			errs = append(errs, fmt.Sprintf("%s: the subnet is not exclusive and %s; %s needs a subnet that no ENI uses", what, eni, u.typ))
		}
		if other := s.otherPSTS(p, u.id, false); other != "" {
			errs = append(errs, fmt.Sprintf("%s: the subnet is used by %s, which takes addresses from the cloud", what, other))
		}
	}
	return errs
}

// poolListing names an IPPool that lists subnet among its ENI subnets.
func poolListing(pools []*cce.IPPool, subnet string) string {
	for _, pool := range pools {
		if slices.Contains(pool.Spec.ENI.Subnets, subnet) {
			return pool.Namespace + "/" + pool.Name
		}
	}
	return ""
}

// eniUsing describes an ENI (from the IPPools' status) in the subnet or
// holding one of its addresses; "" when none does.
func eniUsing(pools []*cce.IPPool, subnet string, cidr netip.Prefix) string {
	for _, pool := range pools {
		for _, id := range slices.Sorted(maps.Keys(pool.Status.ENI.ENIs)) {
			eni := pool.Status.ENI.ENIs[id]
			if eni.Subnet == subnet {
				return fmt.Sprintf("ENI %s of IPPool %s/%s is in it", id, pool.Namespace, pool.Name)
			}
			for _, ip := range eni.PrivateIPSet {
				if a, err := netip.ParseAddr(ip.PrivateIPAddress); err == nil && cidr.Contains(a) {
					return fmt.Sprintf("ENI %s of IPPool %s/%s holds its address %s", id, pool.Namespace, pool.Name, a)
				}
			}
		}
	}
	return ""
}

// otherPSTS names another PSTS that lists subnet with an exclusive strategy
// (exclusive true) or an Elastic one (false); "" when there is none.
func (s *Server) otherPSTS(p *cce.PodSubnetTopologySpread, subnet string, exclusive bool) string {
	all, _ := s.pstsLister.List(labels.Everything())
	slices.SortFunc(all, func(a, b *cce.PodSubnetTopologySpread) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, o := range all {
		if o.Namespace == p.Namespace && o.Name == p.Name {
			continue
		}
		if _, ok := o.Spec.Subnets[subnet]; !ok {
			continue
		}
		if t := psts.Resolve(o, subnet).Type; psts.NeedsExclusive(t) == exclusive {
			return fmt.Sprintf("%s PodSubnetTopologySpread %s/%s", t, o.Namespace, o.Name)
		}
	}
	return ""
}

func sortPools(pools []*cce.IPPool) {
	slices.SortFunc(pools, func(a, b *cce.IPPool) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
}
