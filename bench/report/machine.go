package report

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Env describes where and with what the benchmark ran.
type Env struct {
	CPUModel  string
	Cores     int
	MemTotal  string // from /proc/meminfo
	Kernel    string
	Go        string
	Kube      string // kube-apiserver --version
	Etcd      string // etcd --version, first line
	Commit    string // git rev-parse HEAD, "+dirty" when the tree has changes
	GitStatus string // short status of the tree, when dirty
}

// Machine reads /proc, the binaries in binDir and git (best effort: a
// missing piece is left empty).
func Machine(binDir string) Env {
	e := Env{
		Cores: runtime.NumCPU(),
		Go:    runtime.Version(),
	}
	e.CPUModel = procField("/proc/cpuinfo", "model name")
	e.MemTotal = procField("/proc/meminfo", "MemTotal")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Kernel = strings.TrimSpace(string(b))
	}
	e.Kube = firstLine(filepath.Join(binDir, "kube-apiserver"), "--version")
	e.Etcd = firstLine(filepath.Join(binDir, "etcd"), "--version")
	e.Commit = firstLine("git", "rev-parse", "--short=12", "HEAD")
	if st := run("git", "status", "--porcelain", "--untracked-files=no"); strings.TrimSpace(st) != "" {
		e.Commit += "+dirty"
		e.GitStatus = strings.Join(strings.Fields(strings.ReplaceAll(st, "\n", ", ")), " ")
	}
	return e
}

func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func run(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		return ""
	}
	return string(out)
}

func firstLine(bin string, args ...string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(run(bin, args...)), "\n")
	return l
}
