//go:build tools

// Package tools pins the Kubernetes binaries of the kind node image (#23):
// kubelet, kubeadm, kubectl and the control-plane components kubeadm runs as
// static pods, built static (CGO_ENABLED=0) from the Go module proxy, since
// no image registry is reachable here. Kept apart from the kube tools module
// (the test control plane's binaries) so that `make tools` does not fetch or
// build what only the kind path needs.
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
