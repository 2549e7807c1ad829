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
