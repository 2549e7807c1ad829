package podip_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cce-ipam/sharded/ipamcore/podip"
)

func TestNotHere_KeepsTextAndIdentity(t *testing.T) {
	a := podip.NotHere("node not served by this replica")
	b := podip.NotHere("node not served by this replica")
	wrapped := fmt.Errorf("%w: node-1", a)
	if got := a.Error(); got != "node not served by this replica" {
		t.Errorf("text = %q, want the text given", got)
	}
	if !errors.Is(wrapped, podip.ErrNotHere) {
		t.Error("a wrapped NotHere error does not match ErrNotHere")
	}
	if !errors.Is(wrapped, a) {
		t.Error("a wrapped NotHere error does not match itself")
	}
	if errors.Is(wrapped, b) {
		t.Error("two NotHere errors with the same text match each other; each must be its own sentinel")
	}
	if errors.Is(errors.New("node not served by this replica"), podip.ErrNotHere) {
		t.Error("a plain error with the same text matches ErrNotHere")
	}
}

func TestPodRef_String_ShortensContainerID(t *testing.T) {
	ref := podip.PodRef{
		Namespace:   "ns",
		Name:        "web-0",
		ContainerID: "0123456789abcdef0123",
	}
	if got, want := ref.String(), "ns/web-0 (0123456789ab)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	ref.ContainerID = "abc"
	if got, want := ref.String(), "ns/web-0 (abc)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
