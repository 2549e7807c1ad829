// Package certs is the certificate authority of the admission webhooks: what
// the shared Secret holds, and the pure decision of when to renew what.
//
// The Secret holds a trust bundle (ca.crt: every CA the webhook
// configurations must trust, oldest first), the CAs' keys (ca.key, one PEM
// block per CA that can still sign) and the serving certificate with its key
// (tls.crt, tls.key: the names cert-manager and kubernetes.io/tls Secrets
// use). Every replica serves tls.crt; the webhook configurations carry
// ca.crt as their caBundle.
//
// Plan looks at a Bundle at an instant and says what must change; Apply
// makes the keys and certificates. Plan does no I/O and reads no clock:
//
//	b, _ := certs.Parse(secret.Data)
//	d := certs.Plan(b, now, policy, published)
//	if !d.Empty() {
//		nb, err := certs.Apply(b, d, now, policy)
//		secret.Data = nb.Data() // written with the resourceVersion read: one replica wins
//	}
//	// plan again at d.Wake, or when the Secret or the configurations change
//
// The rules, for a CA lifetime L and a serving lifetime S:
//   - The serving certificate is renewed once less than a third of its own
//     lifetime is left, or when it lacks a required name, or when another CA
//     should sign it.
//   - A CA with less than a third of its lifetime left gets a successor,
//     added to the bundle next to it. The successor signs only once it has
//     been in the bundle for OverlapWait (L/12 by default) and published is
//     true for it (every webhook configuration's caBundle carries it): an API
//     server never meets a serving certificate from a CA it does not trust
//     yet. The old CA stays trusted until it expires, so certificates it
//     signed stay valid to the end of their lives.
//   - Expired CAs leave the bundle.
//   - With no CA that can sign (a new Secret, or one whose CAs are gone or
//     unreadable) a new root is made: the only case that changes trust at
//     once.
//
// A serving certificate never outlives its CA (NotAfter is capped), and
// every certificate is backdated by a twentieth of its lifetime (at most five
// minutes) for clocks that run a little behind.
package certs
