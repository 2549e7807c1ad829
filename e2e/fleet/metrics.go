package fleet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Sample is one line of the Prometheus text format: a series and its value.
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

// ParseText parses the Prometheus text exposition format (comments and
// timestamps are skipped).
func ParseText(r io.Reader) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseLine(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		rest, err := parseLabels(line[1:], s.Labels)
		if err != nil {
			return s, err
		}
		line = rest
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, err
	}
	s.Value = v
	return s, nil
}

// parseLabels reads `k="v",...}` and returns what follows the brace.
func parseLabels(s string, into map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return "", fmt.Errorf("bad label")
		}
		key := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var b strings.Builder
		for {
			if s == "" {
				return "", fmt.Errorf("unterminated label value")
			}
			c := s[0]
			s = s[1:]
			if c == '"' {
				break
			}
			if c == '\\' && s != "" {
				switch s[0] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[0])
				}
				s = s[1:]
				continue
			}
			b.WriteByte(c)
		}
		into[key] = b.String()
	}
}
