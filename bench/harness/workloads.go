//go:build linux

package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Size scales every workload; see Modes.
type Size struct {
	RRMessages     int
	CRRDuration    time.Duration
	CRRConcurrency int
	UDPMessages    int
	UDPClients     int
	IperfSeconds   int
	RetryConns     int
	IdleConns      int
	SlowFor        time.Duration
	WrkDuration    time.Duration
	AffinityIPs    int
	AffinityReqs   int
	MaxChurn       int // largest service count the churn workloads load
	MaxKernelChurn int // the same for the kernel modes (each adds its rule sync)
	// APIChurn is how many services the API churn workload loads into
	// kube-apiserver, once per run (10k take ~2 minutes here: short mode
	// loads 1k; sluice-bench --api-services 10000 for the target).
	APIChurn int
	// APIEndpoints is how many endpoints each of those services has (0:
	// 2; issue 16's memory budget is stated at 10).
	APIEndpoints int
	// CostUnits is the fixed amount of work each cost workload counts
	// (request/responses, connections, datagrams).
	CostUnits int
}

// Modes are the run sizes: smoke proves the harness works (under 2
// minutes), short gives numbers (about 25 minutes on 2 cores, with the
// target rounds).
var Modes = map[string]Size{
	"smoke": {RRMessages: 2000, CRRDuration: 500 * time.Millisecond, CRRConcurrency: 4, UDPMessages: 1000, UDPClients: 200, IperfSeconds: 1,
		RetryConns: 30, IdleConns: 300, SlowFor: time.Second, WrkDuration: time.Second, AffinityIPs: 10, AffinityReqs: 5, MaxChurn: 1000, MaxKernelChurn: 100, APIChurn: 100, CostUnits: 4000},
	"short": {RRMessages: 10000, CRRDuration: 1500 * time.Millisecond, CRRConcurrency: 4, UDPMessages: 5000, UDPClients: 5000, IperfSeconds: 2,
		RetryConns: 18, IdleConns: 10000, SlowFor: time.Second, WrkDuration: 2 * time.Second, AffinityIPs: 30, AffinityReqs: 10, MaxChurn: 10000, MaxKernelChurn: 1000, APIChurn: 1000, CostUnits: 40000},
}

// Metrics of one run of one workload on one system.
type Metrics map[string]float64

// Workload is one measurement.
type Workload struct {
	Name    string
	Desc    string
	Primary string // the metric that ranks systems
	Lower   bool   // lower Primary is better
	Needs   string // the service it needs
	Run     func(ctx context.Context, in *Instance, sz Size) (Metrics, error)
}

