package admin

import (
	"bufio"
	"compress/gzip"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metrics is sluice's Prometheus registry. It is private to the process
// object that owns it; nothing is registered globally.
type Metrics struct {
	Registry *prometheus.Registry
	// ProcessStart, when set, is sent with every scrape of /metrics and
	// /metrics/slis as the Process-Start-Time-Unix header (seconds), as
	// kube-proxy's metrics handlers send it.
	ProcessStart time.Time
	// runtime holds the Go and process collectors, gathered apart: they
	// read the runtime's metrics and /proc, most of a gathering's cost, so
	// a scrape by name that does not ask for theirs skips them.
	runtime *prometheus.Registry

	syncDuration    *prometheus.HistogramVec
	lastSync        *prometheus.GaugeVec
	lastQueued      *prometheus.GaugeVec
	families        []string // the planes' IP families ("" for a whole-state plane)
	serviceChanges  prometheus.Counter
	servicePending  prometheus.Gauge
	endpointChanges prometheus.Counter
	endpointPending prometheus.Gauge
	healthz         *prometheus.CounterVec
	livez           *prometheus.CounterVec
	rejected        *prometheus.CounterVec
	listenerErrors  prometheus.Counter
	restoreFails    *prometheus.CounterVec
	partialFails    *prometheus.CounterVec
	iptablesRules   *prometheus.GaugeVec
	iptablesLast    *prometheus.GaugeVec
	nftFails        *prometheus.CounterVec
	nftCleanupFails *prometheus.CounterVec
	ctDuration      *prometheus.HistogramVec
	programming     *prometheus.HistogramVec
	updateApply     prometheus.Histogram
	ctDeleted       *prometheus.CounterVec
	fullSyncs       *prometheus.HistogramVec
	partialSyncs    *prometheus.HistogramVec
	noLocal         *prometheus.GaugeVec
	sctpSkipped     prometheus.Gauge

	ports *portMetrics // every service port's data-path metrics

	// slis is what /metrics/slis serves, as kube-proxy's (component-base's
	// health-check SLIs): each check's last result and a count of results.
	slis         *prometheus.Registry
	healthcheck  *prometheus.GaugeVec
	healthchecks *prometheus.CounterVec
}

// textContentType is the Prometheus text format's content type as
// kube-proxy's metrics server (client_golang's handler) sends it when the
// scraper asks for text: with the escaping of metric names, underscores
// (every name sluice writes is a legacy name already).
const textContentType = "text/plain; version=" + expfmt.TextVersion + "; charset=utf-8; escaping=underscores"

// NewMetrics registers every metric on a fresh registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		runtime:  prometheus.NewRegistry(),
		// Per IP family, as kube-proxy v1.34's, for the kernel modes that
		// sync each family apart (iptables, nftables); "" for a plane
		// that applies a state whole (userspace, IPVS).
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kubeproxy", Name: "sync_proxy_rules_duration_seconds",
			Help:    "How long applying a new state to the data plane took, per IP family where the mode syncs each apart.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"ip_family"}),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time a state was applied, per IP family where the mode syncs each apart."}, []string{"ip_family"}),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a change was queued, per IP family where the mode syncs each apart."}, []string{"ip_family"}),
		families: []string{""},
		// kube-proxy's change trackers' counts: every Service and
		// EndpointSlice event from the API, and the services with a change
		// not yet taken into a build.
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_service_changes_total",
			Help: "Service events received from the API (adds, updates, deletes)."}),
		servicePending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_service_changes_pending",
			Help: "Services changed since the last build of the state."}),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "EndpointSlice events received from the API (adds, updates, deletes)."}),
		endpointPending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Services whose EndpointSlices changed since the last build of the state."}),
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "proxy_healthz_total",
			Help: "/healthz responses by code."}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "proxy_livez_total",
			Help: "/livez responses by code."}, []string{"code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "rejected_updates_total",
			Help: "Updates refused because they were invalid, per offending object (\"Kind ns/name\"; empty when a file could not be decoded); the last good state kept serving."}, []string{"source", "object"}),
		// kube-proxy's per-family histograms of its kernel modes' syncs,
		// with its buckets (0.25 s to 300 s).
		fullSyncs: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kubeproxy", Name: "sync_full_proxy_rules_duration_seconds",
			Help: "How long a full sync of a kernel mode's rules took, per IP family.", Buckets: kubeProxySyncBuckets()}, []string{"ip_family"}),
		partialSyncs: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kubeproxy", Name: "sync_partial_proxy_rules_duration_seconds",
			Help: "How long a partial sync of a kernel mode's rules took, per IP family.", Buckets: kubeProxySyncBuckets()}, []string{"ip_family"}),
		noLocal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Service ports with a Local traffic policy and endpoints, but none on this node, per IP family and policy."}, []string{"ip_family", "traffic_policy"}),
		restoreFails: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_iptables_restore_failures_total",
			Help: "iptables-restore runs that failed, per IP family."}, []string{"ip_family"}),
		iptablesRules: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_iptables_total",
			Help: "Rules iptables mode has in the kernel after its last sync, per table and IP family."}, []string{"table", "ip_family"}),
		iptablesLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_iptables_last",
			Help: "Rules iptables mode wrote in its last sync, per table and IP family."}, []string{"table", "ip_family"}),
		nftFails: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_nftables_sync_failures_total",
			Help: "nftables mode transactions that failed, per IP family."}, []string{"ip_family"}),
		// kube-proxy deletes stale chains in a transaction of their own and
		// counts its failures here; sluice deletes them in the sync's own
		// transaction, so its failure is a sync failure and this stays 0.
		nftCleanupFails: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_nftables_cleanup_failures_total",
			Help: "nftables mode stale-chain clean-ups that failed, per IP family (sluice deletes stale chains in the sync's own transaction: always 0)."}, []string{"ip_family"}),
		// kube-proxy's SLI: from the EndpointSlice controller's
		// last-change-trigger-time to the change in the data plane.
		programming: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kubeproxy", Name: "network_programming_duration_seconds",
			Help:    "From a pod change (its EndpointSlice's last-change-trigger-time) to the data plane programmed for it, per IP family.",
			Buckets: kubeProxySyncBuckets()}, []string{"ip_family"}),
		updateApply: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "sluice", Name: "update_apply_seconds",
			Help:    "sluice's own share of an update: from a change reaching it (an API event; a --manifests reload, after its coalescing wait) to the data plane having it (the health-check ports' sync and the log after it are not counted, as kube-proxy does not count them in its network programming latency).",
			Buckets: ownShareBuckets()}),
		ctDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kubeproxy", Name: "conntrack_reconciler_sync_duration_seconds",
			Help: "How long one clean-up of stale conntrack entries after a kernel mode's sync took, per IP family.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}, []string{"ip_family"}),
		ctDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "conntrack_reconciler_deleted_entries_total",
			Help: "Stale conntrack entries deleted after kernel mode syncs, per IP family."}, []string{"ip_family"}),
		sctpSkipped: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Name: "sctp_ports_skipped",
			Help: "SCTP service ports not served because this kernel has no SCTP (userspace mode)."}),
		partialFails: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
			Help: "Partial iptables-restore runs that failed (the next sync is full), per IP family."}, []string{"ip_family"}),
		listenerErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "listener_errors_total",
			Help: "Listeners that could not be opened (e.g. port in use)."}),
		ports: newPortMetrics(),
	}
	m.Registry.MustRegister(m.syncDuration, m.lastSync, m.lastQueued, m.serviceChanges, m.servicePending, m.endpointChanges, m.endpointPending, m.healthz, m.livez,
		m.rejected, m.listenerErrors, m.restoreFails, m.partialFails, m.iptablesRules, m.iptablesLast, m.nftFails, m.nftCleanupFails, m.ctDuration, m.ctDeleted, m.programming, m.updateApply, m.fullSyncs, m.partialSyncs, m.noLocal, m.sctpSkipped)
	m.runtime.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.slis = prometheus.NewRegistry()
	m.healthcheck = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubernetes", Name: "healthcheck",
		Help: "[STABLE] This metric records the result of a single healthcheck."}, []string{"name", "type"})
	m.healthchecks = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubernetes", Name: "healthchecks_total",
		Help: "[STABLE] This metric records the results of all healthcheck."}, []string{"name", "status", "type"})
	m.slis.MustRegister(m.healthcheck, m.healthchecks)
	return m
}

