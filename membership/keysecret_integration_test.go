//go:build integration

package membership

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Replicas starting together agree on one pair of keys: the first create
// wins, the others read the winner's Secret; a restart reads the same keys.
func TestEnsureKeySecret_ReplicasAgree(t *testing.T) {
	ns := cp.Namespace(t)
	secrets := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Secrets(ns)
	const replicas = 5
	got := make([]SharedKeys, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { got[i], errs[i] = EnsureKeySecret(t.Context(), secrets, "cce-ipam-keys") })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, k := range got {
		if len(k.Gossip) != 32 || len(k.Forward) != 32 || bytes.Equal(k.Gossip, k.Forward) {
			t.Fatalf("replica %d: gossip %d bytes, forward %d bytes, equal %v", i, len(k.Gossip), len(k.Forward),
				bytes.Equal(k.Gossip, k.Forward))
		}
		if !bytes.Equal(k.Gossip, got[0].Gossip) || !bytes.Equal(k.Forward, got[0].Forward) {
			t.Fatalf("replica %d read other keys than replica 0", i)
		}
	}
	again, err := EnsureKeySecret(t.Context(), secrets, "cce-ipam-keys")
	if err != nil || !bytes.Equal(again.Gossip, got[0].Gossip) || !bytes.Equal(again.Forward, got[0].Forward) {
		t.Fatalf("a restarted replica: %v, or other keys", err)
	}
}

// A Secret made by hand with only the gossip key (copied from an older
// install to keep the ring whole) keeps it and gets a forward key; a
// malformed key is an error, not replaced.
func TestEnsureKeySecret_CompletesButNeverReplaces(t *testing.T) {
	ns := cp.Namespace(t)
	secrets := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Secrets(ns)
	old := []byte("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=") // base64 of bytes 0..31
	if _, err := secrets.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "copied"},
		Data: map[string][]byte{KeySecretGossip: old}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k, err := EnsureKeySecret(t.Context(), secrets, "copied")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ParseGossipKey(old)
	if !bytes.Equal(k.Gossip, want) || len(k.Forward) != 32 {
		t.Fatalf("gossip key %x (want %x), forward %d bytes", k.Gossip, want, len(k.Forward))
	}
	s, err := secrets.Get(t.Context(), "copied", metav1.GetOptions{})
	if err != nil || !bytes.Equal(s.Data[KeySecretGossip], old) || s.Data[KeySecretForward] == nil {
		t.Fatalf("the stored Secret: %v, %v", s.Data, err)
	}

	if _, err := secrets.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "broken"},
		Data: map[string][]byte{KeySecretGossip: []byte("c2hvcnQ="), KeySecretForward: old}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureKeySecret(t.Context(), secrets, "broken"); !errors.Is(err, ErrBadGossipKey) {
		t.Fatalf("a malformed gossip key: %v, want ErrBadGossipKey", err)
	}
	s, err = secrets.Get(t.Context(), "broken", metav1.GetOptions{})
	if err != nil || string(s.Data[KeySecretGossip]) != "c2hvcnQ=" {
		t.Fatalf("the malformed key was replaced: %v, %v", s.Data, err)
	}
}
