package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cce-ipam/sharded/ipamcore/webhook/certs"
)

// patchCABundles sets the caBundle of every webhook of the managed
// configurations to b's CAs where it differs. Every replica does it, so the
// configurations follow the Secret whoever renewed it, and a caBundle reset
// (a helm upgrade, a kubectl apply) is repaired at once. The JSON Patch
// tests each webhook's name at its index, so a concurrent edit of the list
// fails the patch instead of landing on another webhook.
//
// A replica whose Secret is older than the configuration (the caBundle
// holds a CA newer than all of b's) leaves it: it would take away a CA the
// served certificate may already come from, until it reads the new Secret.
func (k *keeper) patchCABundles(ctx context.Context, b *certs.Bundle) error {
	want := b.CABundle()
	if len(want) == 0 {
		return nil
	}
	var errs []error
	for _, c := range k.configs(ctx) {
		errs = append(errs, k.patchConfig(c, b, want))
	}
	return errors.Join(errs...)
}

// config is one managed webhook configuration, as the informer shows it.
type config struct {
	kind, name, rv string
	hooks          []hook
	patch          func(jsonPatch []byte) error
}

// configs are the managed configurations that exist.
func (k *keeper) configs(ctx context.Context) []config {
	var out []config
	api := k.kube.AdmissionregistrationV1()
	if k.mutating != nil {
		if c, err := k.mutating.Get(k.cfg.MutatingConfigName); err == nil {
			cfg := config{kind: "MutatingWebhookConfiguration", name: c.Name, rv: c.ResourceVersion, patch: func(p []byte) error {
				_, err := api.MutatingWebhookConfigurations().Patch(ctx, c.Name, types.JSONPatchType, p, metav1.PatchOptions{})
				return err
			}}
			for _, w := range c.Webhooks {
				cfg.hooks = append(cfg.hooks, hook{w.Name, w.ClientConfig.CABundle})
			}
			out = append(out, cfg)
		}
	}
	if k.validating != nil {
		if c, err := k.validating.Get(k.cfg.ValidatingConfigName); err == nil {
			cfg := config{kind: "ValidatingWebhookConfiguration", name: c.Name, rv: c.ResourceVersion, patch: func(p []byte) error {
				_, err := api.ValidatingWebhookConfigurations().Patch(ctx, c.Name, types.JSONPatchType, p, metav1.PatchOptions{})
				return err
			}}
			for _, w := range c.Webhooks {
				cfg.hooks = append(cfg.hooks, hook{w.Name, w.ClientConfig.CABundle})
			}
			out = append(out, cfg)
		}
	}
	return out
}

// hook is one webhook of a configuration: its name and caBundle.
type hook struct {
	name     string
	caBundle []byte
}

// patchConfig patches one configuration once: until the informer shows a
// newer version of it, the same patch is not sent again.
func (k *keeper) patchConfig(c config, b *certs.Bundle, want []byte) error {
	ops := caBundleOps(c.hooks, b, want)
	if len(ops) == 0 {
		return nil
	}
	data, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	sent := c.name + "@" + c.rv + ":" + string(data)
	if k.patched[c.kind] == sent {
		return nil
	}
	if err := c.patch(data); err != nil {
		return fmt.Errorf("patch the caBundle of %s %s: %w", c.kind, c.name, err)
	}
	k.patched[c.kind] = sent
	k.metrics.caPatches.Inc()
	k.log.Info("caBundle patched", "kind", c.kind, "name", c.name, "webhooks", len(ops)/2)
	return nil
}

// caBundleOps is the JSON Patch that sets want as every hook's caBundle, or
// nil when none needs it or the configuration knows a CA newer than b's.
func caBundleOps(hooks []hook, b *certs.Bundle, want []byte) []patchOp {
	var ops []patchOp
	for i, h := range hooks {
		if bytes.Equal(h.caBundle, want) {
			continue
		}
		if newerCA(h.caBundle, b) {
			return nil
		}
		at := "/webhooks/" + strconv.Itoa(i)
		ops = append(ops, patchOp{Op: "test", Path: at + "/name", Value: h.name},
			add(at+"/clientConfig/caBundle", want))
	}
	return ops
}

// newerCA reports whether bundle holds a CA that starts after every CA of b.
func newerCA(bundle []byte, b *certs.Bundle) bool {
	newest := b.CAs[len(b.CAs)-1].Cert.NotBefore
	for _, c := range certs.BundleCerts(bundle) {
		if c.NotBefore.After(newest) && c.IsCA {
			return true
		}
	}
	return false
}
