package certs

import (
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func policy() Policy {
	return Policy{
		CAValidity:      60 * time.Second,
		ServingValidity: 20 * time.Second,
		DNSNames:        []string{"svc.ns.svc", "svc.ns.svc.cluster.local"},
		IPs:             []net.IP{net.ParseIP("127.0.0.1")},
	}
}

func always(*x509.Certificate) bool { return true }

func mustApply(t *testing.T, b *Bundle, d Decision, now time.Time, p Policy) *Bundle {
	t.Helper()
	nb, err := Apply(b, d, now, p)
	if err != nil {
		t.Fatalf("Apply(%s): %v", d, err)
	}
	// Every bundle goes through the Secret: round-trip it.
	back, err := Parse(nb.Data())
	if err != nil {
		t.Fatalf("Parse(Data()) of a bundle Apply made: %v", err)
	}
	return back
}

// verify checks that the serving certificate is trusted by roots at now,
// for every required name.
func verify(b *Bundle, roots []*x509.Certificate, now time.Time, p Policy) error {
	if b.Serving == nil {
		return fmt.Errorf("no serving certificate")
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	names := slices.Clone(p.DNSNames)
	for _, ip := range p.IPs {
		names = append(names, ip.String())
	}
	for _, n := range names {
		if _, err := b.Serving.Cert.Verify(x509.VerifyOptions{DNSName: n, Roots: pool, CurrentTime: now}); err != nil {
			return fmt.Errorf("serving %s for %s: %w", b.Serving.Cert.SerialNumber.Text(16), n, err)
		}
	}
	return nil
}

func TestPlan_EmptySecretGetsARootAndAServingCertificate(t *testing.T) {
	p := policy()
	d := Plan(&Bundle{}, t0, p, always)
	if !d.NewRoot || d.Issue == "" || d.AddCA {
		t.Fatalf("empty bundle: %+v, want a new root and a serving certificate", d)
	}
	b := mustApply(t, &Bundle{}, d, t0, p)
	if len(b.CAs) != 1 || b.CAs[0].Key == nil {
		t.Fatalf("want one CA with its key, got %d", len(b.CAs))
	}
	if err := verify(b, []*x509.Certificate{b.CAs[0].Cert}, t0, p); err != nil {
		t.Fatal(err)
	}
	if d := Plan(b, t0, p, always); !d.Empty() {
		t.Fatalf("a fresh bundle needs %s", d)
	}
	// Nothing to do until the serving certificate has a third left.
	d = Plan(b, t0, p, always)
	want := b.Serving.Cert.NotBefore.Add(2 * b.Serving.Cert.NotAfter.Sub(b.Serving.Cert.NotBefore) / 3)
	if d.Wake.Sub(want).Abs() > time.Millisecond {
		t.Fatalf("wake %s, want the serving renewal at %s", d.Wake, want)
	}
}

// The lifecycle over four CA lifetimes, planned every 250ms as replicas
// would, with the API servers trusting a caBundle only lag after the Secret
// changed (the patch and the API server's informer): the served certificate
// is trusted at every instant, the serving certificate is renewed, and every
// CA hands over to its successor.
func TestPlan_RotationNeverServesAnUntrustedCertificate(t *testing.T) {
	for _, lag := range []time.Duration{0, time.Second, 3 * time.Second} {
		t.Run("lag "+lag.String(), func(t *testing.T) {
			p := policy()
			type pending struct {
				at    time.Time
				roots []*x509.Certificate
			}
			var (
				b       = &Bundle{}
				trusted []*x509.Certificate // what the API servers trust now
				queue   []pending
				serials = map[string]bool{}
				cas     = map[string]bool{}
			)
			published := func(c *x509.Certificate) bool { return slices.ContainsFunc(trusted, c.Equal) }
			for now := t0; now.Before(t0.Add(4 * p.CAValidity)); now = now.Add(250 * time.Millisecond) {
				publish := func() {
					for len(queue) > 0 && !queue[0].at.After(now) {
						trusted, queue = queue[0].roots, queue[1:]
					}
				}
				publish()
				if d := Plan(b, now, p, published); !d.Empty() {
					b = mustApply(t, b, d, now, p)
					var roots []*x509.Certificate
					for _, ca := range b.CAs {
						roots = append(roots, ca.Cert)
					}
					queue = append(queue, pending{at: now.Add(lag), roots: roots})
					publish()
				}
				if len(b.CAs) > 2 {
					t.Fatalf("%s: %d CAs in the bundle, want at most 2", now.Sub(t0), len(b.CAs))
				}
				serials[b.Serving.Cert.SerialNumber.String()] = true
				for _, ca := range b.CAs {
					cas[ca.Cert.SerialNumber.String()] = true
				}
				if now.Before(t0.Add(lag)) {
					continue // the first caBundle is not published yet
				}
				if err := verify(b, trusted, now, p); err != nil {
					t.Fatalf("%s after the start: %v", now.Sub(t0), err)
				}
			}
			// 240s of 20s serving certificates renewed at 2/3: at least 15;
			// 60s CAs: a successor every 40s or so.
			if len(serials) < 15 || len(cas) < 5 {
				t.Fatalf("%d serving certificates and %d CAs in 4 CA lifetimes; want ≥ 15 and ≥ 5", len(serials), len(cas))
			}
		})
	}
}

// A successor CA that never reaches the configurations never signs: the old
// CA signs until it expires, and only then does the successor (now the only
// one) take over.
func TestPlan_SuccessorSignsOnlyOncePublished(t *testing.T) {
	p := policy()
	b := mustApply(t, &Bundle{}, Plan(&Bundle{}, t0, p, always), t0, p)
	first := b.CAs[0].Cert
	never := func(c *x509.Certificate) bool { return c.Equal(first) }
	for now := t0; now.Before(first.NotAfter); now = now.Add(500 * time.Millisecond) {
		if d := Plan(b, now, p, never); !d.Empty() {
			b = mustApply(t, b, d, now, p)
		}
		if b.Serving.Cert.CheckSignatureFrom(first) != nil {
			t.Fatalf("%s: the serving certificate comes from an unpublished CA", now.Sub(t0))
		}
	}
	if len(b.CAs) != 2 {
		t.Fatalf("%d CAs before the first expired, want it and its successor", len(b.CAs))
	}
	d := Plan(b, first.NotAfter, p, never)
	if len(d.Drop) != 1 || !d.Drop[0].Equal(first) || d.Issue == "" || d.Signer == nil || d.Signer.Equal(first) {
		t.Fatalf("at the first CA's end: %s (signer %v), want it dropped and the successor to sign", d, d.Signer)
	}
}

// Two replicas that require different names (a rolling update) converge on
// a certificate with both instead of replacing each other's.
func TestPlan_DifferentRequiredNamesConverge(t *testing.T) {
	a, bp := policy(), policy()
	a.DNSNames = []string{"old.ns.svc"}
	bp.DNSNames = []string{"new.ns.svc"}
	b := mustApply(t, &Bundle{}, Plan(&Bundle{}, t0, a, always), t0, a)
	writes := 0
	for i := range 6 {
		p := []Policy{a, bp}[i%2]
		if d := Plan(b, t0, p, always); !d.Empty() {
			if !d.MissingNames {
				t.Fatalf("unexpected change %s", d)
			}
			b = mustApply(t, b, d, t0, p)
			writes++
		}
	}
	if writes != 1 || !slices.Contains(b.Serving.Cert.DNSNames, "old.ns.svc") || !slices.Contains(b.Serving.Cert.DNSNames, "new.ns.svc") {
		t.Fatalf("%d writes, names %v; want one write and both names", writes, b.Serving.Cert.DNSNames)
	}
}

func TestPlan_UnusableSecretStartsANewRoot(t *testing.T) {
	p := policy()
	good := mustApply(t, &Bundle{}, Plan(&Bundle{}, t0, p, always), t0, p)
	data := good.Data()
	for name, mutate := range map[string]func(map[string][]byte){
		"garbage everywhere": func(d map[string][]byte) {
			for k := range d {
				d[k] = []byte("not pem")
			}
		},
		"CA key lost":   func(d map[string][]byte) { delete(d, KeyCAKey) },
		"serving taken": func(d map[string][]byte) { d[KeyCACert] = d[KeyTLSCert] },
	} {
		t.Run(name, func(t *testing.T) {
			broken := map[string][]byte{}
			for k, v := range data {
				broken[k] = slices.Clone(v)
			}
			mutate(broken)
			b, err := Parse(broken)
			if err == nil && name != "CA key lost" {
				t.Error("Parse accepted a broken Secret")
			}
			d := Plan(b, t0, p, always)
			if !d.NewRoot || d.Issue == "" {
				t.Fatalf("%s: %s, want a new root", name, d)
			}
			nb := mustApply(t, b, d, t0, p)
			if err := verify(nb, []*x509.Certificate{nb.CAs[len(nb.CAs)-1].Cert}, t0, p); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPlan_ExpiredServingIsReplacedAtOnce(t *testing.T) {
	p := policy()
	b := mustApply(t, &Bundle{}, Plan(&Bundle{}, t0, p, always), t0, p)
	later := b.Serving.Cert.NotAfter.Add(time.Second)
	d := Plan(b, later, p, always)
	if d.Issue == "" {
		t.Fatalf("expired serving certificate: %s", d)
	}
	nb := mustApply(t, b, d, later, p)
	if err := verify(nb, []*x509.Certificate{nb.CAs[0].Cert}, later, p); err != nil {
		t.Fatal(err)
	}
}
