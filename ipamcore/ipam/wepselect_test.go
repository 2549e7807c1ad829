package ipam

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestWepSelector_FallbackAndRetry(t *testing.T) {
	var s wepSelector
	t0 := time.Unix(1_700_000_000, 0)
	if !s.useField(t0) || s.unsupported(t0) {
		t.Fatal("a new selector must try the field selector")
	}
	if !s.refused(t0) {
		t.Error("the first refusal is news")
	}
	if s.refused(t0.Add(time.Second)) {
		t.Error("a second refusal is not news")
	}
	at := t0.Add(time.Second)
	if s.useField(at.Add(wepSelectorRetry-time.Nanosecond)) || !s.unsupported(at) {
		t.Error("within wepSelectorRetry of a refusal the field selector must not be tried")
	}
	if !s.useField(at.Add(wepSelectorRetry)) {
		t.Error("after wepSelectorRetry the field selector must be tried again")
	}
	if !s.worked() || s.worked() {
		t.Error("worked reports a refusal before it once")
	}
	if !s.useField(at) {
		t.Error("after it worked the field selector must be used")
	}
}

func TestIsFieldSelectorUnsupported(t *testing.T) {
	gr := schema.GroupResource{Group: "cce.io", Resource: "workloadendpoints"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewBadRequest("field label not supported: spec.node"), true},
		{apierrors.NewBadRequest(`"spec.node" is not a known field selector: only "metadata.name", "metadata.namespace"`), true},
		{apierrors.NewBadRequest("invalid selector"), false},
		{apierrors.NewNotFound(gr, ""), false},
		{errors.New("field label not supported: spec.node"), false}, // not the API server's answer
		{nil, false},
	} {
		if got := IsFieldSelectorUnsupported(tc.err); got != tc.want {
			t.Errorf("IsFieldSelectorUnsupported(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
