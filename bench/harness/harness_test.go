//go:build linux

package harness

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 1000; i++ {
		lat = append(lat, time.Duration(i)*time.Microsecond)
	}
	m := Metrics{}
	latencyMetrics(lat, m)
	if m["p50_us"] != 500 || m["p99_us"] != 990 || m["p99.9_us"] != 999 {
		t.Fatalf("percentiles %v", m)
	}
	if percentile(nil, 50) != 0 {
		t.Fatal("empty percentile")
	}
}

func TestSummarizeTakesMediansAndSkipsWarmupErrorsAndNA(t *testing.T) {
	runs := []Run{
		{Round: 0, Warmup: true, System: "a", Workload: "w", Metrics: Metrics{"x": 1000}},
		{Round: 1, System: "a", Workload: "w", Metrics: Metrics{"x": 3}, CPUSeconds: 1, PeakRSS: 5e6, HostCPUSeconds: 9},
		{Round: 2, System: "a", Workload: "w", Metrics: Metrics{"x": 1}, CPUSeconds: 2, HostCPUSeconds: 4},
		{Round: 3, System: "a", Workload: "w", Metrics: Metrics{"x": 2}, CPUSeconds: 3, HostCPUSeconds: 7},
		{Round: 1, System: "b", Workload: "w", Err: "boom"},
		{Round: 1, System: "c", Workload: "w", NA: true},
	}
	s := Summarize(runs)
	if got := s["w"]["a"]; got["x"] != 2 || got["lb_cpu_s"] != 2 || got["lb_peak_rss_MB"] != 5 || got["host_cpu_s"] != 7 || len(got) != 4 {
		t.Fatalf("medians %v", got)
	}
	if m, ok := s["w"]["b"]; !ok || m != nil {
		t.Fatalf("an erroring system must be present with no metrics: %v %v", m, ok)
	}
	// An even number of rounds: the mean of the two middle ones.
	runs = append(runs, Run{Round: 4, System: "a", Workload: "w", Metrics: Metrics{"x": 10}, CPUSeconds: 4, HostCPUSeconds: 8})
	if got := Summarize(runs)["w"]["a"]; got["x"] != 2.5 || got["lb_cpu_s"] != 2.5 || got["host_cpu_s"] != 7.5 {
		t.Fatalf("medians of four rounds %v; want x 2.5, lb_cpu_s 2.5, host_cpu_s 7.5", got)
	}
	if m, ok := s["w"]["c"]; !ok || m != nil {
		t.Fatalf("an n/a system must be present with no metrics: %v %v", m, ok)
	}
}

