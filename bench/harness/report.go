//go:build linux

package harness

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// Summary is the median of each metric per workload and system, over the
// measured (non-warm-up) rounds.
type Summary map[string]map[string]Metrics // workload -> system -> metric -> median

// Summarize computes medians; a system with only errors or n/a gets a nil entry.
func Summarize(runs []Run) Summary {
	vals := map[string]map[string]map[string][]float64{}
	s := Summary{}
	for _, r := range runs {
		if r.Warmup {
			continue
		}
		if s[r.Workload] == nil {
			s[r.Workload] = map[string]Metrics{}
			vals[r.Workload] = map[string]map[string][]float64{}
		}
		if _, ok := s[r.Workload][r.System]; !ok {
			s[r.Workload][r.System] = nil
			vals[r.Workload][r.System] = map[string][]float64{}
		}
		if r.NA || r.Err != "" {
			continue
		}
		for k, v := range r.Metrics {
			vals[r.Workload][r.System][k] = append(vals[r.Workload][r.System][k], v)
		}
		vals[r.Workload][r.System]["lb_cpu_s"] = append(vals[r.Workload][r.System]["lb_cpu_s"], r.CPUSeconds)
		vals[r.Workload][r.System]["host_cpu_s"] = append(vals[r.Workload][r.System]["host_cpu_s"], r.HostCPUSeconds)
		if r.PeakRSS > 0 {
			vals[r.Workload][r.System]["lb_peak_rss_MB"] = append(vals[r.Workload][r.System]["lb_peak_rss_MB"], float64(r.PeakRSS)/1e6)
		}
	}
	lower := map[string]bool{}
	for _, w := range Workloads() {
		lower[w.Name+"/"+w.Primary] = w.Lower
	}
	for w, bySys := range vals {
		for sys, byMetric := range bySys {
			if len(byMetric) == 0 {
				continue
			}
			m := Metrics{}
			for k, vs := range byMetric {
				sort.Float64s(vs)
				m[k] = sortedMedian(vs)
				if low, primary := lower[w+"/"+k]; primary {
					// The best round too: this box's noise is bimodal (a
					// sleeping vCPU costs ~100 us to wake), so the median
					// alone can hide what a system does when undisturbed.
					if low {
						m[k+" (best)"] = vs[0]
					} else {
						m[k+" (best)"] = vs[len(vs)-1]
					}
				}
			}
			s[w][sys] = m
		}
	}
	return s
}

// best returns the best value of metric among peer systems, and which.
func best(bySys map[string]Metrics, systems []System, metric string, lower bool) (float64, string) {
	v, who := math.NaN(), ""
	for _, sys := range systems {
		m := bySys[sys.Name()]
		if !sys.Peer() || m == nil {
			continue
		}
		x, ok := m[metric]
		if !ok {
			continue
		}
		if math.IsNaN(v) || (lower && x < v) || (!lower && x > v) {
			v, who = x, sys.Name()
		}
	}
	return v, who
}

// Paired is one system's metric against another's round by round: the
// median of the per-round ratios, their range, and how many rounds both
// measured. On a shared box the rounds drift minutes apart, so a ratio
// taken within each round moves less than the ratio of the two medians
// (bench/latest-engine-floor/).
type Paired struct {
	Median, Lo, Hi float64
	Rounds         int
}

