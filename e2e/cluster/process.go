package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one child of the control plane: its command, its log file, and
// the goroutine that waits for it.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	exited  chan struct{} // closed once the child has been reaped
	waitErr error         // valid after exited is closed
}

// startProcess runs bin with args, output to dir/<name>.log, in a new process
// group, with SIGKILL as its parent-death signal.
//
// Pdeathsig fires when the *thread* that forked the child exits, not the
// process. Go may retire threads, so the fork happens on a goroutine locked to
// its thread, and that goroutine stays alive (and locked) until the child has
// been reaped. The thread therefore dies only with the whole test binary, and
// then the kernel takes the child with it.
func startProcess(dir, name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log for %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, log: logFile, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout = logFile
	p.cmd.Stderr = logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately never unlocked: when this goroutine returns, the
		// runtime terminates the locked thread, which is what we want only
		// after the child is gone.
		if err := p.cmd.Start(); err != nil {
			started <- err
			close(p.exited)
			return
		}
		started <- nil
		p.waitErr = p.cmd.Wait()
		_ = logFile.Close()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// pid returns the child's process ID.
func (p *process) pid() int { return p.cmd.Process.Pid }

// running reports whether the child has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the child's process group, then SIGKILL after grace,
// and waits until the child is reaped.
func (p *process) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.pid())
	}
}

// exitError describes why the child exited, with the tail of its log, for
// errors raised while waiting for it to become ready.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited early (%v); last log lines:\n%s", p.name, p.waitErr, p.logTail(30))
}

// logTail returns the last n lines of the child's log.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// ProcessAlive reports whether pid names a live process. A zombie (exited but
// not yet reaped by its new parent) counts as dead: it holds no port, no file
// and no memory.
func ProcessAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return !errors.Is(err, syscall.ESRCH)
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return true
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}
