package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// Apply makes the changes d decided for b at now and returns the new bundle;
// b is not modified. Keys are ECDSA P-256 (fast to make, and every API
// server version verifies them).
func Apply(b *Bundle, d Decision, now time.Time, p Policy) (*Bundle, error) {
	out := &Bundle{Serving: b.Serving}
	for _, ca := range b.CAs {
		if !slices.ContainsFunc(d.Drop, ca.Cert.Equal) {
			out.CAs = append(out.CAs, ca)
		}
	}
	signer := d.Signer
	if d.NewRoot || d.AddCA {
		ca, err := NewCA(now, p.CAValidity)
		if err != nil {
			return nil, err
		}
		out.CAs = append(out.CAs, ca)
		sortCAs(out.CAs)
		if d.NewRoot {
			signer = ca.Cert
		}
	}
	if d.Issue == "" {
		return out, nil
	}
	i := slices.IndexFunc(out.CAs, func(ca CA) bool { return signer != nil && ca.Cert.Equal(signer) && ca.Key != nil })
	if i < 0 {
		return nil, errors.New("certs: the signer is not a CA of the bundle with a key")
	}
	p.DNSNames, p.IPs = names(b.Serving, d.MissingNames, p)
	s, err := NewServing(out.CAs[i], now, p)
	if err != nil {
		return nil, err
	}
	out.Serving = s
	return out, nil
}

// names are the names of a new serving certificate: the required ones, and
// with keep those of the old certificate too.
func names(old *Serving, keep bool, p Policy) ([]string, []net.IP) {
	dns := slices.Clone(p.DNSNames)
	ips := slices.Clone(p.IPs)
	if keep && old != nil {
		for _, n := range old.Cert.DNSNames {
			if !slices.Contains(dns, n) {
				dns = append(dns, n)
			}
		}
		for _, ip := range old.Cert.IPAddresses {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		}
	}
	return dns, ips
}

// NewCA makes a self-signed CA valid from now (backdated) for validity.
func NewCA(now time.Time, validity time.Duration) (CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CA{}, fmt.Errorf("certs: CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return CA{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("cce-ipam-webhook-ca@%d", now.Unix())},
		NotBefore:             now.Add(-backdate(validity)),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return CA{}, fmt.Errorf("certs: sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return CA{}, err
	}
	return CA{Cert: cert, Key: key}, nil
}

// NewServing makes a serving certificate for p's names, signed by ca, valid
// from now (backdated) for p.ServingValidity but never past ca's end.
func NewServing(ca CA, now time.Time, p Policy) (*Serving, error) {
	if len(p.DNSNames) == 0 && len(p.IPs) == 0 {
		return nil, errors.New("certs: a serving certificate needs a name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: serving key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(p.ServingValidity)
	if ca.Cert.NotAfter.Before(notAfter) {
		notAfter = ca.Cert.NotAfter
	}
	cn := "cce-ipam-webhook"
	if len(p.DNSNames) > 0 {
		cn = p.DNSNames[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     p.DNSNames,
		IPAddresses:  p.IPs,
		NotBefore:    now.Add(-backdate(p.ServingValidity)),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certs: sign serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Serving{Cert: cert, TLS: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: crypto.Signer(key), Leaf: cert}}, nil
}

// backdate is how far before now a certificate starts: a twentieth of its
// lifetime, at most five minutes.
func backdate(validity time.Duration) time.Duration {
	return min(validity/20, 5*time.Minute)
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certs: serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}