// pairedRatio is sys's metric over other's in each measured round that
// has both; Rounds is 0 when none has.
func pairedRatio(runs []Run, workload, metric, sys, other string) Paired {
	in := func(name string) map[int]float64 {
		m := map[int]float64{}
		for _, r := range runs {
			if r.Warmup || r.NA || r.Err != "" || r.Workload != workload || r.System != name {
				continue
			}
			if v, ok := r.Metrics[metric]; ok {
				m[r.Round] = v
			}
		}
		return m
	}
	a, b := in(sys), in(other)
	var rs []float64
	for round, x := range a {
		if y, ok := b[round]; ok && y != 0 && !math.IsNaN(x) && !math.IsNaN(y) {
			rs = append(rs, x/y)
		}
	}
	if len(rs) == 0 {
		return Paired{Median: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	sort.Float64s(rs)
	return Paired{Median: sortedMedian(rs), Lo: rs[0], Hi: rs[len(rs)-1], Rounds: len(rs)}
}

// String is "0.87× (0.69-0.99, 7 rounds)", or "—" with no round.
func (p Paired) String() string {
	switch p.Rounds {
	case 0:
		return "—"
	case 1:
		return fmt.Sprintf("%.2f× (1 round)", p.Median)
	}
	return fmt.Sprintf("%.2f× (%.2f-%.2f, %d rounds)", p.Median, p.Lo, p.Hi, p.Rounds)
}

// figure is v as a table shows it: whole above 1000, else 4 digits.
func figure(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.4g", v)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// extraRoundWorkloads are the workloads that ran past the measured
// rounds (Options.TargetRounds), in the order they are reported, read
// from the runs themselves so that a re-rendered older record says what
// it ran.
func extraRoundWorkloads(rounds int, runs []Run) []string {
	ran := map[string]bool{}
	for _, r := range runs {
		if r.Round > rounds && !r.NA {
			ran[r.Workload] = true
		}
	}
	var out []string
	for _, w := range Workloads() {
		if ran[w.Name] {
			out = append(out, w.Name)
		}
	}
	return out
}

// backquoted joins names as Markdown code, with commas and a final "and".
func backquoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "`" + n + "`"
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}

// Write writes results.md, results.json, results.csv, plots and machine.txt.
func Write(dir string, o Options, runs []Run, systems []System, machine string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	sum := Summarize(runs)
	var md strings.Builder
	fmt.Fprintf(&md, "# sluice benchmark: %s mode\n\n", o.Mode)
	if o.Note != "" {
		fmt.Fprintf(&md, "%s\n\n", o.Note)
	}
	fmt.Fprintf(&md, "Medians of %d interleaved, shuffled rounds", o.Rounds)
	if !o.NoWarmup {
		md.WriteString(" after one warm-up round of the data-path workloads")
	}
	if extra := extraRoundWorkloads(o.Rounds, runs); len(extra) > 0 {
		fmt.Fprintf(&md, "; %s ran %d rounds for the systems the targets compare (the event loop against HAProxy and nginx, every peer in tcp-rr, the C floor when run), the later ones of those alone, since the targets are judged on per-round ratios and medians", backquoted(extra), max(o.TargetRounds, o.Rounds))
	}
	if o.Topology != nil && o.Topology.Netns() {
		md.WriteString(". Topology `netns`: the harness and its load generators in a client network namespace, every userspace load balancer in a node namespace (veth, routed), each kernel mode in a node namespace of its own, the backends in a backend namespace, so every system, direct included, crosses the same two veth hops. ")
		md.WriteString("LB CPU-seconds and RSS are of the load balancer's process group; for the kernel modes that is only the control plane (forwarding is softirq time in the kernel), so compare them on host CPU-seconds (the whole machine's busy time during the run: clients, backends and load balancer together). ")
	} else {
		md.WriteString(". Topology `loopback`: every system forwards to the same in-process loopback backends; LB CPU-seconds and RSS are of the load balancer's process group; host CPU-seconds are the whole machine's busy time during the run. ")
	}
	if o.LBCPU >= 0 {
		fmt.Fprintf(&md, "Load balancers were pinned to CPU %d and the harness (clients and backends) to the other CPU.\n\n", o.LBCPU)
	} else {
		md.WriteString("Nothing was pinned.\n\n")
	}
	md.WriteString("`(best)` columns give the best round of the primary metric; the rest are medians. ")
	md.WriteString("Ratios compare each system's primary metric with direct (no proxy) and with the best third-party peer (naive-go, haproxy, haproxy-splice, nginx); above 1× is better for higher-is-better metrics, below 1× for lower-is-better ones. ")
	md.WriteString("`vs best peer, per round` pairs each system with that peer within each round and gives the median of the rounds' ratios, their range and how many rounds: steadier than the ratio of medians on a shared box, and what the targets are judged on.\n\n")
	for _, w := range Workloads() {
		bySys := sum[w.Name]
		fmt.Fprintf(&md, "## %s\n\n%s. Primary metric: `%s` (%s is better).\n\n", w.Name, w.Desc, w.Primary, map[bool]string{true: "lower", false: "higher"}[w.Lower])
		metrics := map[string]bool{}
		for _, m := range bySys {
			for k := range m {
				if k != "lb_cpu_s" && k != "lb_peak_rss_MB" && k != "host_cpu_s" {
					metrics[k] = true
				}
			}
		}
		cols := sortedKeys(metrics)
		if len(cols) == 0 {
			md.WriteString("No system ran it in this mode.\n\n")
			continue
		}
		fmt.Fprintf(&md, "| system | %s | LB CPU s | host CPU s | LB peak RSS MB | vs direct | vs best peer | vs best peer, per round |\n|---|%s---|---|---|---|---|---|\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
		peer, peerName := best(bySys, systems, w.Primary, w.Lower)
		for _, sys := range systems {
			m, ran := bySys[sys.Name()]
			fmt.Fprintf(&md, "| %s |", sys.Name())
			if !ran || m == nil {
				status := "n/a"
				for _, r := range runs {
					if r.System == sys.Name() && r.Workload == w.Name && r.Err != "" {
						status = "error"
					}
				}
				fmt.Fprintf(&md, "%s — | — | — | — | — | — |\n", strings.Repeat(" "+status+" |", len(cols)))
				continue
			}
			for _, c := range cols {
				if v, ok := m[c]; ok {
					fmt.Fprintf(&md, " %.4g |", v)
				} else {
					md.WriteString(" — |")
				}
			}
			d := math.NaN()
			if dm := bySys["direct"]; dm != nil {
				if x, ok := dm[w.Primary]; ok {
					d = x
				}
			}
			x, ok := m[w.Primary]
			if !ok {
				x = math.NaN()
			}
			rss := "—"
			if v, ok := m["lb_peak_rss_MB"]; ok {
				rss = fmt.Sprintf("%.1f", v)
			}
			paired := "—"
			if peerName != "" && peerName != sys.Name() {
				paired = pairedRatio(runs, w.Name, w.Primary, sys.Name(), peerName).String()
			}
			fmt.Fprintf(&md, " %.3g | %.3g | %s | %s | %s | %s |\n", m["lb_cpu_s"], m["host_cpu_s"], rss, ratio(x, d), ratio(x, peer), paired)
		}
		if peerName != "" {
			fmt.Fprintf(&md, "\nBest peer: %s.\n", peerName)
		}
		md.WriteString("\n")
	}
	md.WriteString(Targets(sum, runs, systems))
	// runLines lists the runs whose text is not empty, one line each.
	runLines := func(text func(Run) string) string {
		var lines []string
		for _, r := range runs {
			if t := text(r); t != "" {
				lines = append(lines, fmt.Sprintf("- round %d %s %s: %s", r.Round, r.System, r.Workload, t))
			}
		}
		return strings.Join(lines, "\n")
	}
	if errs := runLines(func(r Run) string { return r.Err }); errs != "" {
		fmt.Fprintf(&md, "\n## Errors\n\n%s\n", errs)
	}
	if notes := runLines(func(r Run) string { return r.Note }); notes != "" {
		fmt.Fprintf(&md, "\n## Runs that stopped short\n\nTheir metrics are of what they measured.\n\n%s\n", notes)
	}
	fmt.Fprintf(&md, "\n## Machine\n\n```\n%s```\n", machine)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md.String()), 0o644); err != nil {
		return "", err
	}
	topo := "loopback"
	if o.Topology != nil {
		topo = o.Topology.Name
	}
	js, _ := json.MarshalIndent(map[string]any{"mode": o.Mode, "rounds": o.Rounds, "target_rounds": o.TargetRounds, "lb_cpu": o.LBCPU, "topology": topo, "note": o.Note, "runs": runs, "summary": sum, "machine": machine}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644); err != nil {
		return "", err
	}
	if err := writeCSV(filepath.Join(dir, "results.csv"), runs); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "machine.txt"), []byte(machine), 0o644); err != nil {
		return "", err
	}
	if err := writePlots(dir, sum, systems); err != nil {
		return "", err
	}
	return md.String(), nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func writeCSV(path string, runs []Run) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := csv.NewWriter(f)
	w.Write([]string{"round", "warmup", "system", "workload", "metric", "value", "lb_cpu_seconds", "host_cpu_seconds", "lb_peak_rss_bytes", "error", "not_applicable", "note"})
	for _, r := range runs {
		base := []string{fmt.Sprint(r.Round), fmt.Sprint(r.Warmup), r.System, r.Workload}
		tail := []string{fmt.Sprint(r.CPUSeconds), fmt.Sprint(r.HostCPUSeconds), fmt.Sprint(r.PeakRSS), r.Err, fmt.Sprint(r.NA), r.Note}
		if len(r.Metrics) == 0 {
			w.Write(append(append(base, "", ""), tail...))
		}
		for _, k := range sortedKeysM(r.Metrics) {
			w.Write(append(append(append([]string{}, base...), k, fmt.Sprint(r.Metrics[k])), tail...))
		}
	}
	w.Flush()
	return w.Error()
}

