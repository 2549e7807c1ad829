//go:build tools

// Package tools pins the helm CLI (built with `make tools`).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
