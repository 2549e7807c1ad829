//go:build tools

// Package tools pins the etcd server binary (built with `make tools`).
package tools

import _ "go.etcd.io/etcd/server/v3"