// Workloads returns every workload, in report order.
func Workloads() []Workload {
	return []Workload{
		{"tcp-rr", "TCP request/response, 1 connection, 64 B", "p50_us", true, "echo", tcpRR},
		{"http-keepalive", "HTTP keep-alive, wrk -t2 -c64, 204 backend", "req_per_s", false, "http", wrkRun},
		{"conn-per-request", "a new TCP connection per 64 B request, 4 clients", "conn_per_s", false, "echo", crr},
		{"capped-keepalive", "http-keepalive with the load balancer held to half a CPU (a cgroup CPU quota): requests/s at an equal CPU budget", "req_per_s", false, "http", capped(wrkRun)},
		{"capped-crr", "conn-per-request with the load balancer held to half a CPU: new connections/s at an equal CPU budget", "conn_per_s", false, "echo", capped(crr)},
		{"iperf3-up", "iperf3 -P1, client to server", "Gbit_per_s", false, "iperf", iperf(false)},
		{"iperf3-down", "iperf3 -P1 -R, server to client", "Gbit_per_s", false, "iperf", iperf(true)},
		{"udp-rr", "UDP request/response, 64 B, sequential", "pps", false, "udp", udpRR},
		{"udp-paced", "UDP at a set moderate rate (8 flows, 10k datagrams/s in all), replies counted", "loss_pct", true, "udp", udpPaced},
		{"udp-flows", "UDP: many client tuples at once, one request each (flow set-up)", "flows_per_s", false, "udp", udpFlows},
		{"connect-retry", "endpoints: refusing, black-holed, good; a new connection per request", "error_pct", true, "retry", retry},
		{"affinity", "ClientIP affinity from many client source IPs", "sticky_pct", false, "affinity", affinity},
		{"idle-conns", "idle connections held open", "rss_bytes_per_conn", true, "echo", idle},
		{"slow-reader", "a client that reads 1 MB/s from a backend that writes without end", "rss_growth_MB", true, "push", slowReader},
		{"half-close", "client shutdown(SHUT_WR), then reads the reply", "pass", false, "halfclose", halfClose},
		{"cost-rr", "cost: 64 B request/response on one kept connection, fixed count; LB syscalls and CPU per request", "cpu_us_per_unit", true, "echo", costRR(1)},
		{"cost-keepalive", "cost: 64 B request/response on 32 kept connections at once, fixed count", "cpu_us_per_unit", true, "echo", costRR(32)},
		{"cost-crr", "cost: a new connection per 64 B request, 4 clients, fixed count; per connection", "cpu_us_per_unit", true, "echo", costCRR},
		{"cost-udp-rr", "cost: 64 B UDP request/response on one flow, fixed count; per datagram exchanged", "cpu_us_per_unit", true, "udp", costUDPRR},
		{"cost-udp-flows", "cost: a new UDP flow per 64 B request/response (a fresh client tuple each), 4 clients, fixed count; per flow set up", "cpu_us_per_unit", true, "udp", costUDPFlows},
		{"cost-udp-bulk", "cost: one UDP flow carrying bursts of 16 datagrams of 1,200 B, each burst's echoes read before the next, fixed count; per datagram echoed", "cpu_us_per_unit", true, "udp", costUDPBulk(false)},
		{"cost-udp-bulk-gso", "cost: the same, each burst sent by the client in one UDP GSO send (as QUIC stacks send); per datagram echoed", "cpu_us_per_unit", true, "udp", costUDPBulk(true)},
		{"cost-tcp-bulk-up", "cost: one TCP stream (iperf3 -n) moving a fixed number of bytes, client to server; per MB (10^6 bytes) received", "cpu_us_per_unit", true, "iperf", costTCPBulk(false)},
		{"cost-tcp-bulk-down", "cost: the same, server to client (iperf3 -R -n); per MB received", "cpu_us_per_unit", true, "iperf", costTCPBulk(true)},
		{"restart", "restarted 3 times under new-connection load (sluice's hand-over, HAProxy's seamless reload -x -sf)", "failed_conns", true, "echo", restartLoad},
		{"churn-100", "endpoint update -> effect with 100 services, under new-connection load", "update_p50_ms", true, "http", churn(100)},
		{"churn-1k", "the same with 1,000 services", "update_p50_ms", true, "http", churn(1000)},
		{"churn-10k", "the same with 10,000 services", "update_p50_ms", true, "http", churn(10000)},
		{"churn-api", "the same through a real kube-apiserver (EndpointSlice update call -> effect); the service count is in the table", "update_p50_ms", true, "http", apiChurn},
	}
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)-1))
	return float64(sorted[i].Nanoseconds()) / 1e3
}

func latencyMetrics(lat []time.Duration, m Metrics) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	m["p50_us"] = percentile(lat, 50)
	m["p99_us"] = percentile(lat, 99)
	m["p99.9_us"] = percentile(lat, 99.9)
}

func tcpRR(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	c, err := net.DialTimeout("tcp", in.Addr("echo").String(), 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	msg, buf := make([]byte, 64), make([]byte, 64)
	lat := make([]time.Duration, 0, sz.RRMessages)
	for i := 0; i < sz.RRMessages && ctx.Err() == nil; i++ {
		t := time.Now()
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t))
	}
	m := Metrics{}
	latencyMetrics(lat, m)
	return m, nil
}

// oneShot is one request on a new connection: dial, write msg, read
// len(buf) bytes back, close.
func oneShot(addr string, msg, buf []byte) error { return oneShotWithin(addr, msg, buf, 5*time.Second) }