// Synced records one applied state and how long applying it took; a
// plane whose families sync apart records their durations through
// FamilySynced instead (wholeSync false).
func (m *Metrics) Synced(took time.Duration, at time.Time, wholeSync bool) {
	if wholeSync {
		m.syncDuration.WithLabelValues("").Observe(took.Seconds())
		m.lastSync.WithLabelValues("").Set(float64(at.UnixNano()) / 1e9)
	}
}

// servedFamilies are the IP families the proxy serves, for /healthz's
// status: those SetFamilies named, or both for a plane that applies a
// state whole (userspace mode serves both).
func (m *Metrics) servedFamilies() []string {
	var out []string
	for _, f := range m.families {
		if f != "" {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return []string{"IPv4", "IPv6"}
	}
	return out
}

// SyncedFamilies are the IP families a kernel mode syncs apart
// (SetFamilies), none for a plane that applies a state whole.
func (m *Metrics) SyncedFamilies() []string { return m.families }

// SetFamilies names the IP families a kernel mode syncs apart ("IPv4",
// "IPv6"): a queued change is stamped for each, as kube-proxy's
// per-family proxiers stamp it. A plane that applies a state whole needs
// none (its family label is "").
//
// The full and partial sync histograms of those families are created
// empty: kube-proxy's appear only after the first sync of each kind, so a
// dashboard (or a comparison with kube-proxy) saw the partial one come and
// go with the timing of the first change.
func (m *Metrics) SetFamilies(families ...string) {
	m.families = families
	for _, f := range families {
		m.fullSyncs.WithLabelValues(f)
		m.partialSyncs.WithLabelValues(f)
	}
}

// Queued records that a change is waiting.
func (m *Metrics) Queued(at time.Time) {
	for _, f := range m.families {
		m.lastQueued.WithLabelValues(f).Set(float64(at.UnixNano()) / 1e9)
	}
}

// ServiceChanged counts one Service event; pending is how many Services
// have a change not yet taken into a build.
func (m *Metrics) ServiceChanged(pending int) {
	m.serviceChanges.Inc()
	m.servicePending.Set(float64(pending))
}

// EndpointsChanged counts one EndpointSlice event; pending is how many
// Services have slices changed since the last build.
func (m *Metrics) EndpointsChanged(pending int) {
	m.endpointChanges.Inc()
	m.endpointPending.Set(float64(pending))
}

// ChangesTaken says a build took every pending change (kube-proxy's
// checkout of its change trackers).
func (m *Metrics) ChangesTaken() {
	m.servicePending.Set(0)
	m.endpointPending.Set(0)
}

// Rejected counts an invalid update from source, once for each object
// named in its errors (or once with an empty object when none is named).
func (m *Metrics) Rejected(source string, objects []string) {
	if len(objects) == 0 {
		objects = []string{""}
	}
	for _, o := range objects {
		m.rejected.WithLabelValues(source, o).Inc()
	}
}

// ListenerError counts a listener that could not be opened.
func (m *Metrics) ListenerError() { m.listenerErrors.Inc() }

// ownShareBuckets are sluice_update_apply_seconds' bounds: doubling from
// 0.1 ms, with 1 ms among them, issue 16's target for the p99 at 10k
// Services. Without it a p99 past 0.8 ms read only as at most 1.6.
func ownShareBuckets() []float64 {
	b := prometheus.ExponentialBuckets(0.0001, 2, 18)
	i, _ := slices.BinarySearch(b, 0.001)
	return slices.Insert(b, i, 0.001)
}

// kubeProxySyncBuckets are kube-proxy's: 0.25, 0.5, 1..59 s by 1, 60..115
// by 5, 120..300 by 30.
func kubeProxySyncBuckets() []float64 {
	b := []float64{0.25, 0.5}
	for s := 1.0; s < 60; s++ {
		b = append(b, s)
	}
	for s := 60.0; s < 120; s += 5 {
		b = append(b, s)
	}
	for s := 120.0; s <= 300; s += 30 {
		b = append(b, s)
	}
	return b
}

// FamilySynced records one kernel-mode sync of one IP family ("IPv4",
// "IPv6"), full or partial, as kube-proxy's
// sync_full_/sync_partial_proxy_rules_duration_seconds.
func (m *Metrics) FamilySynced(family string, full bool, took time.Duration) {
	m.syncDuration.WithLabelValues(family).Observe(took.Seconds())
	m.lastSync.WithLabelValues(family).SetToCurrentTime()
	if full {
		m.fullSyncs.WithLabelValues(family).Observe(took.Seconds())
	} else {
		m.partialSyncs.WithLabelValues(family).Observe(took.Seconds())
	}
}

// NoLocalEndpoints sets kube-proxy's count of service ports whose Local
// policy finds no endpoint on this node (their traffic from outside is
// dropped), for one IP family.
func (m *Metrics) NoLocalEndpoints(family string, internal, external int) {
	m.noLocal.WithLabelValues(family, "internal").Set(float64(internal))
	m.noLocal.WithLabelValues(family, "external").Set(float64(external))
}

// RestoreFailed counts a failed iptables-restore of one IP family, and a
// failed partial one separately as well, as kube-proxy does.
func (m *Metrics) RestoreFailed(family string, partial bool) {
	m.restoreFails.WithLabelValues(family).Inc()
	if partial {
		m.partialFails.WithLabelValues(family).Inc()
	}
}

// IPTablesRules sets kube-proxy's rule counts after one family's sync:
// the filter table's rules (always all written), the nat rules written
// and the nat rules in the kernel (those written and those of unchanged
// chains a partial sync left alone).
func (m *Metrics) IPTablesRules(family string, filter, natWritten, natTotal int) {
	m.iptablesRules.WithLabelValues("filter", family).Set(float64(filter))
	m.iptablesLast.WithLabelValues("filter", family).Set(float64(filter))
	m.iptablesRules.WithLabelValues("nat", family).Set(float64(natTotal))
	m.iptablesLast.WithLabelValues("nat", family).Set(float64(natWritten))
}

// NetworkProgrammed records how long after a pod change (its
// EndpointSlice's trigger time) the data plane was programmed for it.
func (m *Metrics) NetworkProgrammed(family string, took time.Duration) {
	m.programming.WithLabelValues(family).Observe(took.Seconds())
}

// UpdateApplied records sluice's own share of an update: from its
// arrival to the data plane having it.
func (m *Metrics) UpdateApplied(took time.Duration) { m.updateApply.Observe(took.Seconds()) }

// NFTablesSyncFailed counts a failed nftables transaction of one family.
func (m *Metrics) NFTablesSyncFailed(family string) { m.nftFails.WithLabelValues(family).Inc() }

// NFTablesCleanupFailed counts a failed deletion of one family's stale
// nftables chains.
func (m *Metrics) NFTablesCleanupFailed(family string) {
	m.nftCleanupFails.WithLabelValues(family).Inc()
}

// NFTablesFamilies makes the nftables failure counters exist at 0 for
// each family (a dashboard's rate() needs the series before a failure).
func (m *Metrics) NFTablesFamilies(families ...string) {
	for _, f := range families {
		m.nftFails.WithLabelValues(f)
		m.nftCleanupFails.WithLabelValues(f)
	}
}

// ConntrackReconciled records one clean-up of stale conntrack entries
// after a kernel mode's sync of one family.
func (m *Metrics) ConntrackReconciled(family string, took time.Duration, deleted int) {
	m.ctDuration.WithLabelValues(family).Observe(took.Seconds())
	m.ctDeleted.WithLabelValues(family).Add(float64(deleted))
}

// NFAcctCounter exports one of kube-proxy's nfacct-backed packet counters
// of iptables mode (kubeproxy_iptables_ct_state_invalid_dropped_packets_total,
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total), read
// from the kernel at each scrape; a failed read is left out of that scrape.
func (m *Metrics) NFAcctCounter(name, help string, read func() (uint64, error)) {
	m.Registry.MustRegister(readCounter{desc: prometheus.NewDesc(name, help, nil, nil), read: read})
}

