package main

import (
	"bytes"
	"errors"
	"strings"
)

const (
	beginMarker = "<!-- values:begin -->"
	endMarker   = "<!-- values:end -->"
)

// Table renders the rows as a Markdown table.
func Table(rows []Row) string {
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString("| `" + r.Key + "` | " + r.Type + " | " + code(r.Default) + " | " + cell(r.Description) + " |\n")
	}
	return b.String()
}

// code renders a default as inline code; a backtick inside it gets a longer fence.
func code(s string) string {
	s = cell(s)
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}

// cell escapes what would break a Markdown table row.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// Splice puts the table between the markers of the README.
func Splice(readme []byte, table string) ([]byte, error) {
	begin := bytes.Index(readme, []byte(beginMarker))
	end := bytes.Index(readme, []byte(endMarker))
	if begin < 0 || end < 0 || end < begin {
		return nil, errors.New("missing " + beginMarker + " … " + endMarker + " markers")
	}
	var out bytes.Buffer
	out.Write(readme[:begin+len(beginMarker)])
	out.WriteString("\n" + table)
	out.Write(readme[end:])
	return out.Bytes(), nil
}