// oneShotWithin is oneShot with a connect deadline.
func oneShotWithin(addr string, msg, buf []byte, connect time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, connect)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_, err = io.ReadFull(c, buf)
	return err
}

func crr(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	addr := in.Addr("echo").String()
	var n, errs atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	end := time.Now().Add(sz.CRRDuration)
	var wg sync.WaitGroup
	for g := 0; g < sz.CRRConcurrency; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg, buf := make([]byte, 64), make([]byte, 64)
			var mine []time.Duration
			for time.Now().Before(end) && ctx.Err() == nil {
				t := time.Now()
				if err := oneShot(addr, msg, buf); err != nil {
					errs.Add(1)
					continue
				}
				mine = append(mine, time.Since(t))
				n.Add(1)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	m := Metrics{"conn_per_s": float64(n.Load()) / sz.CRRDuration.Seconds(), "errors": float64(errs.Load())}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	m["p99_us"] = percentile(lat, 99)
	return m, nil
}

func udpRR(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	c, err := net.Dial("udp", in.Addr("udp").String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg, buf := make([]byte, 64), make([]byte, 2048)
	var lat []time.Duration
	drops := 0
	t0 := time.Now()
	for i := 0; i < sz.UDPMessages && ctx.Err() == nil; i++ {
		t := time.Now()
		c.Write(msg)
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			drops++
			continue
		}
		lat = append(lat, time.Since(t))
	}
	m := Metrics{"pps": float64(len(lat)) / time.Since(t0).Seconds(), "drops": float64(drops)}
	latencyMetrics(lat, m)
	return m, nil
}

func retry(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	addr := in.Addr("retry").String()
	msg, buf := make([]byte, 64), make([]byte, 64)
	var lat []time.Duration
	errs := 0
	for i := 0; i < sz.RetryConns && ctx.Err() == nil; i++ {
		t := time.Now()
		// 2 s covers any proxy's three 250 ms connect attempts; a client
		// sent to the black hole itself (direct, the kernel modes) gives up.
		if err := oneShotWithin(addr, msg, buf, 2*time.Second); err != nil {
			errs++
			continue
		}
		lat = append(lat, time.Since(t))
	}
	m := Metrics{"error_pct": 100 * float64(errs) / float64(sz.RetryConns)}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	m["p99_us"] = percentile(lat, 99)
	return m, nil
}

func affinity(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	addr := in.Addr("affinity").String()
	sticky := 0
	used := map[string]bool{}
	for ip := 0; ip < sz.AffinityIPs && ctx.Err() == nil; ip++ {
		mode := ""
		if k, ok := in.System.(sluiceKernel); ok {
			mode = k.mode
		}
		sources := in.Topo.SourcesFor(mode)
		src := sources[ip%len(sources)]
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext:       (&net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}).DialContext,
		}}
		seen := map[string]bool{}
		for r := 0; r < sz.AffinityReqs; r++ {
			resp, err := client.Get("http://" + addr + "/")
			if err != nil {
				return nil, err
			}
			resp.Body.Close()
			seen[resp.Header.Get("X-Backend")] = true
			used[resp.Header.Get("X-Backend")] = true
		}
		if len(seen) == 1 {
			sticky++
		}
	}
	return Metrics{"sticky_pct": 100 * float64(sticky) / float64(sz.AffinityIPs), "backends_used": float64(len(used))}, nil
}

