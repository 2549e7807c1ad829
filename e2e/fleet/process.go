package fleet

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// proc is one child process: its command, its log file, and the goroutine
// that reaps it. It follows e2e/cluster's recipe: own process group, SIGKILL
// as parent-death signal, forked from a goroutine locked to its thread until
// the child is reaped (Pdeathsig fires when the forking *thread* exits).
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed once the child has been reaped
	waitErr error         // valid after exited is closed
	// firstLine receives the first line of stdout (buffered, never blocks).
	firstLine chan string
}

// startProc runs bin with args. stdout and stderr are appended to logPath
// (a restart keeps the earlier runs' lines); the first stdout line is also
// sent on p.firstLine.
func startProc(name, logPath, bin string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	fmt.Fprintf(logFile, "=== %s start %s: %s %q\n", time.Now().Format(time.RFC3339Nano), name, bin, args)
	p := &proc{name: name, logPath: logPath, exited: make(chan struct{}), firstLine: make(chan string, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stderr = logFile
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		_ = logFile.Close()
		return nil, err
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	copied := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately never unlocked: the thread must die only after the
		// child is gone (or with the whole test binary, taking the child).
		if err := p.cmd.Start(); err != nil {
			started <- err
			close(p.exited)
			return
		}
		started <- nil
		// Drain stdout into the log before Wait closes the pipe.
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
		fmt.Fprintf(logFile, "=== %s exit %s: %v\n", time.Now().Format(time.RFC3339Nano), name, p.waitErr)
		_ = logFile.Close()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to the child's process group.
func (p *proc) signal(sig syscall.Signal) error {
	if !p.running() {
		return fmt.Errorf("%s is not running", p.name)
	}
	return syscall.Kill(-p.pid(), sig)
}

// stop sends SIGCONT (a stopped child cannot act on SIGTERM) and SIGTERM to
// the process group, then SIGKILL after grace, and waits until the child is
// reaped.
func (p *proc) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGCONT)
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	return p.kill()
}

// kill sends SIGKILL to the process group and waits until the child is
// reaped.
func (p *proc) kill() error {
	if !p.running() {
		return nil
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.pid())
	}
}

// logTail returns the last n lines of a log file.
func logTail(path string, n int) string {
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
