package report

import (
	"math"
	"slices"
	"time"
)

// Quantile returns the q-quantile (0..1) of xs by nearest rank; NaN when
// xs is empty. xs is not modified.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Median is Quantile(xs, 0.5).
func Median(xs []float64) float64 { return Quantile(xs, 0.5) }

// Max returns the largest of xs (NaN when empty).
func Max(xs []float64) float64 { return Quantile(xs, 1) }

// Millis converts durations to milliseconds.
func Millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// Ratio formats a/b as "1.23×" ("n/a" when either is missing or b is 0).
func Ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "n/a"
	}
	return trim(a/b, 2) + "×"
}

// Num formats x with up to digits decimals ("n/a" for NaN).
func Num(x float64, digits int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return trim(x, digits)
}
