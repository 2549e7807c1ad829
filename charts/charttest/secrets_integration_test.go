//go:build integration

package charttest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The Role grants create on Secrets (the replicas create their key and
// certificate Secrets; create cannot be limited by name). The chart's
// secret policy keeps the replicas' ServiceAccount to those two names and to
// the types they write. As that user, on the local control plane: with the
// Role alone a service-account-token Secret under the key Secret's name can
// be created (the token controller would fill it with another account's
// token, which the Role lets the replicas read); with the policy it is
// refused, as is a Secret of another name, while the replicas' own Secrets
// of their own types still work.
func TestChart_SecretCreatesRestricted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns, objs, sa := asChartServiceAccount(t, ctx, "secrets")
	admin := kubernetes.NewForConfigOrDie(cp.Config)
	secrets := sa.CoreV1().Secrets(ns)
	const keys, certs = "secrets-cce-ipam-keys", "secrets-cce-ipam-webhook-certs"
	create := func(name string, typ corev1.SecretType, data map[string][]byte) error {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: typ, Data: data}
		if typ == corev1.SecretTypeServiceAccountToken {
			s.Annotations = map[string]string{corev1.ServiceAccountNameKey: "default"}
		}
		_, err := secrets.Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	if err := create(keys, corev1.SecretTypeServiceAccountToken, nil); err != nil {
		t.Fatalf("with the Role alone, creating a service-account-token Secret: %v (this test assumes the Role allows it)", err)
	}
	if err := admin.CoreV1().Secrets(ns).Delete(ctx, keys, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	policy := find(objs, "ValidatingAdmissionPolicy", "secrets-cce-ipam-secret-creates")
	binding := find(objs, "ValidatingAdmissionPolicyBinding", "secrets-cce-ipam-secret-creates")
	if len(policy) != 1 || len(binding) != 1 {
		t.Fatal("the chart renders no secret policy and binding")
	}
	apply(t, ctx, policy[0], binding[0])
	// The policy takes effect once the API server has loaded it.
	eventually(t, ctx, 200*time.Millisecond, "the secret policy refuses a service-account-token Secret", func() error {
		err := create(keys, corev1.SecretTypeServiceAccountToken, nil)
		if err == nil {
			_ = admin.CoreV1().Secrets(ns).Delete(ctx, keys, metav1.DeleteOptions{})
			return errors.New("the create was allowed")
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may only write its own Secrets") {
			return err
		}
		return nil
	})
	if err := create("not-ours", corev1.SecretTypeOpaque, nil); !apierrors.IsForbidden(err) {
		t.Errorf("create an Opaque Secret of another name: %v, want Forbidden", err)
	}
	if err := create(certs, corev1.SecretTypeServiceAccountToken, nil); !apierrors.IsForbidden(err) {
		t.Errorf("create a service-account-token Secret under the certificate Secret's name: %v, want Forbidden", err)
	}
	// The replicas' own Secrets, as they write them.
	if err := create(keys, corev1.SecretTypeOpaque, map[string][]byte{"gossip.key": make([]byte, 32)}); err != nil {
		t.Fatalf("create the key Secret: %v", err)
	}
	if err := create(certs, corev1.SecretTypeTLS, map[string][]byte{corev1.TLSCertKey: nil, corev1.TLSPrivateKeyKey: nil}); err != nil {
		t.Fatalf("create the certificate Secret: %v", err)
	}
}