func TestBestPeerAndTargets(t *testing.T) {
	systems := []System{direct{}, sluice{engine: "eventloop"}, haproxy{}, haproxy{splice: true}, nginx{}, floor{}}
	var runs []Run
	add := func(round int, system, workload string, m Metrics) {
		runs = append(runs, Run{Round: round, Warmup: round == 0, System: system, Workload: workload, Metrics: m})
	}
	for sys, m := range map[string]Metrics{"direct": {"p50_us": 10, "p99_us": 20}, "sluice-eventloop": {"p50_us": 25, "p99_us": 60},
		"haproxy": {"p50_us": 30, "p99_us": 50}, "nginx": {"p50_us": 28, "p99_us": 70}} {
		add(1, sys, "tcp-rr", m)
	}
	add(1, "sluice-eventloop", "connect-retry", Metrics{"error_pct": 0})
	// A warm-up round that would turn every ratio, and three rounds in
	// which the ratio of the medians (1.30×) and the median of the
	// rounds' ratios (1.10×) fall either side of the 1.2× target.
	add(0, "sluice-eventloop", "conn-per-request", Metrics{"conn_per_s": 1e9})
	add(0, "haproxy", "conn-per-request", Metrics{"conn_per_s": 1})
	for i, pair := range [][2]float64{{1300, 1000}, {1100, 1000}, {1500, 1400}} {
		add(i+1, "sluice-eventloop", "conn-per-request", Metrics{"conn_per_s": pair[0]})
		add(i+1, "haproxy", "conn-per-request", Metrics{"conn_per_s": pair[1]})
	}
	for i, cpu := range [][3]float64{{70, 100, 60}, {80, 90, 70}, {60, 80, 55}} { // sluice, haproxy, floor-c
		add(i+1, "sluice-eventloop", "cost-crr", Metrics{"cpu_us_per_unit": cpu[0], "syscalls_per_unit": 20})
		add(i+1, "haproxy", "cost-crr", Metrics{"cpu_us_per_unit": cpu[1], "syscalls_per_unit": 32})
		add(i+1, "floor-c", "cost-crr", Metrics{"cpu_us_per_unit": cpu[2], "syscalls_per_unit": 20})
	}
	sum := Summarize(runs)
	v, who := best(sum["tcp-rr"], systems, "p50_us", true)
	if v != 28 || who != "nginx" {
		t.Fatalf("best peer %v %s; direct and sluice are not peers", v, who)
	}
	out := Targets(sum, runs, systems)
	for _, want := range []string{
		"TCP RR p50 at or below the best peer | 25.0 µs vs 28.0 µs (nginx) | met",
		"TCP RR p99 at or below the best peer | 60.0 µs vs 50.0 µs (haproxy) | **missed**",
		"new connections/s at least 1.2× HAProxy | 1300 vs 1000 (1.30×); per round 1.10× (1.07-1.30, 3 rounds) | **missed**",
		"LB CPU per connection at most 0.8× HAProxy's (cost-crr, µs) | 70 vs 90 (0.78×); per round 0.75× (0.70-0.89, 3 rounds); floor-c 0.69× (0.60-0.78, 3 rounds) | met",
		"LB syscalls per connection at or below HAProxy's (cost-crr) | 20 vs 32 (0.62×); per round 0.62× (0.62-0.62, 3 rounds); floor-c 0.62× (0.62-0.62, 3 rounds) | met",
		"keep-alive requests/s at least 1.2× HAProxy | NaN vs NaN (—); per round — | not measured",
		"zero client errors with a refusing and a black-holed endpoint | 0.0 % | met",
		"UDP pps at least 1.5× nginx, no drops | NaN vs NaN (—); per round — pps, NaN drops | not measured",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("targets lack %q:\n%s", want, out)
		}
	}
	if r := ratio(1, 0); r != "—" || ratio(math.NaN(), 1) != "—" || ratio(3, 2) != "1.50×" {
		t.Fatal("ratio")
	}
}

func TestPairedRatioPairsWithinRoundsOnly(t *testing.T) {
	runs := []Run{
		{Round: 1, System: "a", Workload: "w", Metrics: Metrics{"x": 2}},
		{Round: 1, System: "b", Workload: "w", Metrics: Metrics{"x": 4}},
		{Round: 2, System: "a", Workload: "w", Metrics: Metrics{"x": 3}},
		{Round: 2, System: "b", Workload: "w", Metrics: Metrics{"x": 3}},
		{Round: 3, System: "a", Workload: "w", Metrics: Metrics{"x": 100}}, // b did not run: no pair
		{Round: 4, System: "a", Workload: "w", Metrics: Metrics{"x": 1}},
		{Round: 4, System: "b", Workload: "w", Err: "boom"},
		{Round: 5, System: "a", Workload: "w", Metrics: Metrics{"x": 1}},
		{Round: 5, System: "b", Workload: "other", Metrics: Metrics{"x": 1}},
	}
	p := pairedRatio(runs, "w", "x", "a", "b")
	if p.Rounds != 2 || p.Median != 0.75 || p.Lo != 0.5 || p.Hi != 1 {
		t.Fatalf("paired %+v; want rounds 1 and 2 only, ratios 0.5 and 1, median 0.75", p)
	}
	if got := p.String(); got != "0.75× (0.50-1.00, 2 rounds)" {
		t.Fatalf("%q", got)
	}
	if p := pairedRatio(runs, "w", "x", "a", "nobody"); p.Rounds != 0 || p.String() != "—" {
		t.Fatalf("no pair: %+v %q", p, p.String())
	}
}

