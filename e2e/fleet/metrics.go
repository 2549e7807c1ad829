package fleet

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one series of a scrape and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples is one scrape.
type Samples []Sample

// Buckets sums the cumulative buckets (le -> count) of the histogram called
// name over the series whose labels include labels.
func (ss Samples) Buckets(name string, labels map[string]string) map[float64]float64 {
	buckets := map[float64]float64{}
	for _, s := range ss {
		if s.Name != name+"_bucket" || !matches(s.Labels, labels) {
			continue
		}
		if le, err := strconv.ParseFloat(s.Labels["le"], 64); err == nil {
			buckets[le] += s.Value
		}
	}
	return buckets
}

// Sum adds the values of every series called name whose labels include all
// of labels (nil matches every series). ok is false when no series matched.
func (ss Samples) Sum(name string, labels map[string]string) (sum float64, ok bool) {
	for _, s := range ss {
		if s.Name != name || !matches(s.Labels, labels) {
			continue
		}
		sum += s.Value
		ok = true
	}
	return sum, ok
}

// Quantile estimates the q-quantile (0..1) of a histogram called name from
// its cumulative name_bucket series (summed over series matching labels),
// interpolating linearly inside a bucket, as PromQL's histogram_quantile
// does. It returns NaN for an empty histogram.
func (ss Samples) Quantile(name string, q float64, labels map[string]string) float64 {
	return HistogramQuantile(q, ss.Buckets(name, labels))
}

// HistogramQuantile estimates the q-quantile from cumulative bucket counts
// (upper bound le -> count, +Inf included), e.g. the difference of two
// scrapes' buckets for a recent window. NaN when empty.
func HistogramQuantile(q float64, buckets map[float64]float64) float64 {
	les := make([]float64, 0, len(buckets))
	for le := range buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	if len(les) == 0 || buckets[les[len(les)-1]] <= 0 {
		return math.NaN()
	}
	total := buckets[les[len(les)-1]]
	rank := q * total
	prevLE, prevCount := 0.0, 0.0
	for _, le := range les {
		c := buckets[le]
		if c >= rank {
			if math.IsInf(le, 1) {
				return prevLE // the highest finite bound, as PromQL does
			}
			if c == prevCount {
				return le
			}
			return prevLE + (le-prevLE)*(rank-prevCount)/(c-prevCount)
		}
		prevLE, prevCount = le, c
	}
	return les[len(les)-1]
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// Scrape reads a Prometheus text-format endpoint.
func Scrape(ctx context.Context, url string) (Samples, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return ParseText(resp.Body)
}

// ParseText parses the Prometheus text exposition format with expfmt and
// flattens it into one Sample per exposed line: a histogram's series come
// back as name_bucket (with its le label), name_sum and name_count, a
// summary's as name (with quantile), name_sum and name_count. Timestamps are
// dropped.
func ParseText(r io.Reader) (Samples, error) {
	// UTF-8 validation accepts every name a current client library may
	// write (quoted names included); the zero scheme is invalid.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	names := make([]string, 0, len(families))
	for name := range families {
		names = append(names, name)
	}
	sort.Strings(names)
	var out Samples
	for _, name := range names {
		for _, m := range families[name].GetMetric() {
			out = appendMetric(out, name, m)
		}
	}
	return out, nil
}

// appendMetric appends the samples of one metric of the family called name.
func appendMetric(out Samples, name string, m *dto.Metric) Samples {
	labels := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	sample := func(name string, value float64, extra ...string) Sample {
		ls := make(map[string]string, len(labels)+1)
		maps.Copy(ls, labels)
		for i := 0; i+1 < len(extra); i += 2 {
			ls[extra[i]] = extra[i+1]
		}
		return Sample{
			Name:   name,
			Labels: ls,
			Value:  value,
		}
	}
	switch {
	case m.Histogram != nil:
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			count := float64(b.GetCumulativeCount()) + b.GetCumulativeCountFloat()
			out = append(out, sample(name+"_bucket", count, "le", formatBound(b.GetUpperBound())))
		}
		out = append(out, sample(name+"_sum", h.GetSampleSum()),
			sample(name+"_count", float64(h.GetSampleCount())+h.GetSampleCountFloat()))
	case m.Summary != nil:
		sm := m.GetSummary()
		for _, q := range sm.GetQuantile() {
			out = append(out, sample(name, q.GetValue(), "quantile", formatBound(q.GetQuantile())))
		}
		out = append(out, sample(name+"_sum", sm.GetSampleSum()), sample(name+"_count", float64(sm.GetSampleCount())))
	case m.Counter != nil:
		out = append(out, sample(name, m.GetCounter().GetValue()))
	case m.Gauge != nil:
		out = append(out, sample(name, m.GetGauge().GetValue()))
	case m.Untyped != nil:
		out = append(out, sample(name, m.GetUntyped().GetValue()))
	}
	return out
}

// formatBound writes a bucket bound or quantile as the text format does
// ("+Inf" for the last bucket).
func formatBound(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
