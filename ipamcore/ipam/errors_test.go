package ipam_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cce-ipam/sharded/ipamcore/ipam"
	"github.com/cce-ipam/sharded/ipamcore/podip"
)

// The refusals that send a call to another replica are podip.ErrNotHere, so
// the gRPC adapter can mark them on the wire; their text stays what it was
// (operators and older replicas read it).
func TestErrors_RefusalsAreNotHere(t *testing.T) {
	for _, tc := range []struct {
		err  error
		text string
	}{
		{ipam.ErrNodeNotServed, "node not served by this replica"},
		{ipam.ErrFenced, "fenced: this replica may no longer act for the node"},
	} {
		wrapped := fmt.Errorf("AllocateIP ns/p (abc): %w", fmt.Errorf("%w: node-1", tc.err))
		if !errors.Is(wrapped, podip.ErrNotHere) {
			t.Errorf("%q does not match podip.ErrNotHere", tc.text)
		}
		if !errors.Is(wrapped, tc.err) {
			t.Errorf("%q does not match itself once wrapped", tc.text)
		}
		if tc.err.Error() != tc.text {
			t.Errorf("text = %q, want %q", tc.err.Error(), tc.text)
		}
	}
	if errors.Is(ipam.ErrNodeNotServed, ipam.ErrFenced) || errors.Is(ipam.ErrFenced, ipam.ErrNodeNotServed) {
		t.Error("ErrNodeNotServed and ErrFenced match each other")
	}
	for _, err := range []error{ipam.ErrPoolExhausted, ipam.ErrWrongNode, ipam.ErrNotRunning} {
		if errors.Is(err, podip.ErrNotHere) {
			t.Errorf("%q matches podip.ErrNotHere; routing again cannot help it", err)
		}
	}
}