func idle(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	if in.Proc == nil || IsKernelMode(in.System) { // no process holds the connections
		return nil, errNotApplicable
	}
	addr := in.Addr("echo").String()
	// Each proxied connection costs the proxy two descriptors or more,
	// and the harness two (client and backend): the descriptor limit caps
	// n, the same for every system, under HAProxy's maxconn.
	n := min(sz.IdleConns, proxiedConnLimit()-100)
	// RSS per connection is the slope over the second half of the
	// connections held: by then the process is in steady state (pools, GC
	// pacing), which a difference from zero connections would mix in (it
	// can even come out negative when a collection returns earlier
	// garbage meanwhile).
	type sample struct {
		conns int
		rss   int64
	}
	var samples []sample
	socks0 := in.Sockets()
	conns := make([]net.Conn, 0, n)
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	defer closeAll()
	buf := []byte{1}
	var failed error
	for i := 0; i < n && ctx.Err() == nil && failed == nil; i++ {
		if i%250 == 0 {
			samples = append(samples, sample{i, in.Usage().RSSBytes})
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			failed = err
			break
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(buf); err != nil {
			failed = err
		} else if _, err := io.ReadFull(c, buf); err != nil {
			failed = err
		}
		if failed != nil {
			c.Close()
			break
		}
		conns = append(conns, c)
	}
	after := in.Usage().RSSBytes
	mid := samples[len(samples)/2]
	if failed != nil && (len(conns) < n/10 || mid.conns >= len(conns)) {
		return nil, fmt.Errorf("after %d connections: %w", len(conns), failed)
	}
	// A system that stopped short (out of descriptors: the goroutine
	// proxies' idle splices hold a pipe per direction) is measured on the
	// connections it held; held_all says whether it held all n.
	m := Metrics{"rss_bytes_per_conn": float64(after-mid.rss) / float64(len(conns)-mid.conns), "conns": float64(len(conns)), "held_all": 1}
	var short []string
	if len(conns) < n {
		m["held_all"] = 0
		why := failed
		if why == nil {
			why = ctx.Err()
		}
		short = append(short, fmt.Sprintf("held %d of %d connections: %v", len(conns), n, why))
	}
	// Thousands of connections closing at once are a storm of FINs
	// through the proxy and the backends; the next run must not start in
	// it (under emulation it delays handshakes past the 250 ms connect
	// timeout). Wait until the system has closed the connections'
	// sockets, on a clock of its own (the run's may have run out while
	// connecting), and report how long that took. Pipes do not count: Go
	// pools its splice pipes until a collection.
	closeAll() // the deferred call closes them again, harmlessly
	released := time.Now()
	for socks := in.Sockets(); socks > socks0+50; socks = in.Sockets() {
		if time.Since(released) > 2*time.Minute || errors.Is(ctx.Err(), context.Canceled) {
			short = append(short, fmt.Sprintf("still held %d sockets %s after the connections closed (%d before them)", socks, time.Since(released).Round(time.Second), socks0))
			break
		}
		time.Sleep(100 * time.Millisecond) // polling /proc: no event tells of a process closing descriptors
	}
	if len(short) == 0 {
		m["release_s"] = time.Since(released).Seconds()
		return m, nil
	}
	return m, stoppedShort{errors.New(strings.Join(short, "; "))}
}

func slowReader(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	if in.Proc == nil || IsKernelMode(in.System) {
		return nil, errNotApplicable
	}
	c, err := net.DialTimeout("tcp", in.Addr("push").String(), 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	before := in.Usage().RSSBytes
	peak := before
	buf := make([]byte, 100<<10)
	end := time.Now().Add(sz.SlowFor)
	for time.Now().Before(end) && ctx.Err() == nil {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond) // the slow reader: 1 MB/s
		if r := in.Usage().RSSBytes; r > peak {
			peak = r
		}
	}
	return Metrics{"rss_growth_MB": float64(peak-before) / 1e6}, nil
}

func halfClose(_ context.Context, in *Instance, _ Size) (Metrics, error) {
	c, err := net.DialTimeout("tcp", in.Addr("halfclose").String(), 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := make([]byte, 100<<10)
	if _, err := c.Write(req); err != nil {
		return nil, err
	}
	c.(*net.TCPConn).CloseWrite()
	reply, _ := io.ReadAll(c)
	if string(reply) == fmt.Sprint(len(req)) {
		return Metrics{"pass": 1}, nil
	}
	return Metrics{"pass": 0}, nil
}

var wrkRPS = regexp.MustCompile(`Requests/sec:\s+([\d.]+)`)
var wrkP99 = regexp.MustCompile(`\s99%\s+([\d.]+)(us|ms|s)`)

func wrkRun(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	if _, err := exec.LookPath("wrk"); err != nil {
		return nil, errors.New("wrk not installed (apt-get install wrk)")
	}
	cmd := exec.CommandContext(ctx, "wrk", "-t2", "-c64", fmt.Sprintf("-d%ds", max(1, int(sz.WrkDuration.Seconds()))), "--latency", "http://"+in.Addr("http").String()+"/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("wrk: %v: %s", err, out)
	}
	m := Metrics{}
	if r := wrkRPS.FindSubmatch(out); r != nil {
		m["req_per_s"], _ = strconv.ParseFloat(string(r[1]), 64)
	} else {
		return nil, fmt.Errorf("wrk output not understood: %s", out)
	}
	if r := wrkP99.FindSubmatch(out); r != nil {
		v, _ := strconv.ParseFloat(string(r[1]), 64)
		switch string(r[2]) {
		case "ms":
			v *= 1e3
		case "s":
			v *= 1e6
		}
		m["p99_us"] = v
	}
	if s := bufio.NewScanner(strings.NewReader(string(out))); s != nil {
		for s.Scan() {
			if strings.Contains(s.Text(), "Non-2xx") || strings.Contains(s.Text(), "Socket errors") {
				m["errors"]++
			}
		}
	}
	return m, nil
}

var errNotApplicable = errors.New("n/a")

// stoppedShort is what a workload returns with its metrics when it
// measured less than it set out to (a system that ran out of descriptors,
// the run's time limit): the metrics stand, and the report says why.
type stoppedShort struct{ why error }

func (s stoppedShort) Error() string { return "stopped short: " + s.why.Error() }
func (s stoppedShort) Unwrap() error { return s.why }

// iperf runs iperf3 through the system, one stream, either direction, and
// reports the receiver's rate.
func iperf(reverse bool) func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	return func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
		got, err := runIperf(ctx, in, reverse, "-t", fmt.Sprint(sz.IperfSeconds))
		if err != nil {
			return nil, err
		}
		return Metrics{"Gbit_per_s": got.BitsPerSecond / 1e9}, nil
	}
}

