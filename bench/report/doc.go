// Package report turns the benchmark's measurements into a Markdown report
// with PNG plots drawn by gonum/plot, and describes the machine it ran on.
// It knows nothing about the IPAM: the bench package fills a Doc and calls
// Write.
//
//	doc := report.Doc{Title: "cce-ipam benchmark"}
//	doc.Sections = append(doc.Sections, report.Section{
//		Heading: "1. Warm allocation",
//		Tables:  []report.Table{{Header: []string{"", "baseline", "ours", "ratio"}, Rows: rows}},
//		Images:  []report.Image{{Alt: "latency CDF", File: "latency-cdf.png"}},
//	})
//	_ = report.CDF(filepath.Join(dir, "latency-cdf.png"), "AllocateIP latency", "ms", series)
//	_ = report.Write(filepath.Join(dir, "report.md"), doc)
//
// Quantile and Median are the nearest-rank statistics every table uses;
// Machine reads cores, memory and versions from /proc and the binaries.
package report
