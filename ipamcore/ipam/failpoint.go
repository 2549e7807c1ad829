package ipam

import (
	"os"
	"strings"
	"sync"
	"time"
)

// Test-only failpoints, without a build tag: the process-level tests run the
// same binary as production. A failpoint is armed by the environment,
//
//	CCE_IPAM_TEST_FAILPOINT=<name>=<path>[,<name>=<path>...]
//
// and is inert unless that variable is set. When the code reaches failpoint
// <name> while the file <path> exists, it writes <path>.hit (the detail, e.g.
// the node and pod) and blocks until <path> is removed.
//
// before-wep-create sits in commit after the fence check and before the wep
// Create. When it releases, the Create goes ahead without the lease deadline
// as its context deadline: it models a write already on the wire when the
// process froze (a stopped VM, a delayed TCP retransmission), which the
// client-side deadline cannot recall. Only the API server can refuse it.
const envFailpoint = "CCE_IPAM_TEST_FAILPOINT"

const fpBeforeWEPCreate = "before-wep-create"

var failpoints = sync.OnceValue(func() map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(os.Getenv(envFailpoint), ",") {
		if name, path, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && name != "" && path != "" {
			out[name] = path
		}
	}
	return out
})

// failpoint blocks at the named failpoint while it is armed (at most
// failpointMax), and reports whether it did. detail is only called when the
// failpoint is armed: the allocation path pays nothing otherwise.
func failpoint(name string, detail func() string) bool {
	path, ok := failpoints()[name]
	if !ok {
		return false
	}
	if _, err := os.Stat(path); err != nil {
		return false
	}
	_ = os.WriteFile(path+".hit", []byte(detail()+"\n"), 0o644)
	for start := time.Now(); time.Since(start) < failpointMax; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(path); err != nil {
			break
		}
	}
	return true
}

const failpointMax = 5 * time.Minute