// iperfReceived is what the receiving end of an iperf3 test took.
type iperfReceived struct {
	Bytes         float64 `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
}

// runIperf runs one iperf3 stream through the system's "iperf" service,
// either direction, with how long or how much (-t or -n) in limit.
func runIperf(ctx context.Context, in *Instance, reverse bool, limit ...string) (iperfReceived, error) {
	a := in.Addr("iperf")
	args := append([]string{"-c", a.Addr().String(), "-p", fmt.Sprint(a.Port()), "-J"}, limit...)
	if reverse {
		args = append(args, "-R")
	}
	out, err := exec.CommandContext(ctx, "iperf3", args...).Output()
	if err != nil {
		return iperfReceived{}, fmt.Errorf("iperf3 %v: %v: %s", args, err, out)
	}
	return parseIperf(out)
}

// parseIperf reads the receiver's sum from iperf3's -J report.
func parseIperf(out []byte) (iperfReceived, error) {
	var res struct {
		End struct {
			SumReceived *iperfReceived `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return iperfReceived{}, fmt.Errorf("iperf3 output: %v", err)
	}
	if res.Error != "" {
		return iperfReceived{}, fmt.Errorf("iperf3: %s", res.Error)
	}
	if res.End.SumReceived == nil {
		return iperfReceived{}, errors.New("iperf3 output: no end.sum_received")
	}
	return *res.End.SumReceived, nil
}

// udpPacedRate is the "moderate rate" of the UDP drop target, in
// datagrams per second over all flows; udpPacedFlows share it.
const (
	udpPacedRate  = 10000
	udpPacedFlows = 8
)