func TestPeerConfigsAreFair(t *testing.T) {
	b := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1001"), netip.MustParseAddrPort("127.0.0.1:1002")}
	svcs := []Service{{Name: "echo", Port: 2001, Backends: b}, {Name: "udp", UDP: true, Port: 2002, Backends: b},
		{Name: "affinity", Affinity: true, Port: 2003, Backends: b}}
	lb := netip.MustParseAddr("10.77.1.1")
	h := haproxy{splice: true}.config(lb, svcs)
	for _, want := range []string{"nbthread 2", "timeout connect 250ms", "retries 3", "option redispatch 1", "option splice-auto",
		"listen echo\n  bind 10.77.1.1:2001\n  balance roundrobin\n  server s0 127.0.0.1:1001\n  server s1 127.0.0.1:1002", "balance source"} {
		if !strings.Contains(h, want) {
			t.Errorf("haproxy config lacks %q:\n%s", want, h)
		}
	}
	if strings.Contains(h, "2002") || strings.Contains(haproxy{}.config(lb, svcs), "splice") {
		t.Errorf("haproxy config serves UDP or splices without being asked:\n%s", h)
	}
	n := nginx{}.config(lb, "/tmp/x", svcs)
	for _, want := range []string{"worker_processes 2", "proxy_connect_timeout 250ms", "proxy_next_upstream_tries 3", "proxy_half_close on",
		"listen 10.77.1.1:2002 udp reuseport", "hash $remote_addr consistent", "load_module " + NginxStreamModule} {
		if !strings.Contains(n, want) {
			t.Errorf("nginx config lacks %q:\n%s", want, n)
		}
	}
	if (naive{}).Supports(Service{UDP: true}) || (naive{}).Supports(Service{Affinity: true}) {
		t.Fatal("the naive proxy does neither UDP nor affinity")
	}
}

func TestManifestsKeepKernelModesOffTheOtherSystemsPorts(t *testing.T) {
	b := []netip.AddrPort{netip.MustParseAddrPort("10.77.2.2:1001")}
	svcs := []Service{{Name: "echo", Port: 2001, Backends: b, ClusterIP: netip.MustParseAddr("10.96.0.1")},
		{Name: "affinity", Affinity: true, Port: 2003, Backends: b, ClusterIP: netip.MustParseAddr("10.96.0.2")}}
	user := manifests(svcs, true)
	for _, want := range []string{"type: NodePort", "nodePort: 2001", "clusterIP: 10.96.0.1", "sessionAffinity: ClientIP", `addresses: ["10.77.2.2"]`, "port: 1001"} {
		if !strings.Contains(user, want) {
			t.Errorf("userspace manifests lack %q:\n%s", want, user)
		}
	}
	kernel := manifests(svcs, false)
	if strings.Contains(kernel, "nodePort") || strings.Contains(kernel, "NodePort") || !strings.Contains(kernel, "type: ClusterIP") {
		t.Errorf("kernel-mode manifests must be ClusterIP only (their rules share the node namespace):\n%s", kernel)
	}
	if !IsKernelMode(sluiceKernel{}) || IsKernelMode(sluice{}) {
		t.Fatal("IsKernelMode")
	}
	if names := systemNames(Systems(Config{}, Loopback())); strings.Contains(names, "iptables") {
		t.Errorf("loopback topology runs a kernel mode: %s", names)
	}
	nt := InNetns("x", "iptables", "ipvs")
	if names := systemNames(Systems(Config{}, nt)); !strings.Contains(names, "sluice-iptables") || !strings.Contains(names, "sluice-ipvs") {
		t.Errorf("netns topology lacks a kernel mode: %s", names)
	}
	// Each kernel mode serves its own ClusterIP range (the client routes
	// it to that mode's node), apart from the churn workloads' ranges.
	a, c := nt.ClusterIP("iptables", 0, 0), nt.ClusterIP("ipvs", 0, 0)
	if a == c || a.As4()[1] == c.As4()[1] || nt.ClusterIP("iptables", 8, 9999).As4()[1] != a.As4()[1] || nt.ClusterIP("iptables", 1, 0) == a {
		t.Errorf("kernel-mode ClusterIPs overlap: %s %s", a, c)
	}
	if s := nt.SourcesFor("ipvs"); len(s) == 0 || s[0] == nt.Sources[0] || s[0].As4()[2] != nt.SourcesFor("ipvs")[1].As4()[2] {
		t.Errorf("a kernel mode's client sources must be on its own link: %v", s)
	}
	if argv := nt.InKernelNode("ipvs", "sluice"); strings.Join(argv, " ") != "ip netns exec x-ipvs sluice" {
		t.Errorf("InKernelNode: %v", argv)
	}
}

