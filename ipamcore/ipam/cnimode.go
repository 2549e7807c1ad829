package ipam

import (
	"fmt"
	"strings"
)

// The reference's --cni-mode values that put BCC pods on ENI secondary IPs,
// the only thing cce-ipam serves. The suffix names the node agent's datapath
// (veth, ipvlan, or chosen by kernel), which the IPAM does not care about.
const (
	CNIModeSecondaryIPVeth       = "vpc-secondary-ip-veth"
	CNIModeSecondaryIPIPVlan     = "vpc-secondary-ip-ipvlan"
	CNIModeSecondaryIPAutoDetect = "vpc-secondary-ip-auto-detect"
	// The BBC modes: the reference serves BCC and BBC pods in them. We serve
	// the BCC nodes as in the vpc-secondary-ip modes; a BBC pod's request
	// gets an "unsupported IP type" error (and its DEL succeeds).
	CNIModeBBCSecondaryIPVeth       = "bbc-vpc-secondary-ip-veth"
	CNIModeBBCSecondaryIPIPVlan     = "bbc-vpc-secondary-ip-ipvlan"
	CNIModeBBCSecondaryIPAutoDetect = "bbc-vpc-secondary-ip-auto-detect"
)

// cniModes are the accepted --cni-mode values.
var cniModes = []string{
	CNIModeSecondaryIPVeth, CNIModeSecondaryIPIPVlan, CNIModeSecondaryIPAutoDetect,
	CNIModeBBCSecondaryIPVeth, CNIModeBBCSecondaryIPIPVlan, CNIModeBBCSecondaryIPAutoDetect,
}

// cniModeHelp is --cni-mode's help text: what each kind of mode does here.
const cniModeHelp = "the cluster's CNI mode, as the reference's --cni-mode: vpc-secondary-ip-{veth,ipvlan,auto-detect} " +
	"serve BCC pods from ENI secondary IPs; bbc-vpc-secondary-ip-* serve the BCC nodes the same way and answer BBC pods " +
	"\"unsupported IP type\"; vpc-route-*, cross-VPC and other modes are refused at start-up " +
	"(in them the reference's IPAM serves no BCC pod, and cce-ipam would only create ENIs nobody uses)"

// CNIModeServesBBC reports whether mode is one of the BBC modes, in which the
// reference also served BBC pods and cce-ipam does not.
func CNIModeServesBBC(mode string) bool {
	return strings.HasPrefix(mode, "bbc-")
}

// validateCNIMode accepts the modes in which BCC pods get ENI secondary IPs
// and refuses every other with the reason. Refusing a vpc-route mode (where
// the reference answers every request "unsupported ipType") rather than
// starting idle is deliberate: a started cce-ipam runs the warm pool and ENI
// sync, which would attach ENIs and hold IPs on every node of a cluster
// whose pods take their addresses from the node's pod CIDR.
func validateCNIMode(mode string) error {
	for _, m := range cniModes {
		if mode == m {
			return nil
		}
	}
	switch {
	case strings.HasPrefix(mode, "vpc-route-"):
		return fmt.Errorf("CNI mode %q: pods take addresses from the nodes' pod CIDRs (VPC routes), "+
			"cce-ipam has nothing to serve; do not deploy it in this mode", mode)
	case strings.Contains(mode, "crossvpc") || strings.Contains(mode, "cross-vpc"):
		return fmt.Errorf("CNI mode %q: cross-VPC ENIs are not served by cce-ipam", mode)
	}
	return fmt.Errorf("CNI mode %q: want one of %s", mode, strings.Join(cniModes, ", "))
}