// udpPaced sends at udpPacedRate for the workload's duration, spread over
// udpPacedFlows client sockets, and counts the replies: what a proxy loses
// when it is not the bottleneck of a request/response loop.
func udpPaced(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	addr := in.Addr("udp").String()
	dur := sz.CRRDuration
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < udpPacedFlows; i++ {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
	}
	var got atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 2048)
			for {
				if _, err := c.Read(buf); err != nil {
					return // the deadline after the last send
				}
				got.Add(1)
			}
		}()
	}
	msg := make([]byte, 64)
	sent := 0
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	for ctx.Err() == nil {
		el := time.Since(start)
		if el >= dur {
			break
		}
		// Catch up to the rate: a late tick sends what it owes.
		for due := int(el.Seconds() * udpPacedRate); sent < due; sent++ {
			conns[sent%len(conns)].Write(msg)
		}
		<-tick.C
	}
	tick.Stop()
	elapsed := time.Since(start)
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) // stragglers
	}
	wg.Wait()
	if sent == 0 {
		return nil, ctx.Err()
	}
	lost := sent - int(got.Load())
	return Metrics{"loss_pct": 100 * float64(max(lost, 0)) / float64(sent), "lost": float64(max(lost, 0)), "sent_per_s": float64(sent) / elapsed.Seconds()}, nil
}

// udpFlows opens many client sockets at once; each sends one datagram and
// waits for its reply: the cost of creating flows, and whether any is lost.
func udpFlows(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	addr := in.Addr("udp").String()
	var ok, lost atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	t := time.Now()
	for i := 0; i < sz.UDPClients && ctx.Err() == nil; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.Dial("udp", addr)
			if err != nil {
				lost.Add(1)
				return
			}
			defer c.Close()
			buf := make([]byte, 128)
			c.Write(buf[:64])
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(buf); err != nil {
				lost.Add(1)
				return
			}
			ok.Add(1)
		}()
	}
	wg.Wait()
	return Metrics{"flows_per_s": float64(ok.Load()) / time.Since(t).Seconds(), "lost": float64(lost.Load())}, nil
}

// restarter is a system that can be restarted beside itself: sluice's
// hand-over, HAProxy's seamless reload.
type restarter interface {
	restart(in *Instance) (*Proc, error)
}

// restartLoad is the restart workload: four clients open a new
// connection per 64 B request without pause while the system is
// restarted three times; it counts the failed connections and the
// longest time no client got an answer (the outage).
func restartLoad(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	r, ok := in.System.(restarter)
	if !ok || in.Proc == nil || IsKernelMode(in.System) {
		return nil, errNotApplicable
	}
	addr := in.Addr("echo").String()
	var n, errs atomic.Int64
	var lastOK atomic.Int64 // unix nanoseconds of the latest answer
	var gapMu sync.Mutex
	var maxGap time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	lastOK.Store(time.Now().UnixNano())
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg, buf := make([]byte, 64), make([]byte, 64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := oneShot(addr, msg, buf); err != nil {
					errs.Add(1)
					continue
				}
				now := time.Now().UnixNano()
				if gap := time.Duration(now - lastOK.Swap(now)); gap > 0 {
					gapMu.Lock()
					maxGap = max(maxGap, gap)
					gapMu.Unlock()
				}
				n.Add(1)
			}
		}()
	}
	start := time.Now()
	var rerr error
	var olds []*Proc
	for i := 0; i < 3 && rerr == nil && ctx.Err() == nil; i++ {
		time.Sleep(sz.CRRDuration / 2) // load before each restart
		old := in.Proc
		next, err := r.restart(in)
		if err != nil {
			rerr = err
			break
		}
		in.Proc = next
		olds = append(olds, old)
	}
	time.Sleep(sz.CRRDuration / 2)
	close(stop)
	wg.Wait()
	took := time.Since(start)
	for _, old := range olds { // they retire by themselves; reap them
		if !old.WaitFor(30*time.Second, func() bool { return false }) {
			old.Stop(5 * time.Second)
		}
	}
	m := Metrics{"failed_conns": float64(errs.Load()), "conn_per_s": float64(n.Load()) / took.Seconds(), "max_gap_ms": float64(maxGap) / 1e6, "restarts": float64(len(olds))}
	return m, rerr
}
