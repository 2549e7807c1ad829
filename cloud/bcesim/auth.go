package bcesim

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sort"
	"strings"
)

// verifySignature checks a bce-auth-v1 Authorization header against the
// request as received (spec §1.3). It returns nil when the signature is good.
// The canonical request is rebuilt from the signed-header list the client
// chose, the decoded path re-encoded, and the decoded query with empty
// values written "k=", so query order on the wire does not matter.
func verifySignature(r *http.Request, secretFor func(ak string) (string, bool)) *APIError {
	authz := r.Header.Get("Authorization")
	parts := strings.Split(authz, "/")
	if len(parts) != 6 || parts[0] != "bce-auth-v1" || parts[1] == "" || parts[5] == "" {
		return apiErr(http.StatusBadRequest, CodeInvalidAuthHeader,
			"authorization header must be bce-auth-v1/{ak}/{ts}/{expire}/{headers}/{signature}")
	}
	sk, ok := secretFor(parts[1])
	if !ok {
		return apiErr(http.StatusForbidden, CodeInvalidAccessKeyID, "access key id is unknown")
	}
	key := hmacHex(sk, strings.Join(parts[:4], "/"))
	uri := "/" + uriEncode(strings.TrimPrefix(r.URL.Path, "/"), false)

	var qs []string
	for k, vs := range r.URL.Query() {
		if strings.EqualFold(k, "authorization") {
			continue
		}
		v := ""
		if len(vs) > 0 {
			v = vs[0]
		}
		qs = append(qs, uriEncode(k, true)+"="+uriEncode(v, true))
	}
	sort.Strings(qs)

	var hs []string
	if parts[4] != "" {
		for _, h := range strings.Split(parts[4], ";") {
			v := r.Header.Get(h)
			if strings.EqualFold(h, "host") {
				v = r.Host
			}
			hs = append(hs, uriEncode(strings.ToLower(h), true)+":"+uriEncode(strings.TrimSpace(v), true))
		}
	}
	sort.Strings(hs)
	canonical := r.Method + "\n" + uri + "\n" + strings.Join(qs, "&") + "\n" + strings.Join(hs, "\n")
	want := hmacHex(key, canonical)
	if !hmac.Equal([]byte(want), []byte(parts[5])) {
		return apiErr(http.StatusBadRequest, CodeSignatureMismatch,
			"the request signature we calculated does not match the signature you provided")
	}
	return nil
}

func hmacHex(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// uriEncode is BCE's UriEncode: unreserved characters stay, '/' stays unless
// encodeSlash, every other byte becomes %XX in upper-case hex.
func uriEncode(s string, encodeSlash bool) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			c == '-' || c == '_' || c == '.' || c == '~' || (c == '/' && !encodeSlash) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}