func sortedKeysM(m Metrics) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Targets reports the targets for sluice's default engine, met or
// missed, from the summary.
func Targets(sum Summary, runs []Run, systems []System) string {
	const u = "sluice-eventloop"
	get := func(w, sys, m string) float64 {
		if x, ok := sum[w][sys][m]; ok {
			return x
		}
		return math.NaN()
	}
	check := func(ok bool, measured bool) string {
		switch {
		case !measured:
			return "not measured"
		case ok:
			return "met"
		}
		return "**missed**"
	}
	var b strings.Builder
	b.WriteString("## Targets (sluice-eventloop)\n\n| target | measured | status |\n|---|---|---|\n")
	for _, q := range []struct{ metric, name string }{{"p50_us", "p50"}, {"p99_us", "p99"}} {
		v := get("tcp-rr", u, q.metric)
		p, who := best(sum["tcp-rr"], systems, q.metric, true)
		fmt.Fprintf(&b, "| TCP RR %s at or below the best peer | %.1f µs vs %.1f µs (%s) | %s |\n", q.name, v, p, who, check(v <= p, !math.IsNaN(v) && !math.IsNaN(p)))
	}
	// vs is sluice's metric against other's: the medians, their ratio, and
	// the per-round ratios, whose median the ratio targets are judged on
	// (the steadier figure here; see Paired). floor-c's, when it ran, is
	// a relay with sluice's syscalls and no runtime: what the design can
	// reach.
	vs := func(w, m, other string) (string, Paired) {
		v, o := get(w, u, m), get(w, other, m)
		p := pairedRatio(runs, w, m, u, other)
		text := fmt.Sprintf("%s vs %s (%s); per round %s", figure(v), figure(o), ratio(v, o), p)
		if f := pairedRatio(runs, w, m, "floor-c", other); f.Rounds > 0 {
			text += fmt.Sprintf("; floor-c %s", f)
		}
		return text, p
	}
	for _, t := range []struct {
		w, m, other, name string
		at                float64
		lower             bool
	}{
		{"http-keepalive", "req_per_s", "haproxy", "keep-alive requests/s at least 1.2× HAProxy", 1.2, false},
		{"conn-per-request", "conn_per_s", "haproxy", "new connections/s at least 1.2× HAProxy", 1.2, false},
		{"capped-keepalive", "req_per_s", "haproxy", "keep-alive requests/s at least 1.2× HAProxy, each held to half a CPU (a 500m CPU limit; capped-keepalive)", 1.2, false},
		{"capped-crr", "conn_per_s", "haproxy", "new connections/s at least 1.2× HAProxy, each held to half a CPU (capped-crr)", 1.2, false},
		{"cost-keepalive", "cpu_us_per_unit", "haproxy", "LB CPU per kept request at most 0.8× HAProxy's (cost-keepalive, µs)", 0.8, true},
		{"cost-crr", "cpu_us_per_unit", "haproxy", "LB CPU per connection at most 0.8× HAProxy's (cost-crr, µs)", 0.8, true},
		{"cost-rr", "syscalls_per_unit", "haproxy", "LB syscalls per request/response at or below HAProxy's (cost-rr)", 1, true},
		{"cost-crr", "syscalls_per_unit", "haproxy", "LB syscalls per connection at or below HAProxy's (cost-crr)", 1, true},
		{"udp-flows", "flows_per_s", "nginx", "UDP flow set-up at least 1.5× nginx", 1.5, false},
	} {
		text, p := vs(t.w, t.m, t.other)
		ok := p.Median >= t.at
		if t.lower {
			ok = p.Median <= t.at
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.name, text, check(ok, p.Rounds > 0))
	}
	for _, w := range []string{"iperf3-up", "iperf3-down"} {
		v, s := get(w, u, "Gbit_per_s"), get(w, "haproxy-splice", "Gbit_per_s")
		cpuU, cpuS := get(w, u, "lb_cpu_s"), get(w, "haproxy-splice", "lb_cpu_s")
		fmt.Fprintf(&b, "| %s throughput at least HAProxy+splice, at no more CPU | %.2f vs %.2f Gbit/s; %.2f vs %.2f CPU s | %s |\n", w, v, s, cpuU, cpuS,
			check(v >= s && cpuU <= cpuS*1.0001, !math.IsNaN(v) && !math.IsNaN(s)))
	}
	text, p := vs("udp-rr", "pps", "nginx")
	drops := get("udp-rr", u, "drops") + get("udp-flows", u, "lost")
	fmt.Fprintf(&b, "| UDP pps at least 1.5× nginx, no drops | %s pps, %.0f drops | %s |\n", text, drops, check(p.Median >= 1.5 && drops == 0, p.Rounds > 0))
	loss := get("udp-paced", u, "loss_pct")
	fmt.Fprintf(&b, "| no UDP drops at a moderate rate (%d datagrams/s) | %.2f %% lost | %s |\n", udpPacedRate, loss, check(loss == 0, !math.IsNaN(loss)))
	rss := get("idle-conns", u, "rss_bytes_per_conn")
	fmt.Fprintf(&b, "| at most 2 KiB RSS per idle connection | %.0f B | %s |\n", rss, check(rss <= 2048, !math.IsNaN(rss)))
	g := get("slow-reader", u, "rss_growth_MB")
	fmt.Fprintf(&b, "| bounded RSS with a slow reader | +%.1f MB | %s |\n", g, check(g < 16, !math.IsNaN(g)))
	e := get("connect-retry", u, "error_pct")
	fmt.Fprintf(&b, "| zero client errors with a refusing and a black-holed endpoint | %.1f %% | %s |\n", e, check(e == 0, !math.IsNaN(e)))
	cu := get("churn-10k", u, "update_max_ms")
	fmt.Fprintf(&b, "| p99 from an endpoint update to its effect ≤ 5 ms at 10k services (max of the flips, from a manifest write) | %.1f ms | %s |\n", cu, check(cu <= 5, !math.IsNaN(cu)))
	ca := get("churn-api", u, "update_max_ms")
	fmt.Fprintf(&b, "| p99 from an endpoint update to its effect ≤ 5 ms at 10k services (max of the flips, through kube-apiserver: %.0f services) | %.1f ms | %s |\n", get("churn-api", u, "services"), ca, check(ca <= 5, !math.IsNaN(ca) && get("churn-api", u, "services") >= 10000))
	bw50, bwMax, aw := get("churn-api", u, "beyond_watch_p50_ms"), get("churn-api", u, "beyond_watch_max_ms"), get("churn-api", u, "api_watch_p50_ms")
	bwOK := !math.IsNaN(bw50) && get("churn-api", u, "services") >= 10000
	fmt.Fprintf(&b, "| write-to-effect through kube-apiserver within 2 ms of its own watch latency at 10k services (median of the flips; the API's watch p50 %.1f ms) | +%.1f ms | %s |\n", aw, bw50, check(bw50 <= 2, bwOK))
	fmt.Fprintf(&b, "| the same, worst of the flips | +%.1f ms | %s |\n", bwMax, check(bwMax <= 2, bwOK))
	sbw := get("churn-api", u, "steady_beyond_watch_max_ms")
	fmt.Fprintf(&b, "| the same, worst of the flips once settled (35 s after ready) | +%.1f ms | %s |\n", sbw, check(sbw <= 2, bwOK && !math.IsNaN(sbw)))
	// The probe sees a flip on its next connection after the apply; the
	// proxy's own stamp of the apply (kube-proxy's last-sync timestamp)
	// has no such delay.
	for _, o := range []struct{ key, when string }{{"applied_beyond_watch_max_ms", "right after ready"}, {"steady_applied_beyond_watch_max_ms", "once settled"}} {
		v := get("churn-api", u, o.key)
		fmt.Fprintf(&b, "| the same, worst of the flips %s, to sluice's own stamp of the apply (its last-sync timestamp) | +%.1f ms | %s |\n", o.when, v, check(v <= 2, bwOK && !math.IsNaN(v)))
	}
	for _, o := range []struct{ key, when string }{{"own_share_p99_le_ms", "right after ready"}, {"steady_own_share_p99_le_ms", "once settled"}} {
		v := get("churn-api", u, o.key)
		fmt.Fprintf(&b, "| sluice's own share of an update at 10k services, p99 at most 1 ms (flips %s; the bucket holding it) | ≤ %.1f ms | %s |\n", o.when, v, check(v <= 1, bwOK && !math.IsNaN(v)))
	}
	le := get("churn-10k", u, "load_errors")
	fmt.Fprintf(&b, "| no client errors under endpoint churn (10k services) | %.0f errors | %s |\n", le, check(le == 0, !math.IsNaN(le)))
	return b.String()
}

