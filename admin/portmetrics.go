package admin

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/lb"
)

// portMetrics exports every service port's data-path metrics at scrape
// time from the ports' own atomic counters: one prometheus.Collector for
// all of them, instead of a labelled child per metric and port. The
// children cost 5.6 KiB per service port, 56 MB of the 159 MB live heap
// at 10k Services in userspace mode (a heap profile through
// kube-apiserver); a PortCounters is a few hundred bytes. The exposition
// is what the children gave: the same names, help, labels and types.
type portMetrics struct {
	connections, active, bytes, retries, failures, refused, latency *prometheus.Desc
	buckets                                                         []float64 // the latency histogram's upper bounds

	mu    sync.Mutex
	ports map[lb.ServicePortName]*PortCounters
}

func newPortMetrics() *portMetrics {
	svc := []string{"service", "protocol"}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("sluice", "", name), help, labels, nil)
	}
	return &portMetrics{
		connections: desc("connections_total", "TCP connections accepted and UDP flows created, per service port.", svc...),
		active:      desc("active_connections", "Open TCP connections and UDP flows, per service port.", svc...),
		bytes: desc("bytes_total", "Bytes forwarded, per service port and direction (up: client to endpoint, down: endpoint to client), counted when a connection ends.",
			append(svc, "direction")...),
		retries:  desc("connect_retries_total", "Connections that needed more than one connect attempt.", svc...),
		failures: desc("connect_failures_total", "Failed connect attempts (refused, timed out, unreachable).", svc...),
		refused:  desc("refused_total", "Clients refused because no endpoint could be reached.", svc...),
		latency:  desc("connect_latency_seconds", "Time from accepting a connection to reaching an endpoint, retries included.", svc...),
		buckets:  prometheus.ExponentialBuckets(0.00005, 2, 18), // 50 us to about 6.5 s
		ports:    map[lb.ServicePortName]*PortCounters{},
	}
}

// counters returns name's counters, made on first use: a port whose
// frontend changes keeps its series, as a labelled child did.
func (p *portMetrics) counters(name lb.ServicePortName) *PortCounters {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.ports[name]
	if c == nil {
		c = &PortCounters{p: p, name: name, service: name.String(), latency: make([]atomic.Uint64, len(p.buckets)+1)}
		p.ports[name] = c
	}
	return c
}

func (p *portMetrics) forget(c *PortCounters) {
	p.mu.Lock()
	if p.ports[c.name] == c {
		delete(p.ports, c.name)
	}
	p.mu.Unlock()
}

func (p *portMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{p.connections, p.active, p.bytes, p.retries, p.failures, p.refused, p.latency} {
		ch <- d
	}
}

func (p *portMetrics) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	ports := make([]*PortCounters, 0, len(p.ports))
	for _, c := range p.ports {
		ports = append(ports, c)
	}
	p.mu.Unlock()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, c := range ports {
		proto := string(c.name.Protocol)
		counter(p.connections, c.connections.Load(), c.service, proto)
		ch <- prometheus.MustNewConstMetric(p.active, prometheus.GaugeValue, float64(c.active.Load()), c.service, proto)
		counter(p.bytes, c.up.Load(), c.service, proto, "up")
		counter(p.bytes, c.down.Load(), c.service, proto, "down")
		counter(p.retries, c.retries.Load(), c.service, proto)
		counter(p.failures, c.failures.Load(), c.service, proto)
		counter(p.refused, c.refused.Load(), c.service, proto)
		// The count is the buckets' sum, so the two always agree; the sum
		// of latencies may run a moment ahead of them during a scrape.
		// A map per port: the const histogram keeps it, not a copy.
		cumulative := make(map[float64]uint64, len(p.buckets))
		var n uint64
		for i, bound := range p.buckets {
			n += c.latency[i].Load()
			cumulative[bound] = n
		}
		n += c.latency[len(p.buckets)].Load()
		ch <- prometheus.MustNewConstHistogram(p.latency, n, float64(c.latencyNanos.Load())/1e9, cumulative, c.service, proto)
	}
}

// PortCounters are one service port's data-path metrics: atomic counters
// the data path adds to, read by portMetrics at scrape time. Its methods
// match listeners.Counters.
type PortCounters struct {
	p       *portMetrics
	name    lb.ServicePortName
	service string // name.String(), the service label

	connections, up, down, retries, failures, refused atomic.Uint64
	active                                            atomic.Int64
	latency                                           []atomic.Uint64 // per bucket, the last for above every bound
	latencyNanos                                      atomic.Uint64
}

// PortCounters returns the data-path counters of one service port; the
// same ones for the same port until Forget.
func (m *Metrics) PortCounters(name lb.ServicePortName) *PortCounters { return m.ports.counters(name) }

// Opened counts a connection or flow.
func (c *PortCounters) Opened() { c.connections.Add(1); c.active.Add(1) }

// Connected records connect latency and whether retries were needed.
func (c *PortCounters) Connected(latency time.Duration, tries int) {
	s := latency.Seconds()
	i := sort.SearchFloat64s(c.p.buckets, s) // the first bound >= s: Prometheus buckets are upper-inclusive
	c.latency[i].Add(1)
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

// Forget deletes the port's series, once the service port is gone, so that
// churn does not grow the metrics without bound.
func (c *PortCounters) Forget() { c.p.forget(c) }
