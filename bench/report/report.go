package report

import (
	"fmt"
	"os"
	"strings"
)

// Doc is a whole report.
type Doc struct {
	Title    string
	Intro    []string // paragraphs under the title
	Sections []Section
}

// Section is one heading with its text, tables and plots, in that order.
type Section struct {
	Heading    string
	Paragraphs []string
	Tables     []Table
	Images     []Image
	Notes      []string // paragraphs after the tables and plots
}

// Table is a Markdown table; Caption, when set, is a bold line above it.
type Table struct {
	Caption string
	Header  []string
	Rows    [][]string
}

// Image is a plot file next to the report.
type Image struct {
	Alt, File string
}

// Markdown renders the document.
func (d Doc) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", d.Title)
	for _, p := range d.Intro {
		b.WriteString(p + "\n\n")
	}
	for _, s := range d.Sections {
		fmt.Fprintf(&b, "## %s\n\n", s.Heading)
		for _, p := range s.Paragraphs {
			b.WriteString(p + "\n\n")
		}
		for _, t := range s.Tables {
			b.WriteString(t.Markdown())
			b.WriteString("\n")
		}
		for _, im := range s.Images {
			fmt.Fprintf(&b, "![%s](%s)\n\n", im.Alt, im.File)
		}
		for _, p := range s.Notes {
			b.WriteString(p + "\n\n")
		}
	}
	return b.String()
}

// Markdown renders the table.
func (t Table) Markdown() string {
	var b strings.Builder
	if t.Caption != "" {
		fmt.Fprintf(&b, "**%s**\n\n", t.Caption)
	}
	row := func(cells []string) {
		b.WriteString("|")
		for i := range t.Header {
			c := ""
			if i < len(cells) {
				c = strings.ReplaceAll(cells[i], "|", "\\|")
			}
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
	}
	row(t.Header)
	b.WriteString("|")
	for i := range t.Header {
		if i == 0 {
			b.WriteString("---|")
		} else {
			b.WriteString("--:|")
		}
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		row(r)
	}
	return b.String()
}

// Write writes the document to path.
func Write(path string, d Doc) error {
	return os.WriteFile(path, []byte(d.Markdown()), 0o644)
}
