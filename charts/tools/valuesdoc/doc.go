// Command valuesdoc writes the values table of a Helm chart's README from the
// comments in its values.yaml, so that the documentation cannot fall behind
// the values.
//
// A value is documented by a comment that starts with "# --" directly above
// its key; the comment may continue on more "#" lines. A documented map is
// one row (its default shown as JSON); an undocumented map is descended
// into; an undocumented leaf is an error, so every value has a row.
//
// The table replaces the text between the markers
//
//	<!-- values:begin -->
//	<!-- values:end -->
//
// in the README.
//
//	go run ./charts/tools/valuesdoc -values charts/cce-ipam/values.yaml -readme charts/cce-ipam/README.md
//	go run ./charts/tools/valuesdoc -values ... -readme ... -check   # exit 1 if the README is stale
package main
