package v1alpha1_test

import (
	"reflect"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The reference fixtures set every field the Go types have, so the other
// tests (and the integration test) cover every field.
func TestFixtures_CoverEveryField(t *testing.T) {
	for _, f := range referenceFixtures() {
		t.Run(f.file, func(t *testing.T) {
			inFixture := map[string]bool{}
			jsonPaths("", jsonMap(t, readFixture(t, f.file)), inFixture)
			paths := typePaths("", reflect.TypeOf(f.want).Elem())
			if len(paths) < 5 {
				t.Fatalf("only %d fields found in %T: %v", len(paths), f.want, paths)
			}
			var missing []string
			for _, p := range paths {
				if !inFixture[p] {
					missing = append(missing, p)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("fields of the Go type not set in %s:\n  %s", f.file, strings.Join(missing, "\n  "))
			}
		})
	}
}

var (
	timeType     = reflect.TypeOf(metav1.Time{})
	durationType = reflect.TypeOf(metav1.Duration{})
)

// typePaths lists the JSON paths of a type's leaves: spec.release.TTL,
// status.eni.enis.*.addresses[].isPrimary. Metadata is not listed.
func typePaths(prefix string, typ reflect.Type) []string {
	switch typ.Kind() {
	case reflect.Pointer:
		return typePaths(prefix, typ.Elem())
	case reflect.Slice:
		return typePaths(prefix+"[]", typ.Elem())
	case reflect.Map:
		return typePaths(prefix+".*", typ.Elem())
	case reflect.Struct:
		if typ == timeType || typ == durationType {
			return []string{prefix}
		}
		var paths []string
		for i := 0; i < typ.NumField(); i++ {
			field := typ.Field(i)
			name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
			if field.Anonymous && name == "" {
				// Inlined: TypeMeta's apiVersion and kind, the strategy
				// fields of a PSTS subnet.
				paths = append(paths, typePaths(prefix, field.Type)...)
				continue
			}
			if name == "metadata" || name == "-" {
				continue
			}
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			paths = append(paths, typePaths(p, field.Type)...)
		}
		return paths
	default:
		return []string{prefix}
	}
}

// mapFields are the JSON names of the map-typed fields: the keys of their
// objects are data (ENI IDs, subnet IDs, addresses, labels), not field names.
var mapFields = []string{"enis", "subnets", "availableSubnets", "unavailableSubnets", "ipAllocations", "matchLabels"}

// jsonPaths records the paths of a decoded JSON document in the same form,
// with the keys of map-typed fields written as "*".
func jsonPaths(prefix string, v any, out map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			key := k
			for _, f := range mapFields {
				if strings.HasSuffix(prefix, "."+f) {
					key = "*"
				}
			}
			p := key
			if prefix != "" {
				p = prefix + "." + key
			}
			jsonPaths(p, x, out)
		}
	case []any:
		for _, x := range v {
			jsonPaths(prefix+"[]", x, out)
		}
	default:
		out[prefix] = true
	}
}
