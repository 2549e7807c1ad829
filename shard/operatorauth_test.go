package shard

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestAuthenticator_VerifyRequest(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := func(key []byte, t time.Time) *Authenticator {
		a := NewAuthenticator(key)
		a.now = func() time.Time { return t }
		return a
	}
	a := at(key, now)
	body := []byte(`{"namespace":"default","name":"web-0","user":"alice","reason":"stuck sandbox"}`)
	h, err := a.SignRequest("POST", "/admin/allocate", body)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.VerifyRequest("POST", "/admin/allocate", body, h); err != nil {
		t.Fatalf("own signature: %v", err)
	}
	if err := at(key, now.Add(forwardSkew-time.Second)).VerifyRequest("POST", "/admin/allocate", body, h); err != nil {
		t.Errorf("within the skew: %v", err)
	}
	forged := at([]byte("another key, another cluster...."), now)
	forgedHeader, _ := forged.SignRequest("POST", "/admin/allocate", body)
	cases := map[string]error{
		"missing":      a.VerifyRequest("POST", "/admin/allocate", body, ""),
		"malformed":    a.VerifyRequest("POST", "/admin/allocate", body, "nonsense"),
		"bad time":     a.VerifyRequest("POST", "/admin/allocate", body, "x"+h),
		"forged":       a.VerifyRequest("POST", "/admin/allocate", body, forgedHeader),
		"body changed": a.VerifyRequest("POST", "/admin/allocate", []byte(strings.Replace(string(body), "web-0", "web-1", 1)), h),
		"body cut":     a.VerifyRequest("POST", "/admin/allocate", body[:len(body)-1], h),
		"other path":   a.VerifyRequest("POST", "/admin/release", body, h),
		"other method": a.VerifyRequest("PUT", "/admin/allocate", body, h),
		"stale":        at(key, now.Add(forwardSkew+time.Second)).VerifyRequest("POST", "/admin/allocate", body, h),
		"future":       at(key, now.Add(-forwardSkew-time.Second)).VerifyRequest("POST", "/admin/allocate", body, h),
		"mac only":     a.VerifyRequest("POST", "/admin/allocate", body, h[strings.Index(h, ";")+1:]),
	}
	for name, err := range cases {
		if !errors.Is(err, ErrOperatorAuth) {
			t.Errorf("%s: got %v, want ErrOperatorAuth", name, err)
		}
	}
}

func TestAuthenticator_VerifyRequest_NoKey(t *testing.T) {
	a := NewAuthenticator(nil)
	if _, err := a.SignRequest("POST", "/admin/allocate", nil); !errors.Is(err, ErrNoForwardKey) {
		t.Errorf("sign without a key: %v, want ErrNoForwardKey", err)
	}
	if err := a.VerifyRequest("POST", "/admin/allocate", nil, "1;x"); !errors.Is(err, ErrNoForwardKey) {
		t.Errorf("verify without a key: %v, want ErrNoForwardKey", err)
	}
}
