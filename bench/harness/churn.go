//go:build linux

package harness

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// churn measures the control plane: with n services loaded, how long from
// an EndpointSlice edit on disk to the data plane sending new connections to
// the new endpoint, while a steady stream of new connections runs against
// another service (errors and p99 under churn). Only sluice has this path
// (the peers would need a reload); the others are n/a. The userspace
// engines share one control plane, so the event loop stands for both; a
// kernel mode's number includes its rule sync (iptables-restore).
func churn(n int) func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	return func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
		switch sl := in.System.(type) {
		case sluiceKernel:
			if n > sz.MaxKernelChurn {
				return nil, errNotApplicable
			}
			return kernelChurn(ctx, in, sl.mode, n, sz)
		case sluice:
			if sl.engine != "eventloop" || n > sz.MaxChurn {
				return nil, errNotApplicable
			}
			return userspaceChurn(ctx, in, sl, n, sz)
		}
		return nil, errNotApplicable
	}
}

// churnManifest renders the churn services: the probe (one endpoint, which
// the flips move), an optional load service, and n others that cost the
// control plane (parse, build, diff; in a kernel mode, their rules).
func churnManifest(n int, probe svcSpec, load *svcSpec, fillerClusterIP func(i int) netip.Addr) string {
	var m strings.Builder
	svc := func(s svcSpec) {
		fmt.Fprintf(&m, "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: churn}\nspec:\n", s.name)
		if s.nodePort != 0 {
			fmt.Fprintf(&m, "  type: NodePort\n  ports: [{name: p, port: 80, nodePort: %d}]\n---\n", s.nodePort)
		} else {
			fmt.Fprintf(&m, "  clusterIP: %s\n  ports: [{name: p, port: 80}]\n---\n", s.clusterIP)
		}
		fmt.Fprintf(&m, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s, namespace: churn, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{name: p, port: %d}]\nendpoints:\n", s.name, s.name, s.endpoint.Port())
		fmt.Fprintf(&m, "- addresses: [%q]\n---\n", s.endpoint.Addr())
	}
	svc(probe)
	if load != nil {
		svc(*load)
	}
	for i := 0; i < n; i++ {
		// Without a clusterIP (userspace) they cost no socket; with one
		// (kernel modes) they cost their chains, as in a real cluster.
		cip := ""
		if fillerClusterIP != nil {
			cip = fmt.Sprintf("\n  clusterIP: %s", fillerClusterIP(i))
		}
		fmt.Fprintf(&m, "apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: churn}\nspec:%s\n  ports: [{name: p, port: 80}]\n---\n", i, cip)
		fmt.Fprintf(&m, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s%d, namespace: churn, labels: {kubernetes.io/service-name: s%d}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints: [{addresses: [\"172.20.%d.%d\"]}, {addresses: [\"172.21.%d.%d\"]}]\n---\n", i, i, i/250, i%250, i/250, i%250)
	}
	return m.String()
}

type svcSpec struct {
	name      string
	nodePort  uint16     // userspace: the port the engine listens on
	clusterIP netip.Addr // kernel modes
	endpoint  netip.AddrPort
}

// stageAtomically writes content beside file and returns the rename that
// replaces file with it in one step, so a watcher never reads half of it.
// The flips time the rename, not the rendering and writing before it (at
// 10k Services those were 20-50 ms of the harness's own on this box).
func stageAtomically(file, content string) (commit func() error, err error) {
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return nil, err
	}
	return func() error { return os.Rename(tmp, file) }, nil
}

// servedAfter is flip i's write-to-effect: from its write (written) to
// when the backend it moved to served the first probe that reached it
// (served, on the same clock). That is an upper bound on when the update
// took effect, tighter than the probe's seeing it by the response's way
// back and the probe's own turn.
func servedAfter(i int, written, served time.Time) (time.Duration, error) {
	if served.IsZero() {
		return 0, fmt.Errorf("update %d: the backend's answer has no X-Served-At", i)
	}
	took := served.Sub(written)
	if took <= 0 {
		return 0, fmt.Errorf("update %d: served %v before its write", i, -took)
	}
	return took, nil
}

// writeNow stages and commits at once (the set-up's writes, not timed).
func writeNow(stage func(netip.AddrPort) (func() error, error), ep netip.AddrPort) error {
	commit, err := stage(ep)
	if err != nil {
		return err
	}
	return commit()
}

// rawBackendOf is backendOf for flips, over a bare connection to addr:
// an HTTP/1.0 request written at once and the answer's head read, with
// no client goroutines and no pool, so that each poll costs the box as
// little as a new connection through the proxy can. It says which backend
// served the request and when (its X-Served-At); "" on any error, and a
// zero time when the answer has no valid X-Served-At.
func rawBackendOf(addr string) func() (string, time.Time) {
	req := []byte("GET / HTTP/1.0\r\n\r\n")
	return func() (string, time.Time) {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return "", time.Time{}
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write(req); err != nil {
			return "", time.Time{}
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", time.Time{}
		}
		var at time.Time
		if ns, err := strconv.ParseInt(resp.Header.Get("X-Served-At"), 10, 64); err == nil && ns > 0 {
			at = time.Unix(0, ns)
		}
		return resp.Header.Get("X-Backend"), at
	}
}

// backendOf asks url which HTTP backend answers ("" on any error).
func backendOf(client *http.Client, url string) string {
	resp, err := client.Get(url)
	if err != nil {
		return ""
	}
	resp.Body.Close()
	return resp.Header.Get("X-Backend")
}

func userspaceChurn(ctx context.Context, in *Instance, sl sluice, n int, sz Size) (Metrics, error) {
	topo := in.Topo
	httpBackends := in.Services["http"].Backends
	echo := in.Services["echo"].Backends
	dir, err := os.MkdirTemp("", "sluice-churn-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	probePort, err := topo.FreePort("tcp")
	if err != nil {
		return nil, err
	}
	loadPort, err := topo.FreePort("tcp")
	if err != nil {
		return nil, err
	}
	file := filepath.Join(dir, "services.yaml")
	var written []time.Time
	stage := func(probe netip.AddrPort) (func() error, error) {
		commit, err := stageAtomically(file, churnManifest(n, svcSpec{name: "probe", nodePort: probePort, endpoint: probe},
			&svcSpec{name: "load", nodePort: loadPort, endpoint: echo[0]}, nil))
		if err != nil {
			return nil, err
		}
		return func() error {
			written = append(written, time.Now())
			return commit()
		}, nil
	}
	if err := writeNow(stage, httpBackends[0]); err != nil {
		return nil, err
	}
	metricsPort, err := topo.FreePort("tcp")
	if err != nil {
		return nil, err
	}
	metrics := netip.AddrPortFrom(topo.LB, metricsPort).String()
	started := time.Now()
	proc, err := StartProc("sluice-churn", Anywhere(), topo.InNode(sl.bin, "--manifests", dir, "--bind-address", topo.LB.String(), "--userspace-capture=none",
		"--healthz-bind-address=", "--metrics-bind-address="+metrics, "--manifest-coalesce", "1ms")...)
	if err != nil {
		return nil, err
	}
	defer proc.Stop(5 * time.Second)
	probe := fmt.Sprintf("http://%s/", netip.AddrPortFrom(topo.LB, probePort))
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	// Until sluice says it is ready (the first state wholly applied), not
	// only until the probe answers: its listener opens part-way through
	// the first apply, and a flip written then measured the start-up (at
	// 10k Services 80-130 ms, where the later flips took 15-25).
	if !proc.WaitFor(2*time.Minute, func() bool {
		return strings.Contains(proc.Output(), " ready: ") && backendOf(client, probe) == "0"
	}) {
		return nil, fmt.Errorf("sluice with %d services did not come up:\n%s", n, proc.Output())
	}
	var effects []time.Duration
	defer saveProcLog(proc, started, fmt.Sprintf("%s-churn-%d", sl.Name(), n), func() ([]time.Time, []time.Duration) { return written[1:], effects })
	m, effects, err := flips(ctx, n, manifestFlips, sz, stage, httpBackends, rawBackendOf(netip.AddrPortFrom(topo.LB, probePort).String()),
		netip.AddrPortFrom(topo.LB, loadPort).String(), nil)
	if m != nil {
		ownShare(m, "http://"+metrics+"/metrics")
	}
	return m, err
}

// manifestFlips is how many times the userspace churn moves the probe's
// endpoint by a manifest edit: enough for a p90 that is not the worst.
const manifestFlips = 20

// kernelChurn adds n services and a probe to the running kernel-mode
// instance's manifests directory, measures the flips, and takes them out
// again (waiting until the probe's rules are gone).
func kernelChurn(ctx context.Context, in *Instance, mode string, n int, sz Size) (Metrics, error) {
	httpBackends := in.Services["http"].Backends
	file := filepath.Join(in.Dir, "manifests", "churn.yaml")
	probeIP := in.Topo.ClusterIP(mode, 1, 0)
	filler := func(i int) netip.Addr { return in.Topo.ClusterIP(mode, 8, i) }
	stage := func(probe netip.AddrPort) (func() error, error) {
		return stageAtomically(file, churnManifest(n, svcSpec{name: "probe", clusterIP: probeIP, endpoint: probe}, nil, filler))
	}
	if err := writeNow(stage, httpBackends[0]); err != nil {
		return nil, err
	}
	probe := fmt.Sprintf("http://%s/", netip.AddrPortFrom(probeIP, 80))
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	defer func() {
		os.Remove(file)
		// Until the probe's rules are gone, so the next workload meets the
		// usual rule set (a gone ClusterIP is unroutable at the node; IPVS
		// mode's address leaves kube-ipvs0 with it).
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			c, err := net.DialTimeout("tcp", probeIP.String()+":80", 500*time.Millisecond)
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if !in.Proc.WaitFor(3*time.Minute, func() bool { return backendOf(client, probe) == "0" }) {
		return nil, fmt.Errorf("%s with %d more services: the probe never answered:\n%s", in.System.Name(), n, in.Proc.Output())
	}
	m, _, err := flips(ctx, n, 0, sz, stage, httpBackends, rawBackendOf(netip.AddrPortFrom(probeIP, 80).String()), in.Addr("echo").String(), nil)
	return m, err
}

// The pace of flips' two loops. Unpaced, the load's new connections and
// the probe's polls each kept a core busy (a connection through the
// proxy and the backend per turn), which on two cores left the API
// server, its watchers and the proxy waiting for CPU: the measurement
// made the outliers it measured. Paced, the load is a new connection per
// millisecond at most, and an effect is seen within about a poll gap
// (plus a probe) of the moment it is served.
const (
	flipLoadEvery = time.Millisecond
	flipPollGap   = 100 * time.Microsecond
)

// pause sleeps d in the kernel (nanosleep(2)), not on the Go runtime's
// timers, which wait a millisecond at least when nothing else wakes the
// process (its poller's timeout is in milliseconds): a 100 us time.Sleep
// took 1.07-1.17 ms here, and the flips' poll gap with it; nanosleep takes
// d and the kernel's timer slack (50 us).
func pause(d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}

// flips moves the probe's endpoint back and forth with stage's commits,
// count times (0: 3, or 6 with the long mode's message count), timing each move
// from its write to when the backend it moved to served the first probe
// backendOf sent there (servedAfter), while new connections run against
// load. It returns the moves' times in the order they were made beside the
// metrics; probe_lag_* is how much later than that the probe saw it, which
// the figures before the backends' X-Served-At included. seen (nil: none)
// is called once each move has been seen, before the next.
func flips(ctx context.Context, n, count int, sz Size, stage func(netip.AddrPort) (commit func() error, err error), httpBackends []netip.AddrPort, backendOf func() (string, time.Time), load string, seen func() error) (Metrics, []time.Duration, error) {
	var loadErrs atomic.Int64
	var loadMu sync.Mutex
	var loadLat []time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64)
		for {
			select {
			case <-stop:
				return
			default:
			}
			t := time.Now()
			err := oneShot(load, buf, buf)
			if err != nil {
				loadErrs.Add(1)
			} else {
				loadMu.Lock()
				loadLat = append(loadLat, time.Since(t))
				loadMu.Unlock()
			}
			pause(time.Until(t.Add(flipLoadEvery)))
		}
	}()
	if count == 0 {
		count = 3
		if sz.RRMessages > 5000 {
			count = 6
		}
	}
	var effect, lag []time.Duration
	for i := 1; i <= count && ctx.Err() == nil; i++ {
		want := fmt.Sprint(i % 2)
		commit, err := stage(httpBackends[i%2])
		t := time.Now()
		if err == nil {
			err = commit()
		}
		if err != nil {
			close(stop)
			wg.Wait()
			return nil, nil, err
		}
		var served time.Time
		for {
			got, at := backendOf()
			if got == want {
				served = at
				break
			}
			if time.Since(t) > time.Minute {
				close(stop)
				wg.Wait()
				return nil, nil, fmt.Errorf("update %d never took effect with %d services", i, n)
			}
			pause(flipPollGap)
		}
		sawAt := time.Since(t)
		took, err := servedAfter(i, t, served)
		if err != nil {
			close(stop)
			wg.Wait()
			return nil, nil, err
		}
		effect = append(effect, took)
		lag = append(lag, sawAt-took)
		if seen != nil {
			if err := seen(); err != nil {
				close(stop)
				wg.Wait()
				return nil, nil, fmt.Errorf("update %d: %w", i, err)
			}
		}
	}
	close(stop)
	wg.Wait()
	if len(effect) == 0 {
		return nil, nil, ctx.Err()
	}
	inOrder := slices.Clone(effect)
	first := effect[0] // the first after start-up, which meets its leftovers
	sort.Slice(effect, func(i, j int) bool { return effect[i] < effect[j] })
	sort.Slice(loadLat, func(i, j int) bool { return loadLat[i] < loadLat[j] })
	slices.Sort(lag)
	return Metrics{
		"probe_lag_p50_ms": float64(lag[len(lag)/2].Microseconds()) / 1e3,
		"probe_lag_max_ms": float64(lag[len(lag)-1].Microseconds()) / 1e3,
		"update_p50_ms":    float64(effect[len(effect)/2].Microseconds()) / 1e3,
		"update_max_ms":    float64(effect[len(effect)-1].Microseconds()) / 1e3,
		"update_p90_ms":    float64(effect[len(effect)*9/10].Microseconds()) / 1e3,
		"update_first_ms":  float64(first.Microseconds()) / 1e3,
		"load_errors":      float64(loadErrs.Load()),
		"load_p99_us":      percentile(loadLat, 99),
	}, inOrder, nil
}
