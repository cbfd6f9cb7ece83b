package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/spf13/pflag"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/controlplane"
	"github.com/sluice-proxy/sluice/listeners"
)

// statusUsage is `sluice status --help`.
const statusUsage = `Usage: sluice status [--metrics-bind-address=HOST:PORT] [-o json] [--watch[=2s]] [--rate-interval=1s]

Asks a running sluice (its metrics server, 127.0.0.1:10249 unless it was
started with another --metrics-bind-address) what it serves, as ipvsadm -Ln
or HAProxy's stats page answer: its node's zone, and whether the node is
eligible for traffic; in userspace mode each service port with its
frontends, every endpoint with its condition (ready, terminating,
not-ready), whether it takes traffic and why not, ejection with the time
left and the clients ClientIP affinity pins to it, open and total
connections, retries, failed connects and refused clients, with connection
and error rates per second (measured over --rate-interval, or between
--watch prints); in the kernel modes the mode, its families and its syncs. -o json prints it as
data; --watch prints it again every interval until interrupted.
`

// runStatus is `sluice status`; it returns the exit code. ctx ends a
// --watch.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("status", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("metrics-bind-address", "127.0.0.1:10249", "the running sluice's --metrics-bind-address")
	asJSON := fs.Bool("json", false, "print what the server answered, as JSON (as -o json)")
	output := fs.StringP("output", "o", "", "json: print what the server answered, as JSON")
	watch := fs.Duration("watch", 0, "print again every interval (e.g. 2s) until interrupted")
	fs.Lookup("watch").NoOptDefVal = "2s"
	rateInterval := fs.Duration("rate-interval", time.Second, "the connection and error rates are measured over this long (two samples); 0: no rates")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, statusUsage)
			return 0
		}
		fmt.Fprintf(stderr, "sluice status: %v\n%s", err, statusUsage)
		return 2
	}
	host := *addr
	if strings.HasPrefix(host, "0.0.0.0:") || strings.HasPrefix(host, ":") {
		host = "127.0.0.1:" + host[strings.LastIndex(host, ":")+1:]
	} else if strings.HasPrefix(host, "[::]:") {
		host = "[::1]:" + host[len("[::]:"):]
	}
	switch *output {
	case "":
	case "json":
		*asJSON = true
	default:
		fmt.Fprintf(stderr, "sluice status: -o %q: want json\n", *output)
		return 2
	}
	if *watch < 0 {
		fmt.Fprintf(stderr, "sluice status: --watch %v: want a positive interval\n", *watch)
		return 2
	}
	if *rateInterval < 0 {
		fmt.Fprintf(stderr, "sluice status: --rate-interval %v: want 0 (no rates) or more\n", *rateInterval)
		return 2
	}
	client := &http.Client{Timeout: 5 * time.Second}
	var prev *instanceStatus
	var prevAt time.Time
	for {
		if prev == nil && *rateInterval > 0 {
			// A first sample for the rates, as vmstat 1 2 takes one.
			first, err := fetchStatus(client, "http://"+host)
			if err != nil {
				fmt.Fprintf(stderr, "sluice status: %v\n", err)
				return 1
			}
			prev, prevAt = first, time.Now()
			select {
			case <-ctx.Done():
				return 0
			case <-time.After(*rateInterval):
			}
		}
		st, err := fetchStatus(client, "http://"+host)
		if err != nil {
			fmt.Fprintf(stderr, "sluice status: %v\n", err)
			return 1
		}
		now := time.Now()
		st.withRates(prev, now.Sub(prevAt))
		prev, prevAt = st, now
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			enc.Encode(st)
		} else {
			st.print(stdout, time.Now())
		}
		if *watch == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*watch):
			fmt.Fprintln(stdout)
		}
	}
}

