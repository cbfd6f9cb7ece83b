package harness

import (
	"math"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// A histogram read back from /metrics: count, sum over the series, and the
// bucket bounds of its quantiles.
func TestReadHistogramBounds(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "x_seconds", Buckets: []float64{0.001, 0.002, 0.004}}, []string{"f"})
	reg.MustRegister(h)
	for _, v := range []float64{0.0005, 0.0015, 0.0015, 0.003} {
		h.WithLabelValues("a").Observe(v)
	}
	h.WithLabelValues("b").Observe(0.01)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got, err := readHistogram(srv.URL, "x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if got.count != 5 || got.sum < 0.0164 || got.sum > 0.0166 {
		t.Fatalf("count %v sum %v, want 5 and 0.0165", got.count, got.sum)
	}
	for q, want := range map[float64]float64{0.2: 0.001, 0.6: 0.002, 0.8: 0.004, 1: math.Inf(1)} {
		if b := got.bound(q); b != want {
			t.Errorf("bound(%v) = %v, want %v", q, b, want)
		}
	}
	if _, err := readHistogram(srv.URL, "nope"); err == nil {
		t.Error("a missing histogram read without error")
	}
}

// Two readings of one histogram: what came between them, its quantiles
// read from that alone; readings of different buckets do not subtract.
func TestHistogramMinusAnEarlierReading(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x_seconds", Buckets: []float64{0.001, 0.002, 0.004}})
	reg.MustRegister(h)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for range 100 {
		h.Observe(0.003) // before: all slow
	}
	before, err := readHistogram(srv.URL, "x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		h.Observe(0.0005)
	}
	after, err := readHistogram(srv.URL, "x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	d, ok := after.minus(before)
	if !ok || d.count != 10 || d.sum < 0.0049 || d.sum > 0.0051 {
		t.Fatalf("between the readings: %+v %v, want 10 observations summing to 0.005", d, ok)
	}
	if b := d.bound(0.99); b != 0.001 {
		t.Errorf("p99 between the readings in the bucket %v, want 0.001", b)
	}
	if b := after.bound(0.99); b != 0.004 {
		t.Errorf("p99 overall in the bucket %v, want 0.004", b)
	}
	if _, ok := after.minus(promHistogram{count: 1, les: []float64{1}, cum: []float64{1}}); ok {
		t.Error("readings with other buckets subtracted")
	}
}
