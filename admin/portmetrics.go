package admin

import (
	"bufio"
	"bytes"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/lb"
)

// portMetrics exports every service port's data-path metrics at scrape
// time from the ports' own atomic counters, written straight in the
// Prometheus text format (writeText) beside the registry's families. The
// exposition is what labelled children gave (the same names, help, labels,
// types and order; TestPortMetricsExpositionMatchesLabelledChildren):
//   - not a child per metric and port: those cost 5.6 KiB per service port,
//     56 MB of the 159 MB live heap at 10k Services in userspace mode (a
//     heap profile through kube-apiserver); a PortCounters is a few hundred
//     bytes;
//   - not a prometheus.Collector either: at 10k ports its const metrics, the
//     registry's gather and the text encoding cost 1.05 s of CPU and 106 MB
//     of garbage (2 million allocations) per scrape
//     (BenchmarkScrapeAt10k), for 25 MB of text.
type portMetrics struct {
	families []portFamily // sorted by name, as a registry gathers them
	buckets  []float64    // the latency histogram's upper bounds
	le       []string     // their le label values, formatted once

	mu sync.Mutex
	// series lists the ports' counters with their names at scrape time
	// (SetPortSeries): the listeners' server, which keeps each port's
	// counters with the port. No map of its own: one keyed by the
	// series' labels, with the labels, held 89 bytes per port beside the
	// counters (issue 16's memory budget).
	series PortSeries
	// lastPorts and lastLabels are the last scrape's port count and
	// labels' length, the next one's first guess of its room.
	lastPorts, lastLabels int
}

// PortSeries calls yield once with each service port's name and counters,
// every name once.
type PortSeries func(yield func(lb.ServicePortName, *PortCounters))

// portFamily is one metric family of the per-port metrics.
type portFamily struct {
	id               int // famConnections...
	name, help, kind string
}

// The families.
const (
	famConnections = iota
	famActive
	famBytes
	famRetries
	famFailures
	famRefused
	famLatency
)

// latencyBuckets is the number of upper bounds of the connect latency
// histogram.
const latencyBuckets = 18

func newPortMetrics() *portMetrics {
	buckets := prometheus.ExponentialBuckets(0.00005, 2, latencyBuckets) // 50 us to about 6.5 s
	le := make([]string, len(buckets))
	for i, b := range buckets {
		le[i] = strconv.FormatFloat(b, 'g', -1, 64)
	}
	families := []portFamily{
		{famConnections, "sluice_connections_total", "TCP connections accepted and UDP flows created, per service port.", "counter"},
		{famActive, "sluice_active_connections", "Open TCP connections and UDP flows, per service port.", "gauge"},
		{famBytes, "sluice_bytes_total", "Bytes forwarded, per service port and direction (up: client to endpoint, down: endpoint to client), counted when a connection ends.",
			"counter"},
		{famRetries, "sluice_connect_retries_total", "Connections that needed more than one connect attempt.", "counter"},
		{famFailures, "sluice_connect_failures_total", "Failed connect attempts (refused, timed out, unreachable).", "counter"},
		{famRefused, "sluice_refused_total", "Clients refused because no endpoint could be reached.", "counter"},
		{famLatency, "sluice_connect_latency_seconds", "Time from accepting a connection to reaching an endpoint, retries included.", "histogram"},
	}
	slices.SortFunc(families, func(a, b portFamily) int { return strings.Compare(a.name, b.name) })
	return &portMetrics{families: families, buckets: buckets, le: le}
}

// appendLabels appends a port's series' labels as the text format writes
// them: protocol="TCP",service="namespace/name:port".
func appendLabels(b []byte, n lb.ServicePortName) []byte {
	b = append(b, `protocol="`...)
	b = appendLabelValue(b, string(n.Protocol))
	b = append(b, `",service="`...)
	b = appendLabelValue(b, n.Namespace)
	b = append(b, '/')
	b = appendLabelValue(b, n.Name)
	if n.Port != "" {
		b = append(b, ':')
		b = appendLabelValue(b, n.Port)
	}
	return append(b, '"')
}