func systemNames(ss []System) string {
	var n []string
	for _, s := range ss {
		n = append(n, s.Name())
	}
	return strings.Join(n, ",")
}

func TestSummarizeKeepsTheBestRoundOfThePrimaryMetric(t *testing.T) {
	runs := []Run{
		{Round: 1, System: "a", Workload: "tcp-rr", Metrics: Metrics{"p50_us": 30, "p99_us": 90}},
		{Round: 2, System: "a", Workload: "tcp-rr", Metrics: Metrics{"p50_us": 10, "p99_us": 80}},
		{Round: 3, System: "a", Workload: "tcp-rr", Metrics: Metrics{"p50_us": 20, "p99_us": 70}},
		{Round: 1, System: "a", Workload: "udp-rr", Metrics: Metrics{"pps": 5}},
		{Round: 2, System: "a", Workload: "udp-rr", Metrics: Metrics{"pps": 9}},
	}
	s := Summarize(runs)
	if m := s["tcp-rr"]["a"]; m["p50_us"] != 20 || m["p50_us (best)"] != 10 || m["p99_us (best)"] != 0 {
		t.Fatalf("tcp-rr %v: want median 20, best 10, and no best for a secondary metric", m)
	}
	if m := s["udp-rr"]["a"]; m["pps (best)"] != 9 {
		t.Fatalf("udp-rr %v: higher is better, best is 9", m)
	}
}

func TestWriteSyncResultsReportsMediansAndPartialRatio(t *testing.T) {
	dir := t.TempDir()
	var res []SyncResult
	for _, total := range []float64{100, 300, 200} {
		res = append(res, SyncResult{Backend: "nft", Services: 1000, Kind: "full-resync", TotalMS: total, Lines: 47017})
		res = append(res, SyncResult{Backend: "nft", Services: 1000, Kind: "partial", TotalMS: total / 10, Lines: 2062})
	}
	md, err := WriteSyncResults(dir, res, "test machine")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md, "| nft | 1000 | full-resync | 0.0 | 0.0 | 200.0 | 47017 |  |") || !strings.Contains(md, "| nft | 1000 | partial | 0.0 | 0.0 | 20.0 | 2062 | 0.10x |") {
		t.Fatalf("table:\n%s", md)
	}
	for _, f := range []string{"results.md", "results.json", "machine.txt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

func TestSyncSnapshotShape(t *testing.T) {
	s := SyncSnapshot(300)
	if s.Ports.Len() != 300 {
		t.Fatalf("%d ports", s.Ports.Len())
	}
	seen := map[string]bool{}
	for _, sp := range s.Ports.All() {
		if len(sp.Endpoints) != 10 || seen[sp.ClusterIPs[0].String()] {
			t.Fatalf("port %v: %d endpoints, duplicate ClusterIP %v", sp.Name, len(sp.Endpoints), seen[sp.ClusterIPs[0].String()])
		}
		seen[sp.ClusterIPs[0].String()] = true
	}
}

func TestBenchTBTurnsFatalIntoAnErrorAndCleansUp(t *testing.T) {
	tb := &benchTB{}
	var order []int
	err := tb.run(func() {
		tb.Cleanup(func() { order = append(order, 1) })
		tb.Cleanup(func() { order = append(order, 2) })
		dir := tb.TempDir()
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("TempDir %s: %v", dir, err)
		}
		tb.Fatalf("etcd %s", "down")
		t.Fatal("Fatalf returned")
	})
	if err == nil || err.Error() != "etcd down" || !tb.Failed() {
		t.Fatalf("run: %v (failed %v)", err, tb.Failed())
	}
	dirs := tb.dirs
	tb.close()
	if len(order) != 2 || order[0] != 2 || order[1] != 1 {
		t.Fatalf("cleanups ran %v, want [2 1]", order)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("temp dir %s left behind", d)
		}
	}
}