// instanceStatus is what one sluice answered.
type instanceStatus struct {
	Address string `json:"address"`
	Mode    string `json:"mode"`
	// Node is what sluice knows of its node's Node object: the zone its
	// topology hints are read for, and whether it may take traffic
	// (absent from a sluice that does not say).
	Node *admin.NodeView `json:"node,omitempty"`
	// Ports is the userspace mode's view, with each port's counters.
	Ports []portStatus `json:"ports,omitempty"`
	// Plane is a kernel mode's own summary.
	Plane map[string]any `json:"plane,omitempty"`
	// LastSync is the newest sync time per IP family ("" for a mode that
	// applies a state whole).
	LastSync map[string]time.Time `json:"lastSync"`
	// EventLoops is the event loop engine's loop count and the CPU limit
	// that sized it (absent with the goroutine engine and in the kernel
	// modes).
	EventLoops *eventLoopStatus `json:"eventLoops,omitempty"`
	// IOUring is the event loop engine's io_uring state (absent with the
	// goroutine engine and in the kernel modes).
	IOUring *ioUringStatus `json:"ioUring,omitempty"`
}

// eventLoopStatus is how many event loops serve, and the cgroup CPU limit
// read at start-up when there is one.
type eventLoopStatus struct {
	Loops    float64 `json:"loops"`
	CPULimit float64 `json:"cpuLimit,omitempty"`
}

// ioUringStatus is how many event loops batch their reads and writes on
// an io_uring, and how many rings were given up since start-up.
type ioUringStatus struct {
	Loops    float64 `json:"loops"`
	Failures float64 `json:"failures"`
}

type portStatus struct {
	listeners.PortView
	Active      float64 `json:"active"`
	Connections float64 `json:"connections"`
	Retries     float64 `json:"retries"`
	Failures    float64 `json:"connectFailures"`
	Refused     float64 `json:"refused"`
	// Rates are per second over the last interval (two samples: the
	// previous --watch print, or --rate-interval apart); absent without one.
	ConnRate  *float64 `json:"connectionsPerSecond,omitempty"`
	ErrorRate *float64 `json:"errorsPerSecond,omitempty"`
}

// withRates sets st's per-second rates from an earlier sample prev taken
// dt before: new connections, and errors (failed connects and refused
// clients). A port absent from prev, or whose counters went down (a
// restarted sluice), gets none.
func (st *instanceStatus) withRates(prev *instanceStatus, dt time.Duration) {
	if prev == nil || dt <= 0 {
		return
	}
	type key struct{ svc, proto string }
	before := make(map[key]portStatus, len(prev.Ports))
	for _, p := range prev.Ports {
		before[key{p.Service, p.Protocol}] = p
	}
	for i := range st.Ports {
		p := &st.Ports[i]
		b, ok := before[key{p.Service, p.Protocol}]
		if !ok || p.Connections < b.Connections || p.Failures+p.Refused < b.Failures+b.Refused {
			continue
		}
		conn := (p.Connections - b.Connections) / dt.Seconds()
		errs := (p.Failures + p.Refused - b.Failures - b.Refused) / dt.Seconds()
		p.ConnRate, p.ErrorRate = &conn, &errs
	}
}

