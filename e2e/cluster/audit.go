package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// auditPolicy records the requests of ServiceAccounts once each (when the
// response is complete; a watch when it starts), at level Metadata, and
// nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
`

func (c *Cluster) auditArgs() ([]string, error) {
	policy := filepath.Join(c.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + filepath.Join(c.Dir, "audit.log"),
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
	}, nil
}

// AuditEvent is one recorded request (Options.AuditServiceAccounts).
type AuditEvent struct {
	User        string
	Stage       string
	Verb        string // get, list, watch, create, update, patch, delete, ...
	Group       string // "" for the core group
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	Code        int // the response code
	// Decision is the authorizer's: "allow" or "forbid" (an admission
	// refusal is also code 403, with decision "allow").
	Decision string
}

// AuditEvents reads the requests recorded so far.
func (c *Cluster) AuditEvents() ([]AuditEvent, error) {
	f, err := os.Open(filepath.Join(c.Dir, "audit.log"))
	if err != nil {
		return nil, fmt.Errorf("audit log (Options.AuditServiceAccounts): %w", err)
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var e struct {
			Stage string `json:"stage"`
			Verb  string `json:"verb"`
			User  struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef *struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
				Namespace   string `json:"namespace"`
				Name        string `json:"name"`
				APIGroup    string `json:"apiGroup"`
			} `json:"objectRef"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			Annotations map[string]string `json:"annotations"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		ev := AuditEvent{User: e.User.Username, Stage: e.Stage, Verb: e.Verb,
			Decision: e.Annotations["authorization.k8s.io/decision"]}
		if r := e.ObjectRef; r != nil {
			ev.Group, ev.Resource, ev.Subresource, ev.Namespace, ev.Name = r.APIGroup, r.Resource, r.Subresource, r.Namespace, r.Name
		}
		if e.ResponseStatus != nil {
			ev.Code = e.ResponseStatus.Code
		}
		out = append(out, ev)
	}
	return out, sc.Err()
}
