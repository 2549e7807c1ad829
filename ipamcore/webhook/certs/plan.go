package certs

import (
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"
)

// Policy is what the certificates must be.
type Policy struct {
	// CAValidity is the lifetime of a new CA.
	CAValidity time.Duration
	// ServingValidity is the lifetime of a new serving certificate (capped by
	// its CA's).
	ServingValidity time.Duration
	// DNSNames and IPs must all be in the serving certificate.
	DNSNames []string
	IPs      []net.IP
	// OverlapWait is how long a new CA is in the bundle before it signs.
	// Zero means CAValidity/12.
	OverlapWait time.Duration
}

func (p Policy) overlapWait() time.Duration {
	if p.OverlapWait > 0 {
		return p.OverlapWait
	}
	return p.CAValidity / 12
}

// Decision is what Plan found must change; the zero value changes nothing.
type Decision struct {
	// Drop are the expired CAs to remove from the bundle.
	Drop []*x509.Certificate
	// NewRoot: no CA can sign; make a new one (the trust starts over).
	NewRoot bool
	// AddCA: the newest CA has less than a third of its life left; add its
	// successor.
	AddCA bool
	// Issue, when not empty, says why a new serving certificate is needed.
	Issue string
	// Signer signs the new serving certificate: one of the bundle's CAs, or
	// nil for the new root.
	Signer *x509.Certificate
	// MissingNames: the serving certificate lacks required names; the new
	// one keeps the names of the old one too (replicas of two versions may
	// require different names during a rolling update, and must not undo
	// each other).
	MissingNames bool
	// Wake is when to plan again if nothing else changes.
	Wake time.Time
}

// Empty reports whether d changes nothing.
func (d Decision) Empty() bool {
	return len(d.Drop) == 0 && !d.NewRoot && !d.AddCA && d.Issue == ""
}

// String describes the changes, for logs.
func (d Decision) String() string {
	var parts []string
	for _, c := range d.Drop {
		parts = append(parts, "drop expired CA "+c.SerialNumber.Text(16))
	}
	if d.NewRoot {
		parts = append(parts, "create a new CA (no CA can sign)")
	}
	if d.AddCA {
		parts = append(parts, "add a successor CA")
	}
	if d.Issue != "" {
		parts = append(parts, "issue a serving certificate: "+d.Issue)
	}
	if len(parts) == 0 {
		return "nothing to change"
	}
	return strings.Join(parts, "; ")
}

// Plan decides what must change in b at now (see the package doc).
// published reports whether every webhook configuration's caBundle carries
// a CA; it decides when a successor CA may sign.
func Plan(b *Bundle, now time.Time, p Policy, published func(*x509.Certificate) bool) Decision {
	var d Decision
	var valid []CA // can sign now, oldest first
	for _, ca := range b.CAs {
		switch {
		case !now.Before(ca.Cert.NotAfter):
			d.Drop = append(d.Drop, ca.Cert)
		case ca.Key != nil && !now.Before(ca.Cert.NotBefore):
			valid = append(valid, ca)
		}
	}
	if len(valid) == 0 {
		d.NewRoot, d.Issue = true, "no CA can sign"
		return d
	}
	wake := newWake(now)
	newest := valid[len(valid)-1].Cert
	if renew := renewAt(newest); !now.Before(renew) {
		d.AddCA = true
	} else {
		wake.at(renew)
	}
	for _, ca := range b.CAs {
		wake.at(ca.Cert.NotAfter) // to drop it
	}
	d.Signer = signer(valid, now, p, published, wake)
	d.Issue, d.MissingNames = servingNeeds(b.Serving, d.Signer, now, p, wake)
	d.Wake = wake.t
	return d
}

// signer is the newest valid CA that may sign: one that has been in the
// bundle for the overlap wait and is published, else the oldest valid one.
func signer(valid []CA, now time.Time, p Policy, published func(*x509.Certificate) bool, wake *wakeTime) *x509.Certificate {
	for i := len(valid) - 1; i > 0; i-- {
		c := valid[i].Cert
		ready := c.NotBefore.Add(p.overlapWait())
		if now.Before(ready) {
			wake.at(ready)
			continue
		}
		if published(c) {
			return c
		}
		// Not published yet: a configuration event plans again.
	}
	return valid[0].Cert
}

// servingNeeds says why s must be replaced by a certificate from signer, or
// "" when it need not; missingNames when it lacks required names.
func servingNeeds(s *Serving, signer *x509.Certificate, now time.Time, p Policy, wake *wakeTime) (string, bool) {
	switch {
	case s == nil:
		return "none in the Secret", false
	case s.Cert.CheckSignatureFrom(signer) != nil:
		return fmt.Sprintf("signed by another CA than %s", signer.SerialNumber.Text(16)), false
	case !now.Before(s.Cert.NotAfter):
		return "expired", false
	case !now.Before(renewAt(s.Cert)):
		return "less than a third of its validity left", false
	}
	if missing := missingNames(s.Cert, p); len(missing) > 0 {
		return "lacks " + strings.Join(missing, ", "), true
	}
	wake.at(renewAt(s.Cert))
	return "", false
}

func missingNames(c *x509.Certificate, p Policy) []string {
	var missing []string
	for _, n := range p.DNSNames {
		if !slices.Contains(c.DNSNames, n) {
			missing = append(missing, n)
		}
	}
	for _, ip := range p.IPs {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			missing = append(missing, ip.String())
		}
	}
	return missing
}

// renewAt is when c has a third of its lifetime left.
func renewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(life - life/3)
}

// wakeTime keeps the earliest instant after now.
type wakeTime struct {
	now, t time.Time
}

func newWake(now time.Time) *wakeTime { return &wakeTime{now: now} }

func (w *wakeTime) at(t time.Time) {
	if t.After(w.now) && (w.t.IsZero() || t.Before(w.t)) {
		w.t = t
	}
}