func fetchStatus(c *http.Client, base string) (*instanceStatus, error) {
	notFound := false
	get := func(path string) ([]byte, error) {
		resp, err := c.Get(base + path)
		if err != nil {
			return nil, fmt.Errorf("no sluice answers at %s (is it running, and with this --metrics-bind-address?): %w", base, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("%s%s: %w", base, path, err)
		}
		notFound = resp.StatusCode == http.StatusNotFound
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s%s: %s", base, path, resp.Status)
		}
		return body, nil
	}
	mode, err := get("/proxyMode")
	if err != nil {
		return nil, err
	}
	st := &instanceStatus{Address: base, Mode: strings.TrimSpace(string(mode)), LastSync: map[string]time.Time{}}
	page, err := get("/metrics")
	if err != nil {
		return nil, err
	}
	var parser expfmt.TextParser
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(page)))
	if err != nil {
		return nil, fmt.Errorf("%s/metrics: %w", base, err)
	}
	for _, m := range metricsOf(families, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
		sec, frac := math.Modf(m.GetGauge().GetValue())
		st.LastSync[label(m, "ip_family")] = time.Unix(int64(sec), int64(frac*1e9))
	}
	if loops := metricsOf(families, "sluice_eventloop_loops"); len(loops) == 1 {
		st.EventLoops = &eventLoopStatus{Loops: loops[0].GetGauge().GetValue()}
		if l := metricsOf(families, "sluice_cpu_limit_cores"); len(l) == 1 {
			st.EventLoops.CPULimit = l[0].GetGauge().GetValue()
		}
	}
	if loops := metricsOf(families, "sluice_eventloop_io_uring_loops"); len(loops) == 1 {
		st.IOUring = &ioUringStatus{Loops: loops[0].GetGauge().GetValue()}
		if f := metricsOf(families, "sluice_eventloop_io_uring_failures_total"); len(f) == 1 {
			st.IOUring.Failures = f[0].GetCounter().GetValue()
		}
	}
	dump, err := get("/debug/sluice")
	if err != nil {
		return nil, err
	}
	switch node, err := get("/debug/sluice/node"); {
	case err == nil:
		st.Node = new(admin.NodeView)
		if err := json.Unmarshal(node, st.Node); err != nil {
			return nil, fmt.Errorf("%s/debug/sluice/node: %w", base, err)
		}
	case !notFound: // an older sluice has no node view: none is shown
		return nil, err
	}
	if st.Mode != "userspace" {
		if err := json.Unmarshal(dump, &st.Plane); err != nil {
			return nil, fmt.Errorf("%s/debug/sluice: %w", base, err)
		}
		return st, nil
	}
	var views []listeners.PortView
	if err := json.Unmarshal(dump, &views); err != nil {
		return nil, fmt.Errorf("%s/debug/sluice: %w", base, err)
	}
	counter := func(name string, v listeners.PortView) float64 {
		for _, m := range metricsOf(families, name) {
			if label(m, "service") == v.Service && label(m, "protocol") == v.Protocol {
				if g := m.GetGauge(); g != nil {
					return g.GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
		return 0
	}
	for _, v := range views {
		st.Ports = append(st.Ports, portStatus{PortView: v,
			Active: counter("sluice_active_connections", v), Connections: counter("sluice_connections_total", v),
			Retries: counter("sluice_connect_retries_total", v), Failures: counter("sluice_connect_failures_total", v),
			Refused: counter("sluice_refused_total", v)})
	}
	return st, nil
}

func metricsOf(families map[string]*dto.MetricFamily, name string) []*dto.Metric {
	if f := families[name]; f != nil {
		return f.GetMetric()
	}
	return nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// print writes st as ipvsadm -Ln lays out its table: one line per service
// port, then one per frontend and endpoint.
func (st *instanceStatus) print(w io.Writer, now time.Time) {
	fmt.Fprintf(w, "sluice at %s, %s mode", strings.TrimPrefix(st.Address, "http://"), st.Mode)
	fams := make([]string, 0, len(st.LastSync))
	for f := range st.LastSync {
		fams = append(fams, f)
	}
	sort.Strings(fams)
	for _, f := range fams {
		name := f
		if name == "" {
			name = "state"
		}
		fmt.Fprintf(w, "; %s applied %s ago", name, now.Sub(st.LastSync[f]).Round(time.Second))
	}
	if len(fams) == 0 {
		fmt.Fprint(w, "; nothing applied yet")
	}
	fmt.Fprintln(w)
	if n := st.Node; n != nil {
		fmt.Fprintf(w, "node %s: ", n.Name)
		if n.Zone != "" {
			fmt.Fprintf(w, "zone %s", n.Zone)
		} else {
			fmt.Fprint(w, "no zone label (zone hints are not followed)")
		}
		if !n.Eligible {
			fmt.Fprint(w, "; not eligible for traffic: its Node is being deleted or tainted "+controlplane.TaintToBeDeleted+", and /healthz answers 503")
		}
		fmt.Fprintln(w)
	}
	if st.Mode != "userspace" {
		keys := make([]string, 0, len(st.Plane))
		for k := range st.Plane {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %s: %v\n", k, st.Plane[k])
		}
		fmt.Fprintln(w, "  (the rules themselves: iptables-save, nft list table ip kube-proxy, ipvsadm -Ln)")
		return
	}
	if l := st.EventLoops; l != nil {
		fmt.Fprintf(w, "event loops: %g", l.Loops)
		if l.CPULimit > 0 {
			fmt.Fprintf(w, " (the cgroup CPU limit, %g CPUs, rounded up, bounds them)", l.CPULimit)
		}
		fmt.Fprintln(w)
	}
	if r := st.IOUring; r != nil {
		switch {
		case r.Failures > 0:
			fmt.Fprintf(w, "io_uring: %g event loops batch on it; %g gave it up after a failed io_uring_enter (see the log)\n", r.Loops, r.Failures)
		case r.Loops == 0:
			fmt.Fprintln(w, "io_uring: off, a syscall per read and write (the start-up log says why)")
		default:
			fmt.Fprintf(w, "io_uring: %g event loops batch their reads and writes on it\n", r.Loops)
		}
	}
	fmt.Fprintf(w, "%d service ports\n", len(st.Ports))
	for _, p := range st.Ports {
		fmt.Fprintf(w, "%-4s %s", p.Protocol, p.Service)
		if p.Affinity != nil {
			fmt.Fprintf(w, " affinity ClientIP %s", *p.Affinity)
		}
		rate := func(r *float64) string {
			if r == nil {
				return ""
			}
			return fmt.Sprintf(" (%.1f/s)", *r)
		}
		errRate := ""
		if p.ErrorRate != nil {
			errRate = fmt.Sprintf(", errors %.1f/s", *p.ErrorRate)
		}
		fmt.Fprintf(w, "  active %g, connections %g%s, retried %g, failed connects %g, refused %g%s\n", p.Active, p.Connections,
			rate(p.ConnRate), p.Retries, p.Failures, p.Refused, errRate)
		for _, fe := range p.Frontends {
			fmt.Fprintf(w, "  <- %s\n", fe)
		}
		ejected := map[string]bool{}
		for _, e := range p.Ejected {
			ejected[e] = true
		}
		if len(p.Endpoints) == 0 {
			fmt.Fprintln(w, "  -> no usable endpoints: clients are refused")
		}
		for _, e := range p.States {
			fmt.Fprintf(w, "  -> %-24s %s\n", e.Addr, endpointLine(e, p.InternalLocal, ejected[e.Addr], p.EjectedLeft[e.Addr]))
		}
		if p.ExternalEndpoints != nil {
			fmt.Fprintf(w, "  external traffic (Local policy) -> %s\n", strings.Join(p.ExternalEndpoints, " "))
		}
	}
}

// endpointLine describes one endpoint: its condition, whether cluster
// traffic goes to it and why not, ejection, and the clients affinity pins
// to it. internalLocal is the port's internalTrafficPolicy Local.
func endpointLine(e listeners.EndpointState, internalLocal, ejected bool, left string) string {
	parts := []string{e.Condition}
	if e.Local {
		parts[0] += ", local"
	}
	switch {
	case e.InUse && e.Condition == "terminating":
		parts = append(parts, "in use (no endpoint is ready)")
	case !e.InUse && e.Condition == "terminating":
		parts = append(parts, "not used while endpoints are ready")
	case !e.InUse && e.Condition == "ready" && internalLocal && !e.Local:
		parts = append(parts, "not used (internal traffic policy Local, and it is on another node)")
	case !e.InUse && e.Condition == "ready" && e.OutOfTopology:
		parts = append(parts, "not used (its topology hints are for other zones or nodes)")
	case !e.InUse:
		parts = append(parts, "not used")
	}
	if ejected {
		parts = append(parts, "ejected (connects failed; probed again in "+left+")")
	}
	if e.Pinned > 0 {
		s := "s"
		if e.Pinned == 1 {
			s = ""
		}
		parts = append(parts, fmt.Sprintf("%d client%s pinned", e.Pinned, s))
	}
	return strings.Join(parts, "; ")
}
