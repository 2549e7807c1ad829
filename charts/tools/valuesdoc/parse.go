package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Parse reads values.yaml and returns one row per documented value, in file
// order. It fails on an undocumented leaf value.
func Parse(values []byte) ([]Row, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("values must be a YAML mapping")
	}
	var rows []Row
	var errs []error
	walk(doc.Content[0], "", &rows, &errs)
	return rows, errors.Join(errs...)
}

func walk(m *yaml.Node, prefix string, rows *[]Row, errs *[]error) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := prefix + k.Value
		desc, ok := description(k.HeadComment)
		switch {
		case ok:
			def, typ, err := render(v)
			if err != nil {
				*errs = append(*errs, fmt.Errorf("%s (line %d): %w", key, k.Line, err))
				continue
			}
			*rows = append(*rows, Row{Key: key, Type: typ, Default: def, Description: desc})
		case v.Kind == yaml.MappingNode && len(v.Content) > 0:
			walk(v, key+".", rows, errs)
		default:
			*errs = append(*errs, fmt.Errorf("%s (line %d) has no \"# --\" comment", key, k.Line))
		}
	}
}

// description returns the text of the last "# --" comment block of a head
// comment (earlier blocks, separated by a blank line, are section notes).
func description(head string) (string, bool) {
	blocks := strings.Split(head, "\n\n")
	lines := strings.Split(blocks[len(blocks)-1], "\n")
	for i, l := range lines {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "# --"); ok {
			parts := []string{strings.TrimSpace(rest)}
			for _, more := range lines[i+1:] {
				parts = append(parts, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(more), "#")))
			}
			return strings.Join(parts, " "), true
		}
	}
	return "", false
}

func render(v *yaml.Node) (def, typ string, err error) {
	var val any
	if err := v.Decode(&val); err != nil {
		return "", "", err
	}
	switch val.(type) {
	case string:
		typ = "string"
	case int, int64, uint64:
		typ = "int"
	case float64:
		typ = "float"
	case bool:
		typ = "bool"
	case []any:
		typ = "list"
	case map[string]any:
		typ = "map"
	case nil:
		typ = "null"
	default:
		return "", "", fmt.Errorf("unsupported value type %T", val)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(val); err != nil {
		return "", "", err
	}
	return strings.TrimSpace(buf.String()), typ, nil
}
