package supervisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Spec says what to run.
type Spec struct {
	// Name names the child in errors and log markers.
	Name string
	// Bin and Args are the command.
	Bin  string
	Args []string
	// Dir is the working directory; empty: the parent's.
	Dir string
	// Env is the exact environment; nil: the parent's.
	Env []string
	// LogPath receives stdout and stderr (appended). StartT defaults it to
	// <t.TempDir()>/<Name>.log; Start requires it.
	LogPath string
}

// Process is one running (or exited) child.
type Process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once the child has been reaped
	waitErr error         // valid after exited is closed
	// firstLine receives the first line of stdout (buffered, never blocks).
	firstLine chan string
}

// Start runs the child described by spec and returns once it has been
// forked; it does not wait for the child to be ready.
func Start(spec Spec) (*Process, error) {
	if spec.LogPath == "" {
		return nil, fmt.Errorf("start %s: no log path", spec.Name)
	}
	logFile, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", spec.Name, err)
	}
	fmt.Fprintf(logFile, "=== %s start %s: %s %q\n", time.Now().Format(time.RFC3339Nano), spec.Name, spec.Bin, spec.Args)
	p := &Process{
		name:      spec.Name,
		logPath:   spec.LogPath,
		exited:    make(chan struct{}),
		firstLine: make(chan string, 1),
	}
	p.cmd = exec.Command(spec.Bin, spec.Args...)
	p.cmd.Dir = spec.Dir
	p.cmd.Env = spec.Env
	p.cmd.Stderr = logFile
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}

	started := make(chan error, 1)
	go p.run(logFile, stdout, started)
	if err := <-started; err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	return p, nil
}

// run forks the child on a thread locked for the child's lifetime (see the
// package doc), copies its stdout into the log and reaps it.
func (p *Process) run(logFile *os.File, stdout io.Reader, started chan<- error) {
	runtime.LockOSThread()
	// Deliberately never unlocked: the thread must die only after the child
	// is gone (or with the whole parent, taking the child).
	if err := p.cmd.Start(); err != nil {
		started <- err
		close(p.exited)
		return
	}
	started <- nil
	// Drain stdout into the log before Wait closes the pipe.
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		r := bufio.NewReader(stdout)
		line, err := r.ReadString('\n')
		if err == nil || line != "" {
			p.firstLine <- line
			_, _ = logFile.WriteString(line)
		}
		_, _ = io.Copy(logFile, r)
	}()
	<-copied
	p.waitErr = p.cmd.Wait()
	fmt.Fprintf(logFile, "=== %s exit %s: %v\n", time.Now().Format(time.RFC3339Nano), p.name, p.waitErr)
	_ = logFile.Close()
	close(p.exited)
}

// Name returns Spec.Name.
func (p *Process) Name() string { return p.name }

// PID returns the child's process ID (also its process group's).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// LogPath returns the file that holds the child's output.
func (p *Process) LogPath() string { return p.logPath }

// FirstLine delivers the first line of the child's stdout, with its newline,
// if it prints one.
func (p *Process) FirstLine() <-chan string { return p.firstLine }

// Exited is closed once the child has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// WaitErr returns how the child exited (nil for a clean exit); it is valid
// only after Exited is closed.
func (p *Process) WaitErr() error { return p.waitErr }

// Running reports whether the child has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the child's process group.
func (p *Process) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return fmt.Errorf("%s is not running", p.name)
	}
	if err := syscall.Kill(-p.PID(), sig); err != nil {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	return nil
}

// Stop sends SIGCONT (a stopped child cannot act on SIGTERM) and SIGTERM to
// the process group, then SIGKILL after grace, and waits until the child is
// reaped.
func (p *Process) Stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGCONT)
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	return p.Kill()
}

// Kill sends SIGKILL to the process group and waits until the child is
// reaped.
func (p *Process) Kill() error {
	if !p.Running() {
		return nil
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.PID())
	}
}

// ExitError describes why the child exited, with the tail of its log, for
// errors raised while waiting for it to become ready.
func (p *Process) ExitError() error {
	if p.waitErr == nil {
		return fmt.Errorf("%s exited early (status 0); last log lines:\n%s", p.name, p.LogTail(30))
	}
	return fmt.Errorf("%s exited early (%w); last log lines:\n%s", p.name, p.waitErr, p.LogTail(30))
}

// LogTail returns the last n lines of the child's log.
func (p *Process) LogTail(n int) string { return LogTail(p.logPath, n) }

// LogTail returns the last n lines of a log file.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Alive reports whether pid names a live process. A zombie (exited but not
// yet reaped by its parent) counts as dead: it holds no port, no file and no
// memory.
func Alive(pid int) bool {
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
