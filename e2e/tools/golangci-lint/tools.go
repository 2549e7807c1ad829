//go:build tools

// Package tools pins golangci-lint (built with `make tools`, run by `make lint`).
package tools

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
