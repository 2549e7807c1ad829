//go:build tools

// Package tools pins the Kubernetes control-plane binaries that the e2e
// harness runs (built with `make tools`).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
