package datastore

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Callers branch on them with errors.Is; the returned errors
// wrap them with the node, ENI or address involved.
var (
	// ErrInvalidArgument marks bad input: an empty node, ENI or pod name, a
	// malformed or unspecified address, a negative capacity. The call changed
	// nothing.
	ErrInvalidArgument = errors.New("invalid argument")

	// ErrNodeNotFound is returned when the node is not in the store, either
	// because it was never added or because the shard dropped it.
	ErrNodeNotFound = errors.New("node not found")

	// ErrNodeExists is returned by AddNode for a node that is already stored.
	ErrNodeExists = errors.New("node already exists")

	// ErrENINotFound is returned when the ENI is not attached to the node in
	// the store.
	ErrENINotFound = errors.New("eni not found")

	// ErrENIExists is returned by AddENI for an ENI ID the node already has,
	// or that another stored node already has.
	ErrENIExists = errors.New("eni already exists")

	// ErrIPExists is returned when an address is already recorded: on another
	// ENI of the node, on another node, or as the primary IP of an ENI. The
	// store never holds one address twice (invariant I3).
	ErrIPExists = errors.New("ip already exists")

	// ErrUnknownIP is returned when the address is not recorded on the node.
	// A CNI DEL for an unknown IP is usually a retry and can be answered with
	// success by the caller; the store still says so rather than pretend.
	ErrUnknownIP = errors.New("unknown ip")

	// ErrIPInUse is returned when an address is assigned to a different pod
	// than the one asking (AllocateSpecific, Unhold).
	ErrIPInUse = errors.New("ip in use by another pod")

	// ErrNotAssigned is returned by Release for an address that is idle: the
	// release already happened (a repeated DEL).
	ErrNotAssigned = errors.New("ip not assigned")

	// ErrContainerMismatch is returned by Release when the address belongs to
	// a different sandbox (container ID) than the one being deleted: a late
	// DEL of an old sandbox must not free the IP of its successor.
	ErrContainerMismatch = errors.New("container id does not own the ip")

	// ErrPodHasIP is returned when a pod that already holds one address on
	// the node asks for a different specific address: a pod holds at most one
	// address per node.
	ErrPodHasIP = errors.New("pod already holds another ip on this node")

	// ErrHeld is returned for an address that is held out of the pool (a
	// restore conflict or a pending return to the cloud) and so cannot be
	// allocated or released until Unhold or RemoveIP decides its fate.
	ErrHeld = errors.New("ip is held")

	// ErrNotHeld is returned by Unhold for an address that is not held.
	ErrNotHeld = errors.New("ip is not held")

	// ErrChanged is returned by HoldInUse when the address is no longer in
	// the state the caller read it in: its decision is stale.
	ErrChanged = errors.New("ip changed since it was read")

	// ErrNoIdleIP is returned by Allocate when the candidate ENIs have no idle
	// address at all. The warm pool must grow; a *CoolingError also matches
	// it when idle addresses exist but are all cooling.
	ErrNoIdleIP = errors.New("no idle ip")

	// ErrIPCooling is matched by a *CoolingError: idle addresses exist but
	// every one was released less than the cooldown ago.
	ErrIPCooling = errors.New("all idle ips are cooling down")
)

// CoolingError is returned by Allocate when every idle candidate address is
// still cooling. ReadyAt says when the first one becomes usable, so the
// caller can wait precisely instead of polling. It matches both ErrIPCooling
// and ErrNoIdleIP.
type CoolingError struct {
	Node    string
	Cooling int       // idle candidate addresses that are cooling
	ReadyAt time.Time // earliest time one of them may be handed out
}

func (e *CoolingError) Error() string {
	return fmt.Sprintf("node %s: %d idle ip(s) all cooling down until %s",
		e.Node, e.Cooling, e.ReadyAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrIPCooling) and errors.Is(err, ErrNoIdleIP) true.
func (e *CoolingError) Is(target error) bool {
	return target == ErrIPCooling || target == ErrNoIdleIP
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
