package harness

import (
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

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
