// Command pause is the sandbox ("infra") container of the kind node image:
// it holds a pod's namespaces open and does nothing else. The node's
// containerd runs it for every pod under the name kubeadm expects
// (registry.k8s.io/pause:<kubeadm's PauseVersion>), built here because no
// registry is reachable (#23).
//
// As PID 1 of the pod's PID namespace (when the pod shares one) it reaps
// orphaned children, and it exits 0 on SIGINT or SIGTERM. `pause -version`
// prints its version and exits: the harness's probe of a privileged container.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "cce-ipam-pause 1"

func main() {
	if len(os.Args) > 1 {
		if os.Args[1] == "-version" || os.Args[1] == "--version" {
			fmt.Println(version)
			return
		}
		fmt.Fprintf(os.Stderr, "usage: pause [-version]\n")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
