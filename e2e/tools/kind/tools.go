//go:build tools

// Package tools pins kind (sigs.k8s.io/kind), built into bin/ for the e2e
// kind path (#23).
package tools

import _ "sigs.k8s.io/kind"
