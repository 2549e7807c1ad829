package webhook

import (
	"context"
	"net/netip"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// ensureSubnets gives every subnet of an admitted PSTS its Subnet resource:
// created from the cloud's description when missing (enabled, exclusive if
// the strategy needs it), or marked exclusive when it exists, is not, and
// nothing uses it. Concurrent admissions on other replicas are settled by
// the API server: Create is exclusive and the Update carries the
// resourceVersion read. A failure refuses the PSTS with a retryable answer.
func (s *Server) ensureSubnets(ctx context.Context, uses []subnetUse) error {
	for _, u := range uses {
		if err := s.ensureSubnet(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) ensureSubnet(ctx context.Context, u subnetUse) error {
	if cr, err := s.subnetLister.Subnets(cce.SubnetNamespace).Get(u.id); err == nil && (!u.exclusive || cr.Spec.Exclusive) {
		return s.checkExclusive(u, cr) // nothing to write
	}
	client := s.cce.CceV1alpha1().Subnets(cce.SubnetNamespace)
	var lastErr error
	for range 3 {
		cur, err := client.Get(ctx, u.id, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = client.Create(ctx, newSubnet(u), metav1.CreateOptions{})
			if err == nil {
				s.log.Info("subnet resource created for a PSTS", "subnet", u.id, "exclusive", u.exclusive)
				return nil
			}
		case err == nil:
			if err := s.checkExclusive(u, cur); err != nil || !u.exclusive || cur.Spec.Exclusive {
				return err
			}
			if eni := eniUsing(u.pools, u.id, mustPrefix(cur.Spec.CIDR, u)); eni != "" {
				return invalid("subnet %s (%s strategy): the subnet is not exclusive and %s", u.id, u.typ, eni)
			}
			upd := cur.DeepCopy()
			upd.Spec.Exclusive = true
			_, err = client.Update(ctx, upd, metav1.UpdateOptions{})
			if err == nil {
				s.log.Info("subnet resource marked exclusive for a PSTS", "subnet", u.id)
				return nil
			}
		}
		if !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
			return unavailable("subnet %s: cannot record its Subnet resource now, try again: %v", u.id, err)
		}
		lastErr = err // another writer was first: read again
	}
	return unavailable("subnet %s: its Subnet resource keeps changing, try again: %v", u.id, lastErr)
}

// checkExclusive refuses an Elastic use of a subnet that became exclusive
// (another PSTS was admitted at the same time).
func (s *Server) checkExclusive(u subnetUse, cr *cce.Subnet) error {
	if !u.exclusive && cr.Spec.Exclusive {
		return invalid("subnet %s (%s strategy): the subnet is exclusive (reserved for Fixed, Manual and Custom addresses); "+
			"Elastic needs a subnet that is not", u.id, u.typ)
	}
	return nil
}

// mustPrefix is the Subnet resource's CIDR, or the cloud's when the
// resource's does not parse.
func mustPrefix(cidr string, u subnetUse) netip.Prefix {
	if p, err := netip.ParsePrefix(cidr); err == nil {
		return p
	}
	p, _ := netip.ParsePrefix(u.cloud.CIDR)
	return p
}

func newSubnet(u subnetUse) *cce.Subnet {
	avail := int32(min(max(u.cloud.AvailableIP, 0), 1<<31-1))
	return &cce.Subnet{
		ObjectMeta: metav1.ObjectMeta{Name: u.id, Namespace: cce.SubnetNamespace},
		Spec: cce.SubnetSpec{
			ID:               u.id,
			Name:             u.cloud.Name,
			AvailabilityZone: u.cloud.ZoneName,
			CIDR:             u.cloud.CIDR,
			Exclusive:        u.exclusive,
		},
		Status: cce.SubnetStatus{
			Enable:         true,
			AvailableIPNum: avail,
			HasNoMoreIP:    avail == 0,
		},
	}
}
