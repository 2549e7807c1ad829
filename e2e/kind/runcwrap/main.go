// Command runcwrap is an OCI runtime that removes from every container
// process the capabilities this machine cannot grant, and what needs them,
// and then runs the real runc with the same arguments.
//
// Why: kind runs every node as `docker run --privileged`, and privileged asks
// for every capability. On a machine whose capability bounding set lacks one
// (CAP_SYS_RESOURCE on some CI sandboxes), runc then fails with "unable to
// apply caps: operation not permitted". Registered with
// `dockerd --add-runtime kind-runc=/path/runcwrap --default-runtime kind-runc`,
// it edits the capability lists of the bundle's config.json on create/run and
// of the --process file on exec. Without CAP_SYS_RESOURCE a process also
// cannot lower its oom_score_adj below its parent's, and runc's init dies
// trying ("can't get final child's PID from pipe: EOF": every pod sandbox
// asks for -998), so an oomScoreAdj below runcwrap's own is raised to it.
// Nothing else is changed. e2e/kind/dockerd.sh registers it only when a
// probe shows privileged containers failing.
//
// Environment: RUNCWRAP_RUNC (the real runc, default "runc" on PATH) and
// RUNCWRAP_DROP (comma-separated capability names; default: every capability
// missing from runcwrap's own bounding set, so the same binary serves the
// host's dockerd and the kind node's containerd, whose bounding set is the
// node container's).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	real := os.Getenv("RUNCWRAP_RUNC")
	if real == "" {
		real = "runc"
	}
	path, err := exec.LookPath(real)
	if err != nil {
		fail(fmt.Errorf("runcwrap: real runc %q: %w", real, err))
	}
	var drop []string
	if v := os.Getenv("RUNCWRAP_DROP"); v != "" {
		drop = strings.Split(v, ",")
	} else {
		status, err := os.ReadFile("/proc/self/status")
		if err != nil {
			fail(fmt.Errorf("runcwrap: %w", err))
		}
		if drop, err = missingCaps(string(status)); err != nil {
			fail(fmt.Errorf("runcwrap: /proc/self/status: %w", err))
		}
	}
	args := os.Args[1:]
	var minOOM *int
	if slices.Contains(drop, "CAP_SYS_RESOURCE") {
		if b, err := os.ReadFile("/proc/self/oom_score_adj"); err == nil {
			if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				minOOM = &v
			}
		}
	}
	if file, isProcess := target(args); file != "" {
		if err := edit(file, isProcess, drop, minOOM); err != nil {
			fail(fmt.Errorf("runcwrap: %s: %w", file, err))
		}
	}
	// exec, not a child: runc's exit status, signals and stdio stay the
	// caller's, as if the real runc had been called.
	if err := syscall.Exec(path, append([]string{path}, args...), os.Environ()); err != nil {
		fail(fmt.Errorf("runcwrap: exec %s: %w", path, err))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// target finds the file whose capabilities the command will apply: the
// bundle's config.json for create and run, the --process file for exec.
// Global flags come before the command; its own flags after it.
func target(args []string) (file string, isProcess bool) {
	cmd := -1
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			cmd = i
			break
		}
		if takesValue(a) {
			i++
		}
	}
	if cmd < 0 {
		return "", false
	}
	rest := args[cmd+1:]
	switch args[cmd] {
	case "create", "run":
		bundle := flagValue(rest, "bundle", "b")
		if bundle == "" {
			bundle = "."
		}
		return filepath.Join(bundle, "config.json"), false
	case "exec":
		if p := flagValue(rest, "process", "p"); p != "" {
			return p, true
		}
	}
	return "", false
}

// takesValue tells the global flags of runc that take a separate value.
func takesValue(flag string) bool {
	if strings.Contains(flag, "=") {
		return false
	}
	switch strings.TrimLeft(flag, "-") {
	case "log", "log-format", "root", "criu", "rootless":
		return true
	}
	return false
}

// flagValue returns the value of --name/-short in "--name v", "--name=v",
// "-short v" form.
func flagValue(args []string, name, short string) string {
	for i, a := range args {
		for _, n := range []string{"--" + name, "-" + name, "-" + short} {
			if a == n && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, n+"="); ok {
				return v
			}
		}
	}
	return ""
}

// edit rewrites file without the capabilities in drop and with an
// oomScoreAdj of at least minOOM (nil: left alone), keeping every other
// field as it was (unknown fields included: the JSON is edited as a generic
// document, not through a struct that would lose them).
func edit(file string, isProcess bool, drop []string, minOOM *int) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return err
	}
	proc := doc
	if !isProcess {
		p, ok := doc["process"].(map[string]any)
		if !ok {
			return nil
		}
		proc = p
	}
	changed := false
	if adj, ok := proc["oomScoreAdj"].(float64); ok && minOOM != nil && adj < float64(*minOOM) {
		proc["oomScoreAdj"] = *minOOM
		changed = true
	}
	caps, _ := proc["capabilities"].(map[string]any)
	for set, v := range caps {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := list[:0:0]
		for _, c := range list {
			if s, ok := c.(string); ok && slices.Contains(drop, s) {
				changed = true
				continue
			}
			kept = append(kept, c)
		}
		caps[set] = kept
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	info, err := os.Stat(file)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, info.Mode().Perm())
}

// capNames are the capabilities by bit number (linux/capability.h).
var capNames = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
	"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
	"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE"}

// missingCaps names the known capabilities whose bit is clear in the
// CapBnd line of a /proc/PID/status text.
func missingCaps(status string) ([]string, error) {
	for _, line := range strings.Split(status, "\n") {
		v, ok := strings.CutPrefix(line, "CapBnd:")
		if !ok {
			continue
		}
		bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("CapBnd %q: %w", strings.TrimSpace(v), err)
		}
		var out []string
		for i, name := range capNames {
			if bnd&(1<<i) == 0 {
				out = append(out, name)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("no CapBnd line")
}
