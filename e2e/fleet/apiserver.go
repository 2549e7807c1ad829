package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cce-ipam/sharded/e2e/supervisor"
)

// RestartAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 5s: its
// graceful shutdown waits for watches much longer), leaves it down for
// downFor, starts it again with the same command line (same port,
// certificates and etcd, so every client reconnects) and waits until it
// serves. Every watch breaks and every client sees connection errors in
// between. It works only when the fleet started the control plane itself
// (Options without Config): a shared control plane must outlive the fleet.
func (f *Fleet) RestartAPIServer(ctx context.Context, downFor time.Duration) error {
	if f.Cluster == nil {
		return errors.New("fleet: RestartAPIServer needs a control plane the fleet started (Options.Config empty)")
	}
	f.mu.Lock()
	old := f.apiserver
	f.mu.Unlock()
	var pid int
	if old != nil {
		pid = old.PID()
	} else {
		pid = f.Cluster.PIDs()["kube-apiserver"]
	}
	if pid == 0 || !supervisor.Alive(pid) {
		return errors.New("fleet: kube-apiserver is not running")
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return fmt.Errorf("fleet: read kube-apiserver command line: %w", err)
	}
	argv := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	if len(argv) == 0 {
		return errors.New("fleet: empty kube-apiserver command line")
	}
	bin := string(argv[0])
	args := make([]string, 0, len(argv)-1)
	for _, a := range argv[1:] {
		args = append(args, string(a))
	}

	if old != nil {
		if err := old.Stop(5 * time.Second); err != nil {
			return err
		}
	} else {
		// e2e/cluster started it in its own process group and reaps it.
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		deadline := time.Now().Add(5 * time.Second)
		for supervisor.Alive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	select {
	case <-time.After(downFor):
	case <-ctx.Done():
	}
	p, err := supervisor.Start(supervisor.Spec{
		Name:    "kube-apiserver",
		Bin:     bin,
		Args:    args,
		LogPath: filepath.Join(f.Dir, "kube-apiserver-restarted.log"),
	})
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.apiserver = p
	f.mu.Unlock()
	cs, err := kubernetes.NewForConfig(f.Config)
	if err != nil {
		return err
	}
	for {
		if _, err := cs.Discovery().ServerVersion(); err == nil {
			if _, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err == nil {
				return nil
			}
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("fleet: restarted kube-apiserver: %w", p.ExitError())
		case <-ctx.Done():
			return fmt.Errorf("fleet: restarted kube-apiserver not serving: %w\n%s", ctx.Err(), p.LogTail(30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