// Machine describes the box and the tools, for machine.txt.
func Machine() string {
	var b strings.Builder
	run := func(name string, args ...string) {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil && len(out) == 0 { // wrk -v prints its version and exits 1
			fmt.Fprintf(&b, "%s: not available\n", name)
			return
		}
		text := string(out)
		if before, _, ok := strings.Cut(text, "\nUsage:"); ok {
			text = before // wrk -v prints its usage after the version
		}
		fmt.Fprintf(&b, "%s\n", strings.TrimSpace(text))
	}
	fmt.Fprintf(&b, "go: %s %s/%s, NumCPU %d\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	run("uname", "-srm")
	if cpu, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(cpu), "\n") {
			if strings.HasPrefix(l, "model name") {
				fmt.Fprintf(&b, "cpu: %s\n", strings.TrimSpace(strings.SplitN(l, ":", 2)[1]))
				break
			}
		}
	}
	if mem, err := os.ReadFile("/proc/meminfo"); err == nil {
		fmt.Fprintf(&b, "%s\n", strings.SplitN(string(mem), "\n", 2)[0])
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "loadavg at end: %s", la)
	}
	run("haproxy", "-v")
	run("nginx", "-v")
	run("wrk", "-v")
	return b.String()
}

// Rerender re-writes the reports of an earlier run from its results.json,
// with this harness's report format.
func Rerender(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	var saved struct {
		Mode         string `json:"mode"`
		Rounds       int    `json:"rounds"`
		TargetRounds int    `json:"target_rounds"`
		CostRounds   int    `json:"cost_rounds"` // records before the throughput workloads had extra rounds
		LBCPU        int    `json:"lb_cpu"`
		Topology     string `json:"topology"`
		Note         string `json:"note"`
		Runs         []Run  `json:"runs"`
		Machine      string `json:"machine"`
	}
	if err := json.Unmarshal(data, &saved); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	present := map[string]bool{}
	warm := false
	for _, r := range saved.Runs {
		present[r.System] = true
		warm = warm || r.Warmup
	}
	var systems []System
	for _, s := range Systems(Config{}, nil) {
		if present[s.Name()] {
			systems = append(systems, s)
		}
	}
	o := Options{Mode: saved.Mode, Rounds: saved.Rounds, TargetRounds: max(saved.TargetRounds, saved.CostRounds), LBCPU: saved.LBCPU, NoWarmup: !warm, Topology: Loopback(), Note: saved.Note}
	if saved.Topology == "netns" {
		o.Topology = InNetns("rerendered") // only its name and addresses are used
	}
	_, err = Write(dir, o, saved.Runs, systems, saved.Machine)
	return err
}
