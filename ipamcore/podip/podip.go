package podip

import (
	"context"
	"errors"
)

// PodRef identifies the pod sandbox a CNI call is about.
type PodRef struct {
	Namespace string
	Name      string
	// ContainerID is the infra (sandbox) container ID. It guards release: a
	// DEL carrying an older sandbox's ID must not free a newer sandbox's IP.
	ContainerID string
	// Node is the node the plugin runs on, when the plugin sends it; the
	// Backend reads the authoritative node from the pod.
	Node string
}

func (p PodRef) String() string {
	return p.Namespace + "/" + p.Name + " (" + shortID(p.ContainerID) + ")"
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Endpoint is a pod's network assignment as the CNI plugin sees it; the
// Backend fills it from the pod's WorkloadEndpoint.
type Endpoint struct {
	IP                string
	Type              string
	MAC               string
	Gateway           string
	ENIID             string
	Node              string
	SubnetID          string
	EnableFixIP       string
	FixIPDeletePolicy string
}

// Backend allocates and releases. Every method is called concurrently, with a
// context that carries the request deadline, and must be idempotent for the
// same PodRef: kubelet retries ADD and DEL.
type Backend interface {
	// Allocate returns the pod's IP, assigning one if it has none. A repeated
	// ADD for the same sandbox returns the same IP.
	Allocate(ctx context.Context, pod PodRef) (Endpoint, error)
	// Release frees the pod's IP. It returns ok=false, and no error, when
	// there is nothing to free (an unknown pod, or a DEL whose container ID
	// is not the current sandbox's): DEL must succeed then.
	Release(ctx context.Context, pod PodRef) (ep Endpoint, ok bool, err error)
	// Check returns the pod's current assignment, ok=false if it has none.
	Check(ctx context.Context, pod PodRef) (ep Endpoint, ok bool, err error)
}

// ErrNotHere is the kind of a refusal that says "this replica does not serve
// the pod's node now; routing again may find the owner". Every layer's own
// refusal of that sort (the IPAM's node not served or fenced, the shard's not
// the owner) matches it with errors.Is, and the gRPC adapter carries it to a
// forwarding replica, so nobody recognises it by its text.
var ErrNotHere = errors.New("not served here")

// NotHere returns a sentinel error with the given text that matches
// ErrNotHere. Layers declare their refusals with it, keeping their own text
// (operators grep for it) and their own identity (errors.Is(err, theirs)).
func NotHere(text string) error {
	return &notHere{text: text}
}

type notHere struct{ text string }

func (e *notHere) Error() string { return e.text }

func (e *notHere) Unwrap() error { return ErrNotHere }
