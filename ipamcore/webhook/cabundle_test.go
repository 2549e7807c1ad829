package webhook

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cce-ipam/sharded/ipamcore/webhook/certs"
)

func TestCABundleOps(t *testing.T) {
	now := time.Now()
	old, err := certs.NewCA(now.Add(-time.Hour), 10*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := certs.NewCA(now, 10*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mine := &certs.Bundle{CAs: []certs.CA{old}}
	want := mine.CABundle()
	both := (&certs.Bundle{CAs: []certs.CA{old, newer}}).CABundle()

	if ops := caBundleOps([]hook{{"a", want}, {"b", want}}, mine, want); ops != nil {
		t.Errorf("equal caBundles patched: %v", ops)
	}
	ops := caBundleOps([]hook{{"a", want}, {"b", nil}}, mine, want)
	data, _ := json.Marshal(ops)
	if len(ops) != 2 || ops[0].Op != "test" || ops[0].Path != "/webhooks/1/name" || ops[0].Value != "b" ||
		ops[1].Path != "/webhooks/1/clientConfig/caBundle" || !strings.Contains(string(data), `"op":"add"`) {
		t.Errorf("patch for an empty caBundle: %s", data)
	}
	// A configuration that already trusts a newer CA than this replica's
	// Secret: the replica's view is stale, it leaves the configuration.
	if ops := caBundleOps([]hook{{"a", both}}, mine, want); ops != nil {
		t.Errorf("a stale replica patched away a newer CA: %v", ops)
	}
}