// readCounter is a counter whose value the kernel keeps.
type readCounter struct {
	desc *prometheus.Desc
	read func() (uint64, error)
}

func (c readCounter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c readCounter) Collect(ch chan<- prometheus.Metric) {
	if n, err := c.read(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n))
	}
}

// EventLoopRings exports the event loop engine's io_uring state, read at
// each scrape: sluice_eventloop_io_uring_loops, the loops batching their
// reads and writes on a ring (0 when the kernel or a seccomp profile
// refused io_uring, or --io-uring=false),
// sluice_eventloop_io_uring_failures_total, the rings given up since
// start-up after an io_uring_enter failed (each took its batch's
// connections down, and left its loop on plain syscalls); and
// sluice_eventloop_io_uring_ops_total, the reads and writes made in
// batches on the rings.
func (m *Metrics) EventLoopRings(loops func() int, failures func() int64, ops func() uint64) {
	m.Registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_eventloop_io_uring_ops_total",
			Help: "Socket reads and writes the event loops made in batches on their io_urings (a turn's lone read or write is a plain syscall)."},
			func() float64 { return float64(ops()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_eventloop_io_uring_loops",
			Help: "Event loops batching their socket reads and writes on an io_uring; the others make a syscall per read and write."},
			func() float64 { return float64(loops()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_eventloop_io_uring_failures_total",
			Help: "Event loops' io_urings given up after an io_uring_enter failed; the connections of that batch were reset."},
			func() float64 { return float64(failures()) }))
}

