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

// The settled process's memory is read from Go's memory gauges: the heap's
// figures as they are, the free pages kept (idle less released) and the
// runtime's own sum; a figure whose gauges are not all there is left out.
func TestSettledMemStats(t *testing.T) {
	reg := prometheus.NewRegistry()
	mib := float64(1 << 20)
	for name, v := range map[string]float64{"heap_inuse": 28, "heap_alloc": 24, "heap_idle": 10, "heap_released": 7,
		"stack_inuse": 1, "mspan_inuse": 0.5, "gc_sys": 2, "other_sys": 1.5} {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_memstats_" + name + "_bytes"})
		g.Set(v * mib)
		reg.MustRegister(g)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	m := Metrics{}
	settledMemStats(m, srv.URL)
	for key, want := range map[string]float64{"heap_inuse_settled_mb": 28, "heap_alloc_settled_mb": 24, "heap_free_kept_settled_mb": 3, "runtime_own_settled_mb": 5} {
		if m[key] != want {
			t.Errorf("%s = %v, want %v", key, m[key], want)
		}
	}

	partial := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_memstats_heap_idle_bytes"})
	g.Set(mib)
	partial.MustRegister(g)
	srv2 := httptest.NewServer(promhttp.HandlerFor(partial, promhttp.HandlerOpts{}))
	defer srv2.Close()
	m = Metrics{}
	settledMemStats(m, srv2.URL)
	if len(m) != 0 {
		t.Errorf("figures from missing gauges: %v", m)
	}
}
