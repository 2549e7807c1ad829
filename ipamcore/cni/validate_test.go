package cni

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip_KeepsUTF8Valid(t *testing.T) {
	s := strings.Repeat("a", 63) + "é" + strings.Repeat("b", 10) // 'é' straddles byte 64
	got := clip(s)
	if !utf8.ValidString(got) {
		t.Fatalf("clip(%q) = %q is not valid UTF-8", s, got)
	}
	if !strings.HasSuffix(got, "…") || len(got) > 64+len("…") {
		t.Fatalf("clip(%q) = %q, want at most 64 bytes and an ellipsis", s, got)
	}
	if clip("short") != "short" {
		t.Fatal("clip changed a short string")
	}
}