// EventLoops exports how many event loops the engine runs
// (sluice_eventloop_loops) and, when the cgroup's CPU limit sized them,
// that limit (sluice_cpu_limit_cores), for `sluice status` and dashboards.
func (m *Metrics) EventLoops(loops int, cpuLimit float64) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_eventloop_loops",
		Help: "Event loops (threads) serving connections: one per CPU unless --event-loops says otherwise, and no more than the cgroup CPU limit rounded up."})
	g.Set(float64(loops))
	m.Registry.MustRegister(g)
	if cpuLimit > 0 {
		l := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_cpu_limit_cores",
			Help: "The cgroup CPU limit (quota over period) read at start-up, which bounds the default number of event loops."})
		l.Set(cpuLimit)
		m.Registry.MustRegister(l)
	}
}

// SCTPSkipped sets how many SCTP service ports are not served.
func (m *Metrics) SCTPSkipped(n int) { m.sctpSkipped.Set(float64(n)) }

func codeLabel(code int) string { return strconv.Itoa(code) }

// WriteText writes every metric in the Prometheus text format (0.0.4):
// the registry's families as promhttp writes them, then the per-port
// data-path families.
func (m *Metrics) WriteText(w io.Writer) error {
	mfs, err := prometheus.Gatherers{m.Registry, m.runtime}.Gather()
	if err != nil {
		return err
	}
	return m.writeText(w, mfs, nil)
}

