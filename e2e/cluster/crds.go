package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// InstallCRDs creates (or updates) every CustomResourceDefinition in the
// YAML files of dir — one CRD per file, as controller-gen writes them into a
// chart's crds/ — and waits until the API server serves them.
func (c *Cluster) InstallCRDs(ctx context.Context, dir string) error {
	return c.installCRDs(ctx, dir, true)
}

// InstallMissingCRDs creates the CRDs of dir that the API server lacks and
// leaves existing ones as they are, as `helm install` treats a chart's
// crds/ (e.g. where the reference's schema-less CRDs are installed).
func (c *Cluster) InstallMissingCRDs(ctx context.Context, dir string) error {
	return c.installCRDs(ctx, dir, false)
}

func (c *Cluster) installCRDs(ctx context.Context, dir string, update bool) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no CRD files in %s", dir)
	}
	client := apiextensionsclient.NewForConfigOrDie(c.Config).ApiextensionsV1().CustomResourceDefinitions()
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict([]byte(strings.TrimPrefix(string(data), "---\n")), &crd); err != nil {
			return fmt.Errorf("decode %s: %w", f, err)
		}
		existing, err := client.Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = client.Create(ctx, &crd, metav1.CreateOptions{})
		case err == nil && !update:
		case err == nil:
			crd.ResourceVersion = existing.ResourceVersion
			_, err = client.Update(ctx, &crd, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("apply CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := client.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}
