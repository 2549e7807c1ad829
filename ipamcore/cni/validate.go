package cni

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cce-ipam/sharded/ipamcore/podip"
	"github.com/cce-ipam/sharded/ipamcore/rpc"
)

// ErrInvalidRequest marks requests rejected before reaching the Backend.
var ErrInvalidRequest = errors.New("invalid request")

// ErrUnsupportedIPType is returned for an ADD of an IP type that cce-ipam
// does not serve (BBC, cross-VPC ENI, RoCE, ERI): those have their own IPAMs.
var ErrUnsupportedIPType = errors.New("unsupported IP type")

// foreignIPTypes names the IP types of other IPAMs, as a user knows them.
var foreignIPTypes = map[rpc.IPType]string{
	rpc.IPType_BBCPrimaryENIMultiIPType: "BBC",
	rpc.IPType_CrossVPCENIIPType:        "cross-VPC ENI",
	rpc.IPType_RoCEENIMultiIPType:       "RoCE",
	rpc.IPType_ERIENIMultiIPType:        "ERI",
}

// checkIPType refuses an ADD of another IPAM's IP type. Unknown values are
// served as BCC, as the reference does, since older plugins send 0 or
// garbage. A DEL is not checked: the pod's teardown must not be blocked, and
// whatever we hold for the pod is released as for BCC.
func checkIPType(t rpc.IPType) error {
	if name, ok := foreignIPTypes[t]; ok {
		return fmt.Errorf("%w %s (%d, %s pods): cce-ipam serves BCC pods (ENI secondary IPs) only",
			ErrUnsupportedIPType, t, int32(t), name)
	}
	return nil
}

// maxContainerIDLen bounds the infra container ID: runtimes use 64 hex
// characters; anything far longer is not a container ID.
const maxContainerIDLen = 256

// podRequest is the part every request message shares.
type podRequest interface {
	GetK8SPodName() string
	GetK8SPodNamespace() string
	GetK8SPodInfraContainerID() string
	GetK8SNodeName() string
}

// decode validates a request and turns it into a podip.PodRef.
func decode(req podRequest) (podip.PodRef, error) {
	if req == nil {
		return podip.PodRef{}, fmt.Errorf("%w: empty request", ErrInvalidRequest)
	}
	ref := podip.PodRef{
		Namespace:   req.GetK8SPodNamespace(),
		Name:        req.GetK8SPodName(),
		ContainerID: req.GetK8SPodInfraContainerID(),
		Node:        req.GetK8SNodeName(),
	}
	if msgs := validation.IsDNS1123Label(ref.Namespace); len(msgs) > 0 {
		return podip.PodRef{}, fmt.Errorf("%w: pod namespace %q: %s", ErrInvalidRequest, clip(ref.Namespace), strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(ref.Name); len(msgs) > 0 {
		return podip.PodRef{}, fmt.Errorf("%w: pod name %q: %s", ErrInvalidRequest, clip(ref.Name), strings.Join(msgs, "; "))
	}
	if err := validateContainerID(ref.ContainerID); err != nil {
		return podip.PodRef{}, err
	}
	if ref.Node != "" {
		if msgs := validation.IsDNS1123Subdomain(ref.Node); len(msgs) > 0 {
			return podip.PodRef{}, fmt.Errorf("%w: node name %q: %s", ErrInvalidRequest, clip(ref.Node), strings.Join(msgs, "; "))
		}
	}
	return ref, nil
}

func validateContainerID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: infra container ID is empty", ErrInvalidRequest)
	case len(id) > maxContainerIDLen:
		return fmt.Errorf("%w: infra container ID is %d bytes long (max %d)", ErrInvalidRequest, len(id), maxContainerIDLen)
	}
	for _, r := range id {
		if r == unicode.ReplacementChar || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("%w: infra container ID %q has a non-printable or space character", ErrInvalidRequest, clip(id))
		}
	}
	return nil
}

// clip keeps error messages short when a client sends megabytes of garbage.
// It cuts on a rune boundary: a reply with invalid UTF-8 cannot be marshalled.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
