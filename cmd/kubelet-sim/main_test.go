package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestRun_Flags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // substring of the error; "" means ErrHelp
	}{
		{"help", []string{"--help"}, ""},
		{"no endpoint", []string{"--nodes", "0"}, "--cni-endpoint or --cni-endpoints is required"},
		{"bad level", []string{"--log-level", "loud"}, "--log-level"},
		{"bad format", []string{"--log-format", "xml"}, "--log-format"},
		{"negative nodes", []string{"--cni-endpoint", "127.0.0.1:1", "--nodes", "-1"}, "must not be negative"},
		{"retry range", []string{"--cni-endpoint", "127.0.0.1:1", "--retry-base", "2s", "--retry-max", "1s"}, "retry max"},
		{"no bce endpoint", []string{"--cni-endpoint", "127.0.0.1:1", "--kubeconfig", "/nonexistent"}, "kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(context.Background(), tc.args, &stderr)
			switch {
			case tc.want == "":
				if !errors.Is(err, pflag.ErrHelp) || !strings.Contains(stderr.String(), "--cni-endpoint") {
					t.Fatalf("want help with every flag, got %v\n%s", err, stderr.String())
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}
