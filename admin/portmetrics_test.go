package admin

import (
	"bytes"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/sluice-proxy/sluice/lb"
)

// childPorts is the per-port metrics as labelled Prometheus children, the
// way sluice kept them before portMetrics: the reference the collector's
// exposition must equal.
type childPorts struct {
	reg                                            *prometheus.Registry
	connections, bytes, retries, failures, refused *prometheus.CounterVec
	active                                         *prometheus.GaugeVec
	latency                                        *prometheus.HistogramVec
}

func newChildPorts() *childPorts {
	svc := []string{"service", "protocol"}
	c := &childPorts{reg: prometheus.NewRegistry(),
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "connections_total",
			Help: "TCP connections accepted and UDP flows created, per service port."}, svc),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "sluice", Name: "active_connections",
			Help: "Open TCP connections and UDP flows, per service port."}, svc),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "bytes_total",
			Help: "Bytes forwarded, per service port and direction (up: client to endpoint, down: endpoint to client), counted when a connection ends."}, append(svc, "direction")),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "connect_retries_total",
			Help: "Connections that needed more than one connect attempt."}, svc),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "connect_failures_total",
			Help: "Failed connect attempts (refused, timed out, unreachable)."}, svc),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "refused_total",
			Help: "Clients refused because no endpoint could be reached."}, svc),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "sluice", Name: "connect_latency_seconds",
			Help:    "Time from accepting a connection to reaching an endpoint, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18)}, svc),
	}
	c.reg.MustRegister(c.connections, c.active, c.bytes, c.retries, c.failures, c.refused, c.latency)
	return c
}

func (c *childPorts) labels(n lb.ServicePortName) []string {
	return []string{n.String(), string(n.Protocol)}
}

func (c *childPorts) forget(n lb.ServicePortName) {
	l := c.labels(n)
	for _, v := range []interface{ DeleteLabelValues(...string) bool }{c.connections, c.active, c.retries, c.failures, c.refused, c.latency} {
		v.DeleteLabelValues(l...)
	}
	c.bytes.DeleteLabelValues(append(l, "up")...)
	c.bytes.DeleteLabelValues(append(l, "down")...)
}

// registryText is reg's families in the text format, as promhttp writes
// them.
func registryText(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// metricsText is everything m exposes, as /metrics serves it.
func metricsText(t *testing.T, m *Metrics) string {
	t.Helper()
	var b bytes.Buffer
	if err := m.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// exposition is the per-port families' lines of a text exposition, each
// histogram's _sum rounded (the children add float seconds, the counters
// integer nanoseconds: the same total to about 1e-15).
func exposition(t *testing.T, text string) string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(text, "\n") {
		name := line
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name = rest
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name = rest
		}
		if i := strings.IndexAny(name, "{ "); i >= 0 {
			name = name[:i]
		}
		name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		switch name {
		case "sluice_connections_total", "sluice_active_connections", "sluice_bytes_total", "sluice_connect_retries_total",
			"sluice_connect_failures_total", "sluice_refused_total", "sluice_connect_latency_seconds":
		default:
			continue
		}
		if head, v, ok := strings.Cut(line, "} "); ok && strings.Contains(head, "_sum{") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			line = head + "} " + strconv.FormatFloat(math.Round(f*1e9)/1e9, 'g', -1, 64)
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// The per-port exposition equals the labelled children's, line for line,
// over a random walk of data-path events, ports forgotten and made again included, and a
// latency on a bucket's bound lands in that bucket as Prometheus puts it.
func TestPortMetricsExpositionMatchesLabelledChildren(t *testing.T) {
	m, ref := NewMetrics(), newChildPorts()
	ports := newPortSet(m)
	names := []lb.ServicePortName{
		{Namespace: "demo", Name: "web", Port: "http", Protocol: lb.TCP},
		{Namespace: "demo", Name: "dns", Port: "dns", Protocol: lb.UDP},
		{Namespace: "kube-system", Name: "api", Protocol: lb.TCP},
		{Namespace: `odd\ns`, Name: "a\"b", Port: "new\nline", Protocol: lb.TCP}, // escaped
	}
	rng := rand.New(rand.NewPCG(1, 2))
	bounds := prometheus.ExponentialBuckets(0.00005, 2, 18)
	for step := 0; step < 3000; step++ {
		n := names[rng.IntN(len(names))]
		pc, l := ports.get(n), ref.labels(n)
		switch rng.IntN(8) {
		case 0:
			pc.Opened()
			ref.connections.WithLabelValues(l...).Inc()
			ref.active.WithLabelValues(l...).Inc()
		case 1:
			up, down := rng.Uint64N(1<<20), rng.Uint64N(1<<20)
			pc.Closed(up, down)
			ref.active.WithLabelValues(l...).Dec()
			ref.bytes.WithLabelValues(append(l, "up")...).Add(float64(up))
			ref.bytes.WithLabelValues(append(l, "down")...).Add(float64(down))
		case 2:
			var d time.Duration
			switch rng.IntN(3) {
			case 0: // on a bound
				d = time.Duration(bounds[rng.IntN(len(bounds))] * 1e9)
			case 1: // past every bound
				d = 20 * time.Second
			default:
				d = time.Duration(rng.Int64N(int64(10 * time.Second)))
			}
			tries := 1 + rng.IntN(3)
			pc.Connected(d, tries)
			ref.latency.WithLabelValues(l...).Observe(d.Seconds())
			if tries > 1 {
				ref.retries.WithLabelValues(l...).Inc()
			}
		case 3:
			pc.ConnectFailed()
			ref.failures.WithLabelValues(l...).Inc()
		case 4:
			pc.Refused()
			ref.refused.WithLabelValues(l...).Inc()
		case 5:
			if rng.IntN(20) == 0 {
				ports.forget(n)
				ref.forget(n)
			}
		default:
			if ports.get(n) != pc {
				t.Fatal("a second get for the same port gave other counters")
			}
		}
		if step%250 == 0 || step == 2999 {
			// The reference only has series for ports it has seen since the
			// last forget; make the collector's set the same by touching
			// the reference's children for every port the collector has.
			for _, n := range names {
				if _, has := ports.m[n]; has {
					ref.touch(n)
				}
			}
			if got, want := exposition(t, metricsText(t, m)), exposition(t, registryText(t, ref.reg)); got != want {
				t.Fatalf("step %d: exposition differs\n--- written\n%s\n--- children\n%s", step, got, want)
			}
		}
	}
}

// portSet keeps ports' counters by name and lists them to the metrics,
// as the listeners' server does.
type portSet struct {
	mu sync.Mutex
	mk func() *PortCounters
	m  map[lb.ServicePortName]*PortCounters
}

func newPortSet(m *Metrics) *portSet {
	s := &portSet{mk: m.NewPortCounters, m: map[lb.ServicePortName]*PortCounters{}}
	m.SetPortSeries(s.each)
	return s
}

// get is n's counters, made on first use.
func (s *portSet) get(n lb.ServicePortName) *PortCounters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.m[n]
	if c == nil {
		c = s.mk()
		s.m[n] = c
	}
	return c
}

func (s *portSet) forget(n lb.ServicePortName) {
	s.mu.Lock()
	delete(s.m, n)
	s.mu.Unlock()
}

func (s *portSet) each(yield func(lb.ServicePortName, *PortCounters)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, c := range s.m {
		yield(n, c)
	}
}

// touch makes every child of a port exist, as one PortCounters call made
// them before.
func (c *childPorts) touch(n lb.ServicePortName) {
	l := c.labels(n)
	c.connections.WithLabelValues(l...)
	c.active.WithLabelValues(l...)
	c.bytes.WithLabelValues(append(l, "up")...)
	c.bytes.WithLabelValues(append(l, "down")...)
	c.retries.WithLabelValues(l...)
	c.failures.WithLabelValues(l...)
	c.refused.WithLabelValues(l...)
	c.latency.WithLabelValues(l...)
}

// At 10k service ports the counters hold a few hundred bytes each, not the
// 5.6 KiB the labelled children took (heap profile of userspace mode at
// 10k Services): counted allocations, not time.
func TestPortCountersAreSmall(t *testing.T) {
	m := NewMetrics()
	const ports = 1000
	names := make([]lb.ServicePortName, ports)
	for i := range names {
		names[i] = lb.ServicePortName{Namespace: "default", Name: "s" + strconv.Itoa(i), Port: "p", Protocol: lb.TCP}
	}
	var before, after runtimeMem
	before.read()
	for range names {
		m.NewPortCounters()
	}
	after.read()
	if per := (after.bytes - before.bytes) / ports; per > 1024 {
		t.Fatalf("%d bytes allocated per service port's counters, want at most 1 KiB", per)
	}
}

// A port's counters stay in the 80-byte size class: they keep no name
// or labels, which their lister gives (issue 16's memory budget).
func TestPortCountersSize(t *testing.T) {
	if n := unsafe.Sizeof(PortCounters{}); n > 80 {
		t.Fatalf("PortCounters is %d bytes, want at most 80", n)
	}
}

type runtimeMem struct{ bytes uint64 }

func (r *runtimeMem) read() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.bytes = ms.TotalAlloc
}