func TestWriteKeepsTheMetricsOfARunThatStoppedShortAndSaysWhy(t *testing.T) {
	dir := t.TempDir()
	runs := []Run{
		{Round: 1, System: "sluice-eventloop", Workload: "idle-conns", Metrics: Metrics{"rss_bytes_per_conn": 800, "conns": 10000, "held_all": 1}},
		{Round: 1, System: "sluice-goroutine", Workload: "idle-conns", Metrics: Metrics{"rss_bytes_per_conn": 18000, "conns": 9924, "held_all": 0},
			Note: stoppedShort{errors.New("held 9924 of 10000 connections: context deadline exceeded")}.Error()},
	}
	md, err := Write(dir, Options{Mode: "short", Rounds: 1, Topology: Loopback()}, runs, []System{sluice{engine: "eventloop"}, sluice{engine: "goroutine"}}, "test machine\n")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md, "| sluice-goroutine | 9924 | 0 | 1.8e+04") {
		t.Errorf("the short run's metrics must stand in its table:\n%s", md)
	}
	if !strings.Contains(md, "## Runs that stopped short") || !strings.Contains(md, "- round 1 sluice-goroutine idle-conns: stopped short: held 9924 of 10000 connections: context deadline exceeded") {
		t.Errorf("the report must say why a run stopped short:\n%s", md)
	}
	if strings.Contains(md, "## Errors") {
		t.Errorf("a run that stopped short is not an error:\n%s", md)
	}
	csv, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil || !strings.Contains(string(csv), "stopped short: held 9924") {
		t.Errorf("results.csv must carry the note: %v\n%s", err, csv)
	}
}

