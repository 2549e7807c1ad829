package supervisor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProcess_FirstLineAndLog(t *testing.T) {
	log := filepath.Join(t.TempDir(), "echo.log")
	p, err := Start(Spec{
		Name:    "echo",
		Bin:     "/bin/sh",
		Args:    []string{"-c", "echo addr; echo err >&2; echo more"},
		LogPath: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-p.FirstLine():
		if line != "addr\n" {
			t.Fatalf("first line %q, want %q", line, "addr\n")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no first line")
	}
	<-p.Exited()
	if p.WaitErr() != nil || p.Running() {
		t.Fatalf("exit %v, running %v; want a clean exit", p.WaitErr(), p.Running())
	}
	tail := p.LogTail(10)
	for _, want := range []string{"=== ", "start echo", "addr", "err", "more", "exit echo"} {
		if !strings.Contains(tail, want) {
			t.Errorf("log lacks %q:\n%s", want, tail)
		}
	}
	if got := LogTail(log, 1); !strings.Contains(got, "exit echo") || strings.Contains(got, "more") {
		t.Errorf("LogTail(1) = %q, want only the exit marker", got)
	}
}

// A child that ignores SIGTERM is killed after the grace, with everything it
// forked (its process group).
func TestProcess_StopKillsGroupAfterGrace(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild.pid")
	p := StartT(t, Spec{Name: "stubborn", Bin: "/bin/sh",
		Args: []string{"-c", "trap '' TERM; sleep 300 & echo $! > " + pidFile + "; echo ready; wait"}})
	<-p.FirstLine()
	grandchild := readPID(t, pidFile)
	start := time.Now()
	if err := p.Stop(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("stopped after %v, before the grace: SIGTERM was not ignored?", d)
	}
	if p.Running() {
		t.Fatal("still running after Stop")
	}
	deadline := time.Now().Add(5 * time.Second)
	for Alive(grandchild) {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d survived its group's SIGKILL", grandchild)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestProcess_SignalStoppedChild(t *testing.T) {
	p := StartT(t, Spec{
		Name: "sleep",
		Bin:  "/bin/sleep",
		Args: []string{"300"},
	})
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Stop sends SIGCONT first, so a stopped child still exits on SIGTERM,
	// well before the grace.
	start := time.Now()
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("stop took %v: the stopped child did not act on SIGTERM", d)
	}
	if err := p.Signal(syscall.SIGTERM); err == nil {
		t.Error("Signal to an exited child succeeded")
	}
	if !strings.Contains(p.ExitError().Error(), "sleep exited early") {
		t.Errorf("ExitError = %v", p.ExitError())
	}
}

func TestStartT_KillsAtCleanup(t *testing.T) {
	var p *Process
	t.Run("inner", func(t *testing.T) {
		p = StartT(t, Spec{
			Name: "sleep",
			Bin:  "/bin/sleep",
			Args: []string{"300"},
		})
	})
	if p.Running() || Alive(p.PID()) {
		t.Fatal("child still running after its test ended")
	}
}

func TestStart_Errors(t *testing.T) {
	if _, err := Start(Spec{
		Name: "x",
		Bin:  "/bin/true",
	}); err == nil {
		t.Error("Start without a log path succeeded")
	}
	log := filepath.Join(t.TempDir(), "missing.log")
	if _, err := Start(Spec{
		Name:    "x",
		Bin:     "/nonexistent/binary",
		LogPath: log,
	}); err == nil {
		t.Error("Start of a missing binary succeeded")
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
				return pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
