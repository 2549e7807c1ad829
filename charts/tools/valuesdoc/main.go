package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
)

func main() {
	valuesPath := flag.String("values", "values.yaml", "the chart's values.yaml")
	readmePath := flag.String("readme", "README.md", "the README whose values table is rewritten")
	check := flag.Bool("check", false, "only report whether the README is up to date (exit 1 if not)")
	flag.Parse()
	if err := run(*valuesPath, *readmePath, *check); err != nil {
		fmt.Fprintln(os.Stderr, "valuesdoc:", err)
		os.Exit(1)
	}
}

func run(valuesPath, readmePath string, check bool) error {
	values, err := os.ReadFile(valuesPath)
	if err != nil {
		return err
	}
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return err
	}
	rows, err := Parse(values)
	if err != nil {
		return fmt.Errorf("%s: %w", valuesPath, err)
	}
	updated, err := Splice(readme, Table(rows))
	if err != nil {
		return fmt.Errorf("%s: %w", readmePath, err)
	}
	if bytes.Equal(updated, readme) {
		return nil
	}
	if check {
		return fmt.Errorf("the values table in %s is stale: run `make chart-docs`", readmePath)
	}
	return os.WriteFile(readmePath, updated, 0o644)
}
