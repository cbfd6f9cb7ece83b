package harness

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// promHistogram is one histogram series read from a /metrics page.
type promHistogram struct {
	count, sum float64
	les, cum   []float64 // bucket upper bounds and cumulative counts
}

// readFamilies reads a /metrics page in the Prometheus text format.
func readFamilies(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return fams, nil
}

// readHistogram reads the histogram name from url, summed over its series.
func readHistogram(url, name string) (promHistogram, error) {
	var h promHistogram
	fams, err := readFamilies(url)
	if err != nil {
		return h, err
	}
	f := fams[name]
	if f == nil {
		return h, fmt.Errorf("%s: no %s", url, name)
	}
	for _, m := range f.GetMetric() {
		hi := m.GetHistogram()
		h.count += float64(hi.GetSampleCount())
		h.sum += hi.GetSampleSum()
		for i, b := range hi.GetBucket() {
			if i >= len(h.les) {
				h.les = append(h.les, b.GetUpperBound())
				h.cum = append(h.cum, 0)
			}
			h.cum[i] += float64(b.GetCumulativeCount())
		}
	}
	return h, nil
}

// readGauges reads single-series gauges (such as the Go collector's
// go_memstats_heap_inuse_bytes) from url; a name not found is left out.
func readGauges(url string, names ...string) (map[string]float64, error) {
	fams, err := readFamilies(url)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, name := range names {
		if f := fams[name]; f != nil && len(f.GetMetric()) == 1 {
			out[name] = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return out, nil
}

// bound is the upper bound of the bucket holding quantile q: the q-th
// value is at most this (a bucket's resolution, not interpolated); +Inf
// above the last finite bucket.
func (h promHistogram) bound(q float64) float64 {
	for i, c := range h.cum {
		if c >= q*h.count {
			return h.les[i]
		}
	}
	return math.Inf(1)
}

// minus is what h counted since earlier, a reading of the same histogram
// (false: their buckets differ).
func (h promHistogram) minus(earlier promHistogram) (promHistogram, bool) {
	if len(earlier.les) == 0 {
		return h, true
	}
	if !slices.Equal(h.les, earlier.les) {
		return promHistogram{}, false
	}
	d := promHistogram{count: h.count - earlier.count, sum: h.sum - earlier.sum, les: h.les, cum: make([]float64, len(h.cum))}
	for i := range h.cum {
		d.cum[i] = h.cum[i] - earlier.cum[i]
	}
	return d, true
}