// BenchmarkScrapeAt10k is one scrape of /metrics at 10k service ports:
// the text WriteText gives, and /metrics as Prometheus asks for it
// (gzip). Before the per-port families were written by hand (a
// prometheus.Collector, the registry's gather and expfmt): 1.05 s, 106 MB
// and 2 million allocations per scrape.
// go test -bench ScrapeAt10k ./admin
func BenchmarkScrapeAt10k(b *testing.B) {
	m := NewMetrics()
	ports := newPortSet(m)
	for i := range 10000 {
		pc := ports.get(lb.ServicePortName{Namespace: "bench", Name: "s" + strconv.Itoa(i), Port: "http", Protocol: lb.TCP})
		pc.Opened()
		pc.Connected(time.Millisecond, 1)
		pc.Closed(100, 200)
	}
	b.Run("text", func(b *testing.B) {
		var out bytes.Buffer
		b.ReportAllocs()
		for b.Loop() {
			out.Reset()
			if err := m.WriteText(&out); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(out.Len())/1e6, "MB-text")
	})
	b.Run("gzip", func(b *testing.B) {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		b.ReportAllocs()
		var n int
		for b.Loop() {
			rec := httptest.NewRecorder()
			m.ServeHTTP(rec, req)
			n = rec.Body.Len()
		}
		b.ReportMetric(float64(n)/1e6, "MB-gzip")
	})
}

// appendValue formats a value as expfmt does, its fast path for small
// whole numbers included.
func TestAppendValueFormatsAsExpfmt(t *testing.T) {
	for _, v := range []float64{0, 1, -1, 2, 42, 999999, 1e6, 1e6 + 1, 1234567, 1 << 53, 0.5, 1e-5, 0.00005, 3.2768, -2.5, 1e21,
		math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1)} {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "h"})
		g.Set(v)
		reg := prometheus.NewRegistry()
		reg.MustRegister(g)
		text := registryText(t, reg)
		want := strings.TrimSpace(text[strings.LastIndex(text, "g ")+2:])
		if got := string(appendValue(nil, v)); got != want {
			t.Errorf("%v: %q, expfmt %q", v, got, want)
		}
	}
}