// The kube-sync report gives each proxy's memory and the growth per
// Service between sizes, from the rounds' medians.
func TestKubeSyncReportsMemoryPerService(t *testing.T) {
	res := []KubeSyncResult{
		{Proxy: "sluice", Mode: "nftables", Services: 1000, RSSMB: 50, PeakRSSMB: 60},
		{Proxy: "sluice", Mode: "nftables", Services: 10000, RSSMB: 68, PeakRSSMB: 90, EffectMS: []float64{30, 10, 20}},
		{Proxy: "kube-proxy", Mode: "nftables", Services: 1000, RSSMB: 60},
		{Proxy: "kube-proxy", Mode: "nftables", Services: 10000, RSSMB: 105},
	}
	md, err := WriteKubeSyncResults(t.TempDir(), res, 15*time.Minute, "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| nftables | 10000 | sluice | 0.00 | 0.00 | 0.000 | 20.0 | 30.0 | 68.0 | 90.0 | 1 |",
		"| nftables | sluice | 1000 | 10000 | 2.05 |",     // 18 MiB over 9000 Services
		"| nftables | kube-proxy | 1000 | 10000 | 5.12 |", // 45 MiB over 9000
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// One run takes iptables mode on each backend asked for, and nftables
// mode once; the report keeps the backends apart, and where kube-proxy had
// no full sync within the limit in any round, bounds the ratio by it.
func TestKubeSyncTakesEachBackendAndBoundsWhatNeverFinished(t *testing.T) {
	cfg := KubeSyncConfig{Modes: []string{"iptables", "nftables"}, Backends: []string{"legacy", "nft"}}
	if got, want := fmt.Sprint(cfg.variants()), "[{iptables legacy} {iptables nft} {nftables }]"; got != want {
		t.Errorf("variants %s, want %s", got, want)
	}
	if got := fmt.Sprint(KubeSyncConfig{Modes: []string{"iptables"}}.variants()); got != "[{iptables }]" {
		t.Errorf("no backend asked for: variants %s", got)
	}
	res := []KubeSyncResult{
		{Proxy: "sluice", Mode: "iptables", Backend: "legacy", Services: 5000, FullS: 4, PartialS: 1.5},
		{Proxy: "kube-proxy", Mode: "iptables", Backend: "legacy", Services: 5000, FullS: 5, PartialS: 2},
		{Proxy: "sluice", Mode: "iptables", Backend: "nft", Services: 5000, FullS: 9, PartialS: 0.2},
		{Proxy: "kube-proxy", Mode: "iptables", Backend: "nft", Services: 5000, Failed: "no full sync of both families within 15m0s"},
	}
	md, err := WriteKubeSyncResults(t.TempDir(), res, 15*time.Minute, "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| iptables (legacy) | 5000 | 0.80x | 0.75x |",
		"| iptables (nft) | 5000 | < 0.010x (kube-proxy: none within 15m0s) | n/a | n/a |",
		"- kube-proxy iptables (nft) 5000 services, round 0: no full sync",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// rawBackendOf reads the backend's headers from a bare connection: which
// backend, "" when there is none or the answer is cut short, and when it
// served, zero when that is missing or not a time.
func TestRawBackendOfReadsTheHeader(t *testing.T) {
	for _, tc := range []struct {
		answer, want string
		at           time.Time
	}{
		{"HTTP/1.0 204 No Content\r\nDate: x\r\nx-backend: 2\r\nX-Served-At: 1700000000000000123\r\n\r\n", "2", time.Unix(0, 1700000000000000123)},
		{"HTTP/1.0 204 No Content\r\nx-backend: 2\r\n\r\n", "2", time.Time{}},
		{"HTTP/1.0 204 No Content\r\nx-backend: 2\r\nX-Served-At: soon\r\n\r\n", "2", time.Time{}},
		{"HTTP/1.0 204 No Content\r\nDate: x\r\n\r\n", "", time.Time{}},
		{"HTTP/1.0 204 No Content\r\nX-Backend: 1", "", time.Time{}},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			c.Read(buf)
			c.Write([]byte(tc.answer))
			c.Close()
		}()
		if got, at := rawBackendOf(ln.Addr().String())(); got != tc.want || !at.Equal(tc.at) {
			t.Errorf("answer %q: got %q at %v, want %q at %v", tc.answer, got, at, tc.want, tc.at)
		}
		ln.Close()
	}
}

// A flip's effect is when the backend served the first probe that reached
// it; an answer without that time, or one before the write, is an error,
// not a figure.
func TestFlipEffectIsWhenTheBackendServed(t *testing.T) {
	written := time.Unix(1_700_000_000, 0)
	if took, err := servedAfter(3, written, written.Add(1500*time.Microsecond)); err != nil || took != 1500*time.Microsecond {
		t.Errorf("served 1.5 ms after the write: %v, %v", took, err)
	}
	if _, err := servedAfter(3, written, time.Time{}); err == nil || !strings.Contains(err.Error(), "update 3") {
		t.Errorf("no served time: %v", err)
	}
	if _, err := servedAfter(3, written, written.Add(-time.Millisecond)); err == nil {
		t.Error("served before the write: no error")
	}
}

// The bench's HTTP backends stamp each answer with when they served it,
// on the bench's clock.
func TestHTTPBackendsSayWhenTheyServed(t *testing.T) {
	b := &Backends{topo: &Topology{Backend: netip.MustParseAddr("127.0.0.1")}}
	if err := b.http(0); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	before := time.Now()
	got, at := rawBackendOf(b.HTTP[0].String())()
	if got != "0" || at.Before(before.Add(-time.Millisecond)) || at.After(time.Now().Add(time.Millisecond)) {
		t.Errorf("backend %q served at %v, want 0 within [%v, now]", got, at, before)
	}
}

func TestWriteGivesEachSystemsPerRoundRatioToTheBestPeer(t *testing.T) {
	var runs []Run
	for i, pair := range [][2]float64{{70, 100}, {80, 100}} {
		runs = append(runs, Run{Round: i + 1, System: "sluice-eventloop", Workload: "cost-crr", Metrics: Metrics{"cpu_us_per_unit": pair[0]}},
			Run{Round: i + 1, System: "haproxy", Workload: "cost-crr", Metrics: Metrics{"cpu_us_per_unit": pair[1]}})
	}
	md, err := Write(t.TempDir(), Options{Mode: "short", Rounds: 2, Topology: Loopback()}, runs, []System{sluice{engine: "eventloop"}, haproxy{}}, "test machine\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| vs direct | vs best peer | vs best peer, per round |",
		"| sluice-eventloop | 75 | 70 | 0 | 0 | — | — | 0.75× | 0.75× (0.70-0.80, 2 rounds) |", // medians of two rounds: their mean
		"| haproxy | 100 | 100 | 0 | 0 | — | — | 1.00× | — |",                                  // the peer itself
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
}

// Past the measured rounds, the extra target rounds run only the
// workloads the targets judge, and only of the systems they compare.
func TestExtraTargetRoundsRunOnlyTheTargetsWorkloads(t *testing.T) {
	for _, c := range []struct {
		round            int
		system, workload string
		want             bool
	}{
		{3, "sluice-goroutine", "tcp-rr", true}, // within the rounds: everything
		{3, "sluice-iptables", "iperf3-up", true},
		{4, "sluice-eventloop", "cost-keepalive", true},
		{4, "sluice-eventloop-base", "cost-crr", true},
		{4, "haproxy", "cost-crr", true},
		{4, "nginx", "cost-udp-rr", true},
		{4, "floor-c", "cost-rr", true},
		{4, "sluice-eventloop", "http-keepalive", true},
		{4, "haproxy", "conn-per-request", true},
		{4, "sluice-eventloop-base", "capped-crr", true},
		{4, "nginx", "udp-flows", true},
		{4, "sluice-eventloop", "udp-rr", true},
		{4, "naive-go", "tcp-rr", true}, // TCP RR's target is the best peer, any of them
		{4, "haproxy-splice", "tcp-rr", true},
		{4, "haproxy-splice", "cost-tcp-bulk-up", true}, // bulk's peer is HAProxy with splice
		{4, "sluice-eventloop", "cost-tcp-bulk-down", true},
		{4, "haproxy", "cost-tcp-bulk-up", false},
		{4, "floor-c", "cost-tcp-bulk-down", false},
		{4, "sluice-goroutine", "cost-crr", false},
		{4, "sluice-goroutine", "http-keepalive", false},
		{4, "sluice-goroutine", "tcp-rr", false},
		{4, "sluice-iptables", "tcp-rr", false},
		{4, "direct", "tcp-rr", false},
		{4, "haproxy-splice", "cost-keepalive", false},
		{4, "haproxy-splice", "http-keepalive", false},
		{4, "naive-go", "cost-rr", false},
		{4, "naive-go", "conn-per-request", false},
		{4, "sluice-eventloop", "iperf3-up", false},
		{4, "sluice-eventloop", "idle-conns", false},
		{4, "sluice-eventloop", "churn-10k", false},
		{4, "sluice-eventloop", "connect-retry", false},
	} {
		if got := inRound(c.round, 3, c.system, c.workload); got != c.want {
			t.Errorf("round %d of 3, %s %s: %v, want %v", c.round, c.system, c.workload, got, c.want)
		}
	}
	const said = "`http-keepalive` and `cost-crr` ran 7 rounds"
	for _, extra := range []bool{false, true} {
		dir := t.TempDir()
		runs := []Run{
			{Round: 1, System: "haproxy", Workload: "cost-crr", Metrics: Metrics{"cpu_us_per_unit": 1}},
			{Round: 1, System: "haproxy", Workload: "http-keepalive", Metrics: Metrics{"req_per_s": 1}},
		}
		target := 0
		if extra {
			target = 7
			runs = append(runs,
				Run{Round: 7, System: "haproxy", Workload: "cost-crr", Metrics: Metrics{"cpu_us_per_unit": 1}},
				Run{Round: 7, System: "haproxy", Workload: "http-keepalive", Metrics: Metrics{"req_per_s": 1}},
				Run{Round: 7, System: "haproxy", Workload: "udp-rr", NA: true}) // not run: not named
		}
		md, err := Write(dir, Options{Mode: "short", Rounds: 3, TargetRounds: target, NoWarmup: true, LBCPU: -1, Topology: Loopback()}, runs, []System{haproxy{}}, "m\n")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(md, said); got != extra {
			t.Errorf("extra rounds %v: the report says %q: %v\n%s", extra, said, got, md)
		}
		if err := Rerender(dir); err != nil {
			t.Fatal(err)
		}
		again, _ := os.ReadFile(filepath.Join(dir, "results.md"))
		if string(again) != md {
			t.Errorf("extra rounds %v: the re-rendered report differs:\n%s\nfrom:\n%s", extra, again, md)
		}
		if !extra {
			continue
		}
		// A record from before this option had its name, cost_rounds,
		// re-renders with the same count.
		js, _ := os.ReadFile(filepath.Join(dir, "results.json"))
		old := strings.Replace(string(js), `"target_rounds"`, `"cost_rounds"`, 1)
		if old == string(js) {
			t.Fatal("results.json has no target_rounds")
		}
		if err := os.WriteFile(filepath.Join(dir, "results.json"), []byte(old), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := Rerender(dir); err != nil {
			t.Fatal(err)
		}
		if again, _ := os.ReadFile(filepath.Join(dir, "results.md")); string(again) != md {
			t.Errorf("a cost_rounds record re-renders differently:\n%s\nfrom:\n%s", again, md)
		}
	}
}