// appendLabelValue appends v escaped as the text format escapes a label
// value: backslash, newline and double quote.
func appendLabelValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '\n':
			b = append(b, `\n`...)
		case '"':
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// namedCounters is a port's counters with its name, as listed.
type namedCounters struct {
	name lb.ServicePortName
	c    *PortCounters
}

// labelled is a port's counters with their series' labels.
type labelled struct {
	labels []byte
	*PortCounters
}

// familyNames are the names of the per-port families, in a map the
// caller may add to.
func (p *portMetrics) familyNames() map[string]bool {
	names := make(map[string]bool, len(p.families)+64)
	for _, f := range p.families {
		names[f.name] = true
	}
	return names
}

// names says whether only names one of the per-port families.
func (p *portMetrics) names(only map[string]bool) bool {
	return slices.ContainsFunc(p.families, func(f portFamily) bool { return only[f.name] })
}

// writeText writes the families in the Prometheus text format (0.0.4),
// each port's series in the order a registry gathers them (by label
// values, label names sorted: direction, protocol, service). Values are
// formatted as expfmt formats them. When only is not empty, just the
// families it names are written, and the ports are not listed at all
// when it names none of them.
func (p *portMetrics) writeText(w *bufio.Writer, only map[string]bool) {
	if len(only) > 0 && !p.names(only) {
		return
	}
	p.mu.Lock()
	series := p.series
	// The labels of every port in one buffer, which each port's slice of
	// it keeps if it grows: not an allocation a port.
	named := make([]namedCounters, 0, p.lastPorts+p.lastPorts/8)
	all := make([]byte, 0, p.lastLabels+p.lastLabels/8)
	p.mu.Unlock()
	if series == nil {
		return
	}
	// Only copied while the series is listed (the listeners' server holds
	// its lock throughout, and an apply waits for it); the labels are
	// written after.
	series(func(n lb.ServicePortName, c *PortCounters) { named = append(named, namedCounters{n, c}) })
	ports := make([]labelled, len(named))
	for i, nc := range named {
		start := len(all)
		all = appendLabels(all, nc.name)
		ports[i] = labelled{all[start:len(all):len(all)], nc.c}
	}
	p.mu.Lock()
	p.lastPorts, p.lastLabels = len(ports), len(all)
	p.mu.Unlock()
	if len(ports) == 0 {
		return
	}
	slices.SortFunc(ports, func(a, b labelled) int { return bytes.Compare(a.labels, b.labels) })
	var num []byte
	// sample writes one line: name+suffix{pre labels[,le="le"]} v
	sample := func(name, suffix, pre string, labels []byte, le string, v float64) {
		w.WriteString(name)
		w.WriteString(suffix)
		w.WriteByte('{')
		w.WriteString(pre)
		w.Write(labels)
		if le != "" {
			w.WriteString(`,le="`)
			w.WriteString(le)
			w.WriteByte('"')
		}
		w.WriteString("} ")
		num = appendValue(num[:0], v)
		w.Write(num)
		w.WriteByte('\n')
	}
	for _, f := range p.families {
		if len(only) > 0 && !only[f.name] {
			continue
		}
		w.WriteString("# HELP " + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.kind + "\n")
		switch f.id {
		case famBytes:
			for _, dir := range []string{"down", "up"} {
				pre := `direction="` + dir + `",`
				for _, c := range ports {
					v := &c.up
					if dir == "down" {
						v = &c.down
					}
					sample(f.name, "", pre, c.labels, "", float64(v.Load()))
				}
			}
		case famLatency:
			for _, c := range ports {
				// The count is the buckets' sum, so the two always agree; the
				// sum of latencies may run a moment ahead of them.
				var n uint64
				h := c.latency.Load() // nil: no connection yet, every bucket 0
				for j, le := range p.le {
					if h != nil {
						n += h[j].Load()
					}
					sample(f.name, "_bucket", "", c.labels, le, float64(n))
				}
				if h != nil {
					n += h[len(p.le)].Load()
				}
				sample(f.name, "_bucket", "", c.labels, "+Inf", float64(n))
				sample(f.name, "_sum", "", c.labels, "", float64(c.latencyNanos.Load())/1e9)
				sample(f.name, "_count", "", c.labels, "", float64(n))
			}
		default:
			for _, c := range ports {
				var v float64
				switch f.id {
				case famConnections:
					v = float64(c.connections.Load())
				case famActive:
					v = float64(c.active.Load())
				case famRetries:
					v = float64(c.retries.Load())
				case famFailures:
					v = float64(c.failures.Load())
				case famRefused:
					v = float64(c.refused.Load())
				}
				sample(f.name, "", "", c.labels, "", v)
			}
		}
	}
}

