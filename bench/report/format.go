package report

import (
	"strconv"
	"strings"
)

func trim(x float64, digits int) string {
	s := strconv.FormatFloat(x, 'f', digits, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// MiB formats bytes as MiB with one decimal.
func MiB(b float64) string { return Num(b/(1<<20), 1) + " MiB" }
