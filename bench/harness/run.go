//go:build linux

package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Options configure one harness run.
type Options struct {
	Mode   string
	Dir    string // results directory for this run
	Rounds int    // measured rounds; one warm-up round comes first unless NoWarmup
	// TargetRounds, when more than Rounds, runs the workloads the targets
	// judge, of the systems they compare (inRound), for that many rounds:
	// each run is short, and the targets are judged on per-round ratios
	// and medians, which three rounds on a shared box leave swinging.
	TargetRounds int
	// NoWarmup skips the warm-up round (smoke mode).
	NoWarmup bool
	// LBCPU pins every load balancer to this CPU (-1: no pinning).
	LBCPU  int
	Config Config
	Log    io.Writer
	// Only, when non-empty, restricts the systems by name.
	Only map[string]bool
	// OnlyWorkloads, when non-empty, restricts the workloads by name.
	OnlyWorkloads map[string]bool
	// APIServices overrides the mode's APIChurn when positive.
	APIServices int
	// APIEndpoints overrides the mode's APIEndpoints when positive.
	APIEndpoints int
	// Topology is where clients, load balancers and backends live
	// (Loopback when nil).
	Topology *Topology
	// Note is a sentence for the report's head (e.g. where it ran).
	Note string
}

// Run is one workload on one system in one round.
type Run struct {
	Round      int     `json:"round"`
	Warmup     bool    `json:"warmup"`
	System     string  `json:"system"`
	Workload   string  `json:"workload"`
	Metrics    Metrics `json:"metrics,omitempty"`
	CPUSeconds float64 `json:"lb_cpu_seconds"`
	// HostCPUSeconds is the machine's busy CPU time during the run (every
	// process and the kernel's packet processing).
	HostCPUSeconds float64 `json:"host_cpu_seconds"`
	PeakRSS        int64   `json:"lb_peak_rss_bytes"`
	Err            string  `json:"error,omitempty"`
	// Note says why a run that has metrics measured less than it set out
	// to (see stoppedShort).
	Note string `json:"note,omitempty"`
	NA   bool   `json:"not_applicable,omitempty"`
}

// Execute runs every workload on every system, in shuffled interleaved
// rounds, and returns all runs. Systems that fail to start are errors.
func Execute(ctx context.Context, o Options) ([]Run, []System, error) {
	size, ok := Modes[o.Mode]
	if !ok {
		return nil, nil, fmt.Errorf("unknown mode %q", o.Mode)
	}
	if o.APIServices > 0 {
		size.APIChurn = o.APIServices
	}
	if o.APIEndpoints > 0 {
		size.APIEndpoints = o.APIEndpoints
	}
	topo := o.Topology
	if topo == nil {
		topo = Loopback()
	}
	b, err := StartBackends(topo)
	if err != nil {
		return nil, nil, fmt.Errorf("backends: %w", err)
	}
	defer b.Close()
	services := []Service{
		{Name: "echo", Backends: b.Echo},
		{Name: "http", Backends: b.HTTP},
		{Name: "udp", UDP: true, Backends: b.UDP},
		{Name: "push", Backends: b.Push},
		{Name: "halfclose", Backends: b.HalfClose},
		{Name: "iperf", Backends: b.Iperf},
		{Name: "affinity", Affinity: true, Backends: b.HTTP},
		{Name: "retry", Backends: []netip.AddrPort{b.Refusing, b.Blackhole, b.Echo[0]}},
	}
	for i := range services {
		services[i].ClusterIP = netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})
	}
	var systems []System
	var instances []*Instance
	shared := &sharedBeds{}
	defer func() {
		for _, in := range instances {
			in.Stop()
		}
		shared.close()
	}()
	for _, sys := range Systems(o.Config, topo) {
		if len(o.Only) > 0 && !o.Only[sys.Name()] || len(o.Only) == 0 && OptIn(sys.Name()) {
			continue
		}
		in, err := Launch(sys, topo, filepath.Join(o.Dir, "systems", sys.Name()), services, Place{CPU: o.LBCPU})
		if err != nil {
			return nil, nil, fmt.Errorf("start %s: %w", sys.Name(), err)
		}
		in.shared = shared
		systems = append(systems, sys)
		instances = append(instances, in)
	}
	var workloads []Workload
	for _, w := range Workloads() {
		if len(o.OnlyWorkloads) == 0 || o.OnlyWorkloads[w.Name] {
			workloads = append(workloads, w)
		}
	}
	type pair struct {
		in *Instance
		w  Workload
	}
	var runs []Run
	first := 1
	if o.NoWarmup {
		first = 0
	}
	for round := 1 - first; round <= max(o.Rounds, o.TargetRounds); round++ {
		var pairs []pair
		for _, in := range instances {
			for _, w := range workloads {
				if inRound(round, o.Rounds, in.System.Name(), w.Name) {
					pairs = append(pairs, pair{in, w})
				}
			}
		}
		rand.Shuffle(len(pairs), func(i, j int) { pairs[i], pairs[j] = pairs[j], pairs[i] })
		for _, p := range pairs {
			if ctx.Err() != nil {
				return runs, systems, ctx.Err()
			}
			if round == 0 && !warms(p.w.Name) {
				continue
			}
			r := Run{Round: round, Warmup: round == 0, System: p.in.System.Name(), Workload: p.w.Name}
			if _, ok := p.in.Services[p.w.Needs]; !ok {
				r.NA = true
				runs = append(runs, r)
				continue
			}
			for _, in := range instances {
				if Spins(in.System.Name()) && in.Proc != nil {
					if in == p.in {
						in.Proc.Resume()
					} else {
						in.Proc.Pause()
					}
				}
			}
			u0, h0, t0 := p.in.Usage(), HostBusySeconds(), time.Now()
			wctx, cancel := context.WithTimeout(ctx, runLimit(p.w.Name))
			m, err := p.w.Run(wctx, p.in, size)
			cancel()
			u1, h1 := p.in.Usage(), HostBusySeconds()
			r.Metrics, r.CPUSeconds, r.PeakRSS, r.HostCPUSeconds = m, u1.CPUSeconds-u0.CPUSeconds, u1.PeakRSS, h1-h0
			if own, ok := m[ownCPUKey]; ok {
				r.CPUSeconds = own
				delete(m, ownCPUKey)
			}
			switch {
			case errors.Is(err, errNotApplicable):
				r.NA, r.Metrics = true, nil
			case errors.As(err, new(stoppedShort)):
				r.Note = err.Error()
			case err != nil:
				r.Err = err.Error()
			}
			if exited, perr := p.in.Proc.ExitedOrNil(); exited {
				return runs, systems, fmt.Errorf("%s exited during %s: %v\n%s", r.System, r.Workload, perr, p.in.Proc.Output())
			}
			if o.Log != nil {
				fmt.Fprintf(o.Log, "round %d  %-15s %-17s %s (%s)\n", round, r.System, r.Workload, r.short(), time.Since(t0).Round(10*time.Millisecond))
			}
			runs = append(runs, r)
		}
	}
	return runs, systems, nil
}

