package v1alpha1

import (
	"net/netip"
	"strconv"
	"strings"
)

// IPPoolName returns the name of a node's own IPPool: "ippool-<node>". When
// the node is named by an IP address, its dots become dashes
// ("10.0.0.1" -> "ippool-10-0-0-1"), as the reference does; the colons of an
// IPv6 address become dashes too, so that the name is valid.
func IPPoolName(nodeName string) string {
	if _, err := netip.ParseAddr(nodeName); err == nil {
		nodeName = strings.NewReplacer(".", "-", ":", "-").Replace(nodeName)
	}
	return IPPoolNamePrefix + nodeName
}

// IPPoolNodeSelector returns the NodeSelector of a node's own IPPool:
// "kubernetes.io/hostname=<node>".
func IPPoolNodeSelector(nodeName string) string {
	return LabelHostname + "=" + nodeName
}

// StatefulSetName splits the name of a StatefulSet pod (and its wep),
// "<statefulset>-<ordinal>", and returns the StatefulSet's name, the value of
// LabelOwner. ok is false when the name does not end in "-<decimal>".
func StatefulSetName(podName string) (name string, ordinal int, ok bool) {
	i := strings.LastIndexByte(podName, '-')
	if i <= 0 || i == len(podName)-1 {
		return "", 0, false
	}
	digits := podName[i+1:]
	for _, c := range digits {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return "", 0, false
	}
	return podName[:i], n, true
}

// IsFixedStatefulSet reports whether the wep belongs to a StatefulSet pod
// with a fixed IP: type StatefulSet and enableFixIP "True".
func (w *WorkloadEndpoint) IsFixedStatefulSet() bool {
	return w.Spec.Type == WorkloadEndpointTypeStatefulSet && w.Spec.EnableFixIP == EnableFixIPTrue
}

// IsCustomReuse reports whether the wep belongs to a custom PSTS pod that
// reuses its IP: type ReuseIPPod and enableFixIP "True".
func (w *WorkloadEndpoint) IsCustomReuse() bool {
	return w.Spec.Type == WorkloadEndpointTypeReuseIPPod && w.Spec.EnableFixIP == EnableFixIPTrue
}

// ClaimName returns the name of the IPClaim of an address: the address
// itself for IPv4 ("10.0.1.5"), and for IPv6 its eight groups in lower-case
// hex without leading zeros, joined by dashes ("fd00::1" ->
// "fd00-0-0-0-0-0-0-1"). Every name is a valid DNS-1123 subdomain and names
// one address: an IPv4 name has dots and no dashes, an IPv6 name dashes and
// no dots, always eight groups, so AddrOfClaimName reverses it. An
// IPv4-mapped IPv6 address is named as its IPv4 address and a zone is
// dropped: both denote the same address of a subnet. The zero Addr has no
// name ("").
func ClaimName(addr netip.Addr) string {
	if !addr.IsValid() {
		return ""
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return addr.String()
	}
	b := addr.As16()
	out := make([]byte, 0, 39)
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			out = append(out, '-')
		}
		out = strconv.AppendUint(out, uint64(b[i])<<8|uint64(b[i+1]), 16)
	}
	return string(out)
}

// AddrOfClaimName is the inverse of ClaimName: the address an IPClaim of
// that name is for. ok is false for any name ClaimName does not return, so
// a claim with such a name is for no address.
func AddrOfClaimName(name string) (addr netip.Addr, ok bool) {
	if strings.ContainsRune(name, '.') {
		a, err := netip.ParseAddr(name)
		if err != nil || !a.Is4() || a.String() != name {
			return netip.Addr{}, false
		}
		return a, true
	}
	groups := strings.Split(name, "-")
	if len(groups) != 8 {
		return netip.Addr{}, false
	}
	var b [16]byte
	for i, g := range groups {
		// Exactly what ClaimName writes: no sign, no upper case, no
		// leading zeros.
		v, err := strconv.ParseUint(g, 16, 16)
		if err != nil || strconv.FormatUint(v, 16) != g {
			return netip.Addr{}, false
		}
		b[2*i], b[2*i+1] = byte(v>>8), byte(v)
	}
	a := netip.AddrFrom16(b)
	if a.Is4In6() {
		// ClaimName names these by their IPv4 address.
		return netip.Addr{}, false
	}
	return a, true
}