// appendValue formats a sample value as expfmt does.
func appendValue(b []byte, v float64) []byte {
	switch {
	case v >= 0 && v < 1e6 && v == math.Trunc(v):
		// What 'g' gives below its exponent threshold, without the
		// shortest-decimal search: most series are small counts.
		return strconv.AppendUint(b, uint64(v), 10)
	case v == -1:
		return append(b, "-1"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, +1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// PortCounters are one service port's data-path metrics: atomic counters
// the data path adds to, read by portMetrics at scrape time. Its methods
// match listeners.Counters.
//
// It keeps no name or labels: whoever keeps it with its port lists it
// with the port's name (PortSeries). 80 bytes a port
// (TestPortCountersSize).
type PortCounters struct {
	p *portMetrics

	connections, up, down, retries, failures, refused atomic.Uint64
	active                                            atomic.Int64
	// latency counts per bucket, the last for above every bound; made by
	// the port's first connection, so that a port that has had none holds
	// no histogram (160 bytes each: issue 16's memory budget).
	latency      atomic.Pointer[[latencyBuckets + 1]atomic.Uint64]
	latencyNanos atomic.Uint64
}

// NewPortCounters returns new data-path counters for one service port.
// They are exported while the PortSeries given to SetPortSeries lists them.
func (m *Metrics) NewPortCounters() *PortCounters { return &PortCounters{p: m.ports} }

// SetPortSeries sets what lists the service ports' counters at scrape
// time (nil: none).
func (m *Metrics) SetPortSeries(s PortSeries) {
	m.ports.mu.Lock()
	m.ports.series = s
	m.ports.mu.Unlock()
}

// Opened counts a connection or flow.
func (c *PortCounters) Opened() { c.connections.Add(1); c.active.Add(1) }

// Connected records connect latency and whether retries were needed.
func (c *PortCounters) Connected(latency time.Duration, tries int) {
	s := latency.Seconds()
	i := sort.SearchFloat64s(c.p.buckets, s) // the first bound >= s: Prometheus buckets are upper-inclusive
	h := c.latency.Load()
	if h == nil {
		h = new([latencyBuckets + 1]atomic.Uint64)
		if !c.latency.CompareAndSwap(nil, h) {
			h = c.latency.Load() // another connection made it first
		}
	}
	h[i].Add(1)
	c.latencyNanos.Add(uint64(max(latency, 0)))
	if tries > 1 {
		c.retries.Add(1)
	}
}

// ConnectFailed counts one failed attempt.
func (c *PortCounters) ConnectFailed() { c.failures.Add(1) }

// Refused counts a refused client.
func (c *PortCounters) Refused() { c.refused.Add(1) }

// Closed adds a finished connection's bytes.
func (c *PortCounters) Closed(up, down uint64) {
	c.active.Add(-1)
	c.up.Add(up)
	c.down.Add(down)
}
