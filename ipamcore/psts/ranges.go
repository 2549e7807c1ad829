package psts

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	k8snet "k8s.io/utils/net"

	cce "github.com/cce-ipam/sharded/ipamcore/apis/cce/v1alpha1"
)

// DefaultAvailableIndex is the reference's --subnet-available-index: the
// first two addresses of a subnet (network and gateway) are never given out.
const DefaultAvailableIndex = 2

// Range is an inclusive range of addresses of one family.
type Range struct {
	First, Last netip.Addr
}

// Contains reports whether a lies in r.
func (r Range) Contains(a netip.Addr) bool {
	return a.BitLen() == r.First.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Size is the number of addresses in r.
func (r Range) Size() *big.Int {
	first := new(big.Int).SetBytes(r.First.AsSlice())
	last := new(big.Int).SetBytes(r.Last.AsSlice())
	return last.Sub(last, first).Add(last, big.NewInt(1))
}

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// PrefixRange is the range of every address of p.
func PrefixRange(p netip.Prefix) Range {
	p = p.Masked()
	first := p.Addr()
	b := first.AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	last, _ := netip.AddrFromSlice(b)
	return Range{First: first, Last: last}
}

// AllowedRanges returns the ranges of subnet cidr that a pod of strategy typ
// may take an IPv4 address from, checked: every range lies inside the subnet
// and no two overlap. Fixed and Manual take alloc.IPv4 (single addresses)
// and alloc.IPv4Range (CIDRs); Custom takes the IPv4 custom[] ranges. With
// none given, the whole subnet is allowed. Elastic has no ranges (nil): the
// cloud picks the address.
func AllowedRanges(cidr netip.Prefix, alloc cce.SubnetAllocation, typ cce.IPAllocType) ([]Range, error) {
	return allowed(cidr, alloc, typ, k8snet.IPv4)
}

// AllowedRangesV6 is AllowedRanges for the IPv6 fields. BCE gives no IPv6
// cross-subnet addresses today; the fields are checked and carried.
func AllowedRangesV6(cidr netip.Prefix, alloc cce.SubnetAllocation, typ cce.IPAllocType) ([]Range, error) {
	return allowed(cidr, alloc, typ, k8snet.IPv6)
}

func allowed(cidr netip.Prefix, alloc cce.SubnetAllocation, typ cce.IPAllocType, family k8snet.IPFamily) ([]Range, error) {
	if !NeedsExclusive(typ) {
		return nil, nil
	}
	if !cidr.IsValid() {
		return nil, errors.New("the subnet has no valid CIDR")
	}
	var (
		out  []Range
		errs []string
	)
	add := func(r Range, what string) {
		if !PrefixRange(cidr).Contains(r.First) || !PrefixRange(cidr).Contains(r.Last) {
			errs = append(errs, fmt.Sprintf("%s %s is not inside the subnet %s", what, r, cidr))
			return
		}
		out = append(out, r)
	}
	switch typ {
	case cce.IPAllocTypeFixed, cce.IPAllocTypeManual:
		ips, cidrs := alloc.IPv4, alloc.IPv4Range
		if family == k8snet.IPv6 {
			ips, cidrs = alloc.IPv6, alloc.IPv6Range
		}
		for _, s := range ips {
			a, err := netip.ParseAddr(s)
			if err != nil || familyOf(a) != family {
				errs = append(errs, fmt.Sprintf("%q is not an IPv%s address", s, family))
				continue
			}
			add(Range{First: a, Last: a}, "address")
		}
		for _, s := range cidrs {
			p, err := netip.ParsePrefix(s)
			if err != nil || familyOf(p.Addr()) != family {
				errs = append(errs, fmt.Sprintf("%q is not an IPv%s CIDR", s, family))
				continue
			}
			add(PrefixRange(p), "range")
		}
	case cce.IPAllocTypeCustom:
		for _, c := range alloc.Custom {
			if c.Family != family {
				continue
			}
			for _, cr := range c.CustomIPRange {
				first, err1 := netip.ParseAddr(cr.Start)
				last, err2 := netip.ParseAddr(cr.End)
				if err1 != nil || err2 != nil || familyOf(first) != family || familyOf(last) != family {
					errs = append(errs, fmt.Sprintf("custom range %q-%q is not two IPv%s addresses", cr.Start, cr.End, family))
					continue
				}
				if last.Less(first) {
					errs = append(errs, fmt.Sprintf("custom range %s-%s ends before it starts", first, last))
					continue
				}
				add(Range{First: first, Last: last}, "custom range")
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	if len(out) == 0 {
		if familyOf(cidr.Addr()) != family {
			return nil, nil
		}
		return []Range{PrefixRange(cidr)}, nil
	}
	slices.SortFunc(out, func(a, b Range) int { return a.First.Compare(b.First) })
	for i := 1; i < len(out); i++ {
		if out[i].First.Compare(out[i-1].Last) <= 0 {
			return nil, fmt.Errorf("ranges %s and %s overlap", out[i-1], out[i])
		}
	}
	return out, nil
}

func familyOf(a netip.Addr) k8snet.IPFamily {
	if a.Is4() || a.Is4In6() {
		return k8snet.IPv4
	}
	return k8snet.IPv6
}

// Usable reports whether a may be given to a pod from subnet cidr: inside
// it, a global unicast address, not among its first availableIndex
// addresses (network, gateway) and not its last (the reference reserves it).
func Usable(cidr netip.Prefix, a netip.Addr, availableIndex int) bool {
	r := PrefixRange(cidr)
	if !r.Contains(a) || !a.IsGlobalUnicast() || a == r.Last {
		return false
	}
	first := r.First
	for range max(availableIndex, 0) {
		if a == first {
			return false
		}
		first = first.Next()
	}
	return true
}
