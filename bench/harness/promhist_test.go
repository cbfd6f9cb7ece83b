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