// writeText writes mfs and the per-port families, those of them named in
// only when it is not empty.
func (m *Metrics) writeText(w io.Writer, mfs []*dto.MetricFamily, only map[string]bool) error {
	size := 64 << 10
	if len(only) > 0 {
		size = 4 << 10 // a few families: the 64 KiB a whole scrape streams through is most of such a scrape's garbage
	}
	bw := bufio.NewWriterSize(w, size)
	for _, mf := range mfs {
		if len(only) > 0 && !only[mf.GetName()] {
			continue
		}
		if _, err := expfmt.MetricFamilyToText(bw, mf); err != nil {
			return err
		}
	}
	m.ports.writeText(bw, only)
	return bw.Flush()
}

// ServeHTTP serves /metrics: WriteText, streamed, gzipped at the fastest
// level (10k service ports are 25 MB of text) when the scraper accepts
// it, as Prometheus does. The text format is one every scraper accepts;
// promhttp's content negotiation is not needed, since the per-port
// families are written only as text.
//
// With name[] parameters (/metrics?name[]=kubeproxy_sync_proxy_rules_last_timestamp_seconds)
// only the families so named are written: a check of the sync's health
// at 10k service ports then neither lists nor formats the ports' series,
// nor reads the runtime's and /proc's figures unless one of theirs is
// named. A name no family has writes nothing, as a family with no sample
// yet does.
func (m *Metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	names := r.URL.Query()["name[]"]
	var (
		mfs  []*dto.MetricFamily
		only map[string]bool
		err  error
	)
	if len(names) == 0 {
		mfs, err = prometheus.Gatherers{m.Registry, m.runtime}.Gather()
	} else {
		mfs, only, err = m.gatherNamed(names)
	}
	if err != nil {
		http.Error(w, "error gathering metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	m.setProcessStart(w)
	w.Header().Set("Content-Type", textContentType)
	var out io.Writer = w
	// A scrape by name of none of the ports' families is a few lines:
	// not worth a compressor's state, about a megabyte at the fastest
	// level.
	if acceptsGzip(r.Header.Get("Accept-Encoding")) && (len(only) == 0 || m.ports.names(only)) {
		w.Header().Set("Content-Encoding", "gzip")
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		defer gz.Close()
		out = gz
	}
	m.writeText(out, mfs, only) // an error here is the scraper gone
}

// gatherNamed gathers what a scrape by name needs: sluice's own registry,
// and the Go and process collectors only when a name is not found before
// them.
func (m *Metrics) gatherNamed(names []string) ([]*dto.MetricFamily, map[string]bool, error) {
	mfs, err := m.Registry.Gather()
	if err != nil {
		return nil, nil, err
	}
	known := m.ports.familyNames()
	for _, mf := range mfs {
		known[mf.GetName()] = true
	}
	only := make(map[string]bool, len(names))
	for _, n := range names {
		only[n] = true
	}
	for n := range only {
		if !known[n] {
			rt, err := m.runtime.Gather()
			if err != nil {
				return nil, nil, err
			}
			mfs = append(mfs, rt...)
			slices.SortFunc(mfs, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
			break
		}
	}
	return mfs, only, nil
}

// acceptsGzip reports whether an Accept-Encoding header allows gzip.
func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.TrimSpace(enc) == "gzip" {
			q, ok := strings.CutPrefix(strings.TrimSpace(params), "q=")
			return !ok || strings.TrimSpace(q) != "0"
		}
	}
	return false
}

// observeHealthcheck records a passed run of the health check name of
// the endpoint typ ("healthz") for /metrics/slis. (The metrics server's one
// check, "ping", as kube-proxy's, always passes.)
func (m *Metrics) observeHealthcheck(name, typ string) {
	m.healthcheck.WithLabelValues(name, typ).Set(1)
	m.healthchecks.WithLabelValues(name, "success", typ).Inc()
}

// serveSLIs is /metrics/slis: the health checks' SLIs and the process's
// start time, as kube-proxy's.
// setProcessStart sets the Process-Start-Time-Unix header.
func (m *Metrics) setProcessStart(w http.ResponseWriter) {
	if !m.ProcessStart.IsZero() {
		w.Header().Set("Process-Start-Time-Unix", strconv.FormatInt(m.ProcessStart.Unix(), 10))
	}
}

func (m *Metrics) serveSLIs(w http.ResponseWriter, _ *http.Request) {
	mfs, err := m.slis.Gather()
	if err != nil {
		http.Error(w, "error gathering metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if runtime, err := m.runtime.Gather(); err == nil {
		for _, mf := range runtime {
			if mf.GetName() == "process_start_time_seconds" {
				mfs = append(mfs, mf)
			}
		}
	}
	m.setProcessStart(w)
	w.Header().Set("Content-Type", textContentType)
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return // the scraper is gone
		}
	}
}
