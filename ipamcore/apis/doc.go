// Package apis is the home of cce-ipam's Kubernetes API groups; the only one
// is cce.io/v1alpha1 in cce/v1alpha1, shared with the reference system. This
// package has no code of its own: it holds the generator script and the test
// that keeps the generated code honest.
//
// After changing a type in cce/v1alpha1, regenerate and commit the result:
//
//	make generate                 # or: ipamcore/apis/generate.sh
//	go test ./ipamcore/apis/      # fails while anything generated is stale
//	git add ipamcore/apis ipamcore/generated charts/cce-ipam/crds
//
// generate.sh runs deepcopy-gen, client-gen, lister-gen and informer-gen
// (k8s.io/code-generator) and controller-gen (sigs.k8s.io/controller-tools)
// through `go tool`, at the versions pinned by the tool directives in go.mod.
// It writes:
//
//	cce/v1alpha1/zz_generated.deepcopy.go
//	../generated/clientset/versioned        typed clientset and its fake
//	../generated/listers/cce/v1alpha1
//	../generated/informers/externalversions
//	../../charts/cce-ipam/crds/cce.io_*.yaml
//
// Every generated Go file starts with boilerplate.go.txt. The staleness test
// copies go.mod, go.sum and this directory into a temporary module, runs the
// script there and compares every output file with the committed one, so it
// also catches generated files that were added or deleted by hand.
package apis