// inRound reports whether a round runs workload on system: every round
// up to rounds does; a round past it (Options.TargetRounds) runs only
// the workloads the targets table judges, and of those only the systems
// it compares: the event loop engine (and its before/after variants)
// against HAProxy and nginx, the peers besides for TCP RR, whose targets
// are against the best of them, the C floor in the cost workloads, and
// HAProxy with splice (alone) in the bulk TCP ones.
func inRound(round, rounds int, system, workload string) bool {
	if round <= rounds {
		return true
	}
	eventLoop := strings.HasPrefix(system, "sluice-eventloop")
	switch {
	case strings.HasPrefix(workload, "cost-tcp-bulk"):
		// Bulk TCP's peer is HAProxy with splice, as in the iperf3 target.
		return eventLoop || system == "haproxy-splice"
	case strings.HasPrefix(workload, "cost-"):
		return eventLoop || strings.HasPrefix(system, "floor-c") || system == "haproxy" || system == "nginx"
	case workload == "tcp-rr":
		return eventLoop || system == "haproxy" || system == "haproxy-splice" || system == "nginx" || system == "naive-go"
	case throughputTarget(workload):
		return eventLoop || system == "haproxy" || system == "nginx"
	}
	return false
}

// throughputTarget reports whether workload has a ratio target against
// HAProxy or nginx in the targets table (report.go).
func throughputTarget(workload string) bool {
	switch workload {
	case "http-keepalive", "conn-per-request", "capped-keepalive", "capped-crr", "udp-rr", "udp-flows":
		return true
	}
	return false
}

// runLimit is how long one run of a workload may take: the first API
// churn run loads the API server (10k services take minutes here).
func runLimit(workload string) time.Duration {
	switch workload {
	case "churn-api", "idle-conns":
		// idle-conns is bounded by its count: 10k handshakes through a
		// proxy under emulation (sluice-bench vm) take over 2 minutes.
		return 10 * time.Minute
	}
	return 2 * time.Minute
}

// warms reports whether the warm-up round runs a workload: the data-path
// ones, whose caches, pools and CPU frequency a first run settles. The
// others (memory, retry, churn, correctness) would only cost time.
func warms(workload string) bool {
	switch workload {
	case "tcp-rr", "http-keepalive", "conn-per-request", "iperf3-up", "iperf3-down", "udp-rr", "udp-paced", "udp-flows":
		return true
	}
	return false
}

func (r Run) short() string {
	switch {
	case r.NA:
		return "n/a"
	case r.Err != "":
		return "error: " + r.Err
	}
	keys := make([]string, 0, len(r.Metrics))
	for k := range r.Metrics {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("%s=%.4g ", k, r.Metrics[k])
	}
	s += fmt.Sprintf("cpu=%.2fs", r.CPUSeconds)
	if r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}

// ExitedOrNil is Exited for a possibly nil Proc (direct has none).
func (p *Proc) ExitedOrNil() (bool, error) {
	if p == nil {
		return false, nil
	}
	return p.Exited()
}
