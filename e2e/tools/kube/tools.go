//go:build tools

// Package tools pins the Kubernetes binaries built from the Go module proxy:
// kube-apiserver and kube-controller-manager for the test control plane
// (`make tools`), and kubelet, kubeadm, kubectl, kube-proxy and
// kube-scheduler too for the kind node image (e2e/kind, #23). All are built
// static (CGO_ENABLED=0): the node image has no C library, and one build mode
// lets both sets share every compiled package.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
