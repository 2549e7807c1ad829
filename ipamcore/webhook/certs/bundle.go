package certs

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
)

// Keys of the Secret's data.
const (
	// KeyCACert is the trust bundle: every CA the webhook configurations
	// trust, PEM, oldest first. It is what the caBundle carries.
	KeyCACert = "ca.crt"
	// KeyCAKey holds the private keys of the CAs that can sign, PEM, one
	// block per CA (matched to the certificates by public key).
	KeyCAKey = "ca.key"
	// KeyTLSCert is the serving certificate (PEM; the leaf first).
	KeyTLSCert = "tls.crt"
	// KeyTLSKey is the serving certificate's private key (PEM).
	KeyTLSKey = "tls.key"
)

// CA is one certificate authority of the bundle.
type CA struct {
	Cert *x509.Certificate
	// Key is nil when the Secret holds no key for this CA: it is trusted,
	// and cannot sign.
	Key crypto.Signer
}

// Serving is the serving certificate.
type Serving struct {
	Cert *x509.Certificate
	// TLS is the certificate and key, as a server presents them.
	TLS tls.Certificate
}

// Bundle is what the Secret holds, parsed.
type Bundle struct {
	// CAs are the trusted CAs, oldest (earliest NotBefore) first.
	CAs []CA
	// Serving is nil when the Secret holds no usable serving certificate.
	Serving *Serving
}

// Parse reads a Secret's data. It keeps whatever parses and reports what
// does not: a Bundle is always returned, and Plan treats the missing parts
// as missing.
func Parse(data map[string][]byte) (*Bundle, error) {
	var errs []error
	b := &Bundle{}
	certs, err := parseCerts(data[KeyCACert])
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", KeyCACert, err))
	}
	keys, err := parseKeys(data[KeyCAKey])
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", KeyCAKey, err))
	}
	for _, c := range certs {
		if !c.IsCA {
			errs = append(errs, fmt.Errorf("%s: %q is not a CA", KeyCACert, c.Subject.CommonName))
			continue
		}
		ca := CA{Cert: c}
		for _, k := range keys {
			if samePublicKey(c.PublicKey, k.Public()) {
				ca.Key = k
			}
		}
		b.CAs = append(b.CAs, ca)
	}
	sortCAs(b.CAs)
	if len(data[KeyTLSCert]) > 0 || len(data[KeyTLSKey]) > 0 {
		s, err := ParseServing(data)
		if err != nil {
			errs = append(errs, err)
		}
		b.Serving = s
	}
	return b, errors.Join(errs...)
}

// ParseServing reads only the serving certificate and its key, as every
// replica serves them (also from a Secret cert-manager writes).
func ParseServing(data map[string][]byte) (*Serving, error) {
	pair, err := tls.X509KeyPair(data[KeyTLSCert], data[KeyTLSKey])
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", KeyTLSCert, KeyTLSKey, err)
	}
	return &Serving{Cert: pair.Leaf, TLS: pair}, nil
}

// Data is the Secret's data for b: the four keys.
func (b *Bundle) Data() map[string][]byte {
	var caCert, caKey, tlsCert, tlsKey []byte
	for _, ca := range b.CAs {
		caCert = append(caCert, encodeCert(ca.Cert)...)
		if ca.Key != nil {
			caKey = append(caKey, mustEncodeKey(ca.Key)...)
		}
	}
	if b.Serving != nil {
		for _, der := range b.Serving.TLS.Certificate {
			tlsCert = append(tlsCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
		}
		if s, ok := b.Serving.TLS.PrivateKey.(crypto.Signer); ok {
			tlsKey = mustEncodeKey(s)
		}
	}
	return map[string][]byte{KeyCACert: caCert, KeyCAKey: caKey, KeyTLSCert: tlsCert, KeyTLSKey: tlsKey}
}

// CABundle is the PEM of the trusted CAs: the webhook configurations'
// caBundle.
func (b *Bundle) CABundle() []byte {
	var out []byte
	for _, ca := range b.CAs {
		out = append(out, encodeCert(ca.Cert)...)
	}
	return out
}

// BundleCerts parses a caBundle (PEM certificates); what does not parse is
// skipped.
func BundleCerts(pemData []byte) []*x509.Certificate {
	certs, _ := parseCerts(pemData)
	return certs
}

// Contains reports whether the PEM bundle holds cert.
func Contains(pemData []byte, cert *x509.Certificate) bool {
	return slices.ContainsFunc(BundleCerts(pemData), func(c *x509.Certificate) bool { return c.Equal(cert) })
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var (
		out  []*x509.Certificate
		errs []error
	)
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			if len(bytes.TrimSpace(data)) > 0 {
				errs = append(errs, errors.New("trailing data that is not PEM"))
			}
			break
		}
		if block.Type != "CERTIFICATE" {
			errs = append(errs, fmt.Errorf("unexpected PEM block %q", block.Type))
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

func parseKeys(data []byte) ([]crypto.Signer, error) {
	var (
		out  []crypto.Signer
		errs []error
	)
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		k, err := parseKey(block)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, k)
	}
	return out, errors.Join(errs...)
}

func parseKey(block *pem.Block) (crypto.Signer, error) {
	var (
		k   any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unexpected PEM block %q", block.Type)
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T cannot sign", k)
	}
	return s, nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// mustEncodeKey encodes a key this package generated or parsed: PKCS #8
// takes every such key, so a failure is a bug.
func mustEncodeKey(k crypto.Signer) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		panic(fmt.Sprintf("certs: encode a %T: %v", k, err))
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func sortCAs(cas []CA) {
	slices.SortStableFunc(cas, func(a, b CA) int { return a.Cert.NotBefore.Compare(b.Cert.NotBefore) })
}
