//go:build tools

// Package tools pins CoreDNS for the kind node image (#23): built static from
// the Go module proxy into an image named as kubeadm expects, since no image
// registry is reachable here.
package tools

import _ "github.com/coredns/coredns"
