package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPause_ExitsOnTERMAndVersion runs the built command: it must wait until
// signalled and then exit 0 (the container runtime's stop), and answer
// -version without waiting.
func TestPause_ExitsOnTERMAndVersion(t *testing.T) {
	bin := t.TempDir() + "/pause"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	out, err := exec.Command(bin, "-version").Output()
	if err != nil || !strings.HasPrefix(string(out), "cce-ipam-pause") {
		t.Fatalf("-version: %q, %v", out, err)
	}
	if err := exec.Command(bin, "nonsense").Run(); err == nil {
		t.Fatal("an unknown argument was accepted")
	}
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("pause exited on its own: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	// The signal handler may not be installed yet right after start: retry
	// the TERM until it exits, as a runtime's stop would wait.
	deadline := time.After(10 * time.Second)
	for {
		_ = cmd.Process.Signal(os.Signal(syscall.SIGTERM))
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("exit after SIGTERM: %v, want 0", err)
			}
			return
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("pause did not exit within 10s of SIGTERM")
		}
	}
}
