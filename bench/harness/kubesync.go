//go:build linux

package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// The kernel-mode sync benchmark against upstream kube-proxy: the same
// real kube-apiserver holding N services (10 endpoints each, on another
// node), the same flags, the same node, in a private network namespace;
// kube-proxy and sluice take turns (the first one alternates by round).
// Each proxy's own sync histograms (kubeproxy_sync_full_proxy_rules_
// duration_seconds and ..._partial_..., which sluice exports as kube-proxy
// does) give its first full sync and, after one EndpointSlice update, its
// partial sync; ready_s is from the process start to the first full sync
// of every family, so it includes the initial list from the API.

// modeName is the mode with its backend, as the report names it.
func (r KubeSyncResult) modeName() string {
	if r.Backend != "" {
		return r.Mode + " (" + r.Backend + ")"
	}
	return r.Mode
}

// KubeSyncResult is one proxy's syncs in one mode at one size and round.
type KubeSyncResult struct {
	Proxy    string  `json:"proxy"` // kube-proxy or sluice
	Mode     string  `json:"mode"`
	Backend  string  `json:"backend,omitempty"` // iptables mode: nft or legacy
	Services int     `json:"services"`
	Round    int     `json:"round"`
	ReadyS   float64 `json:"readyS"`
	FullS    float64 `json:"fullS"`    // sum over families of the first full syncs
	PartialS float64 `json:"partialS"` // the IPv4 partial sync one update caused
	// RSSMB and PeakRSSMB are the proxy's resident memory after the
	// partial sync (VmRSS) and its high-water mark (VmHWM), in MiB.
	RSSMB     float64 `json:"rssMB"`
	PeakRSSMB float64 `json:"peakRssMB"`
	// EffectMS are the probe Service's endpoint moves, each from the
	// EndpointSlice update call to the first new connection to its
	// ClusterIP that reaches the new endpoint, in milliseconds: the
	// proxy's whole write-to-effect at this size, its sync included.
	EffectMS []float64 `json:"effectMs,omitempty"`
	Failed   string    `json:"failed,omitempty"`
}

// procMemMB reads VmRSS and VmHWM of pid, in MiB.
func procMemMB(pid int) (rss, peak float64) {
	mb := procStatusMB(pid, "VmRSS:", "VmHWM:")
	return mb[0], mb[1]
}

// procAnonMB is pid's anonymous resident memory (RssAnon): its heap,
// stacks and runtime structures, without the binary's mapped pages.
func procAnonMB(pid int) float64 { return procStatusMB(pid, "RssAnon:")[0] }

// procStatusMB reads the named kB fields of /proc/pid/status in MiB, in
// the order asked (0 for one not found, or when pid is gone).
func procStatusMB(pid int, fields ...string) []float64 {
	out := make([]float64, len(fields))
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		if i := slices.Index(fields, f[0]); i >= 0 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			out[i] = kb / 1024
		}
	}
	return out
}

// KubeSyncConfig says what to run.
type KubeSyncConfig struct {
	Sluice, KubeProxy string
	Modes             []string
	Sizes             []int
	// Proxies are the proxies run, in the first round's order (empty:
	// kube-proxy, then sluice).
	Proxies []string
	// Backends are the iptables both proxies find as `iptables` on PATH
	// in iptables mode, each run in turn at every size and round: nft or
	// legacy (a directory of links put first on their PATH). Empty: the
	// system's iptables.
	Backends []string
	Rounds   int
	Limit    time.Duration // per sync
	Logf     func(string, ...any)

	pathDirs map[string]string // backend -> its directory of links
}

// env is the proxies' environment: the backend's links first on PATH.
func (cfg KubeSyncConfig) env(backend string) []string {
	env := os.Environ()
	if dir := cfg.pathDirs[backend]; dir != "" {
		env = append(env, "PATH="+dir+":"+os.Getenv("PATH"))
	}
	return env
}

// kubeSyncVariant is one mode as a run takes it: iptables mode once per
// backend, nftables mode once.
type kubeSyncVariant struct{ mode, backend string }

func (cfg KubeSyncConfig) variants() []kubeSyncVariant {
	var out []kubeSyncVariant
	for _, mode := range cfg.Modes {
		if mode != "iptables" || len(cfg.Backends) == 0 {
			out = append(out, kubeSyncVariant{mode: mode})
			continue
		}
		for _, b := range cfg.Backends {
			out = append(out, kubeSyncVariant{mode, b})
		}
	}
	return out
}

// RunKubeSyncBench runs every size, mode and round; it must run in a
// private network namespace (it programs the kernel's tables).
func RunKubeSyncBench(cfg KubeSyncConfig) ([]KubeSyncResult, error) {
	var out []KubeSyncResult
	if err := kubeSyncNode(); err != nil {
		return nil, err
	}
	cfg.pathDirs = map[string]string{}
	for _, backend := range cfg.Backends {
		dir, err := os.MkdirTemp("", "sluice-kube-sync-bin-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		for _, c := range []string{"iptables", "ip6tables"} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				target, err := exec.LookPath(c + "-" + backend + suffix)
				if err != nil {
					return nil, err
				}
				if err := os.Symlink(target, filepath.Join(dir, c+suffix)); err != nil {
					return nil, err
				}
			}
		}
		cfg.pathDirs[backend] = dir
	}
	for _, n := range cfg.Sizes {
		res, err := kubeSyncSize(cfg, n)
		out = append(out, res...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// The probe Service's two endpoints: addresses of this namespace (on the
// veth's other end), each with a listener of the bench's that answers
// with its index, so a connection to the ClusterIP shows which endpoint
// the proxy's rules chose.
var kubeSyncProbeEndpoints = [2]netip.AddrPort{
	netip.MustParseAddrPort("192.168.10.2:8080"), netip.MustParseAddrPort("192.168.10.3:8080")}

// kubeSyncNode gives this namespace the node's address on a veth pair
// that leads nowhere, the probe's endpoint addresses, and a route for the
// service range (through the same veth), so that a connection to a
// ClusterIP from here gets to the proxies' rules.
func kubeSyncNode() error {
	for _, args := range [][]string{
		{"link", "add", "ksync0", "type", "veth", "peer", "name", "ksync1"},
		{"link", "set", "ksync0", "up"}, {"link", "set", "ksync1", "up"}, {"link", "set", "lo", "up"},
		{"addr", "add", "192.168.10.1/24", "dev", "ksync0"},
		{"addr", "add", kubeSyncProbeEndpoints[0].Addr().String() + "/32", "dev", "ksync1"},
		{"addr", "add", kubeSyncProbeEndpoints[1].Addr().String() + "/32", "dev", "ksync1"},
		{"route", "add", kubetest.ServiceCIDR, "dev", "ksync0", "src", "192.168.10.1"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func kubeSyncSize(cfg KubeSyncConfig, n int) ([]KubeSyncResult, error) {
	tb := &benchTB{}
	defer tb.close()
	var cluster *kubetest.Cluster
	if err := tb.run(func() { cluster = kubetest.Start(tb) }); err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cluster.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = 2000, 2000
	client := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.10.1"}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := loadKubeSyncServices(ctx, client, n); err != nil {
		return nil, err
	}
	cfg.Logf("%d services x 10 endpoints loaded into kube-apiserver in %v", n, time.Since(t0).Round(time.Second))
	probe, err := startSyncProbe(ctx, client)
	if err != nil {
		return nil, err
	}
	defer probe.close()

	var out []KubeSyncResult
	update := 0
	for round := 0; round < cfg.Rounds; round++ {
		for _, v := range cfg.variants() {
			proxies := slices.Clone(cfg.Proxies)
			if len(proxies) == 0 {
				proxies = []string{"kube-proxy", "sluice"}
			}
			if round%2 == 1 {
				slices.Reverse(proxies)
			}
			for _, proxy := range proxies {
				update++
				r := runKubeSyncOnce(ctx, cfg, client, cluster.Kubeconfig, proxy, v, n, update, probe)
				r.Round = round + 1
				if r.Failed != "" {
					cfg.Logf("%-10s %-18s %6d services  round %d  FAILED: %s", proxy, r.modeName(), n, r.Round, r.Failed)
				} else {
					cfg.Logf("%-10s %-18s %6d services  round %d  ready %7.2f s  full sync %7.2f s  partial %7.3f s", proxy, r.modeName(), n, r.Round, r.ReadyS, r.FullS, r.PartialS)
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

func loadKubeSyncServices(ctx context.Context, client kubernetes.Interface, n int) error {
	return inParallelWorkers(n, func(i int) error { return createKubeSyncService(ctx, client, i, 10) })
}

// inParallelWorkers runs f(0) ... f(n-1) on 16 workers (the API server's
// write rate, not the client, bounds loading) and returns one error of
// those that failed.
func inParallelWorkers(n int, f func(i int) error) error {
	work := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

func kubeSyncSlice(i, endpoints int) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("s%d", i)
	port, pname, proto, nodeB := int32(8080), "p", corev1.ProtocolTCP, "node-b"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for j := 0; j < endpoints; j++ {
		a := netip.AddrFrom4([4]byte{10, byte(128 + i>>12), byte(i >> 4), byte(j + 16*(i&15))})
		ready := true
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: &nodeB,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return sl
}

func createKubeSyncService(ctx context.Context, client kubernetes.Interface, i, endpoints int) error {
	name := fmt.Sprintf("s%d", i)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service %s: %w", name, err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, kubeSyncSlice(i, endpoints), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create EndpointSlice %s: %w", name, err)
	}
	return nil
}

// syncSums reads a proxy's full sync histograms (sums and counts over
// every family) and its IPv4 partial sync histogram (an IPv4 Service's
// update leaves the IPv6 rules unchanged; kube-proxy then syncs only IPv4).
type syncSums struct{ fullSum, partialSum, fullCount, partialCount float64 }

func readSyncSums(url string) (syncSums, error) {
	var s syncSums
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v4 := strings.Contains(line, `ip_family="IPv4"`)
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
			if j := strings.LastIndexByte(line, '}'); j >= 0 {
				rest = strings.TrimSpace(line[j+1:])
			}
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			continue
		}
		switch name {
		case "kubeproxy_sync_full_proxy_rules_duration_seconds_sum":
			s.fullSum += v
		case "kubeproxy_sync_full_proxy_rules_duration_seconds_count":
			s.fullCount += v
		case "kubeproxy_sync_partial_proxy_rules_duration_seconds_sum":
			if v4 {
				s.partialSum += v
			}
		case "kubeproxy_sync_partial_proxy_rules_duration_seconds_count":
			if v4 {
				s.partialCount += v
			}
		}
	}
	return s, sc.Err()
}

func freeLoopbackPort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// runKubeSyncOnce starts one proxy, waits for its first full sync of both
// families, updates one EndpointSlice, waits for the partial syncs, and
// stops and cleans up after it.
func runKubeSyncOnce(ctx context.Context, cfg KubeSyncConfig, client kubernetes.Interface, kubeconfig, proxy string, v kubeSyncVariant, n, update int, probe *syncProbe) KubeSyncResult {
	mode := v.mode
	r := KubeSyncResult{Proxy: proxy, Mode: mode, Services: n}
	if mode == "iptables" {
		r.Backend = v.backend
		if r.Backend == "" {
			r.Backend = "default"
		}
	}
	bin := cfg.KubeProxy
	if proxy == "sluice" {
		bin = cfg.Sluice
	}
	hz, mp := freeLoopbackPort(), freeLoopbackPort()
	args := []string{"--kubeconfig=" + kubeconfig, "--hostname-override=node-a", "--proxy-mode=" + mode,
		"--cluster-cidr=10.128.0.0/9", "--nodeport-addresses=192.168.10.0/24",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp)}
	dir, _ := os.MkdirTemp("", "sluice-kube-sync-")
	defer os.RemoveAll(dir)
	if proxy == "sluice" {
		args = append(args, "--mode-fallback=false", "--handover-socket="+filepath.Join(dir, "h.sock"))
	}
	// SLUICE_BENCH_HEAP_PROFILE=DIR saves each proxy's heap profile after
	// its partial sync (both proxies serve pprof with --profiling), to see
	// where the resident memory the results report goes.
	heapDir := os.Getenv("SLUICE_BENCH_HEAP_PROFILE")
	if heapDir != "" {
		args = append(args, "--profiling")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = cfg.env(v.backend)
	logf, _ := os.Create(filepath.Join(dir, "log"))
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		r.Failed = err.Error()
		return r
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		cl := exec.Command(bin, "--cleanup", "--proxy-mode="+mode)
		cl.Env = cfg.env(v.backend)
		cl.Run()
		for _, b := range []string{"iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy"} {
			for _, t := range []string{"nat", "filter", "mangle"} {
				exec.Command(b, "-t", t, "-F").Run()
				exec.Command(b, "-t", t, "-X").Run()
			}
		}
	}
	defer stop()
	tail := func() string {
		data, _ := os.ReadFile(filepath.Join(dir, "log"))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		return strings.Join(lines[max(0, len(lines)-5):], " | ")
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)
	wait := func(what string, cond func(syncSums) bool) (syncSums, error) {
		deadline := time.Now().Add(cfg.Limit)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case err := <-done:
				done <- err
				return syncSums{}, fmt.Errorf("exited (%v) before %s: %s", err, what, tail())
			case <-tick.C:
			}
			if s, err := readSyncSums(url); err == nil && cond(s) {
				return s, nil
			}
			if time.Now().After(deadline) {
				return syncSums{}, fmt.Errorf("no %s within %s: %s", what, cfg.Limit, tail())
			}
		}
	}
	first, err := wait("full sync of both families", func(s syncSums) bool { return s.fullCount >= 2 })
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	r.ReadyS, r.FullS = time.Since(start).Seconds(), first.fullSum
	// One service loses an endpoint (and gets it back on the next update),
	// whatever the slice holds now: a run that failed before its update
	// leaves it as it was, and writing it again would change nothing.
	i := n / 2
	old, err := client.DiscoveryV1().EndpointSlices("default").Get(ctx, kubeSyncSlice(i, 0).Name, metav1.GetOptions{})
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	endpoints := 10
	if len(old.Endpoints) == 10 {
		endpoints = 9
	}
	sl := kubeSyncSlice(i, endpoints)
	sl.ResourceVersion = old.ResourceVersion
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		r.Failed = err.Error()
		return r
	}
	after, err := wait("partial sync after an update", func(s syncSums) bool {
		return s.partialCount > first.partialCount || s.fullCount > first.fullCount+1
	})
	if err != nil {
		r.Failed = err.Error()
		return r
	}
	if after.partialCount == first.partialCount {
		r.Failed = "the update caused a full sync, not a partial one"
		return r
	}
	r.PartialS = after.partialSum - first.partialSum
	// It serves: the probe's ClusterIP reaches its endpoint; then the
	// endpoint moves, timed from the write to the effect.
	if err := probe.serves(cfg.Limit); err != nil {
		r.Failed = err.Error()
		return r
	}
	for range syncProbeMoves {
		// A sync ran moments ago (the last move's, or the update's):
		// both proxies then hold the next for their minimum sync period
		// (1 s, the default of both), which a move right away would
		// measure instead of the sync.
		time.Sleep(syncProbeSpacing)
		d, err := probe.move(ctx, cfg.Limit)
		if err != nil {
			r.Failed = err.Error()
			return r
		}
		r.EffectMS = append(r.EffectMS, float64(d.Microseconds())/1e3)
	}
	r.RSSMB, r.PeakRSSMB = procMemMB(cmd.Process.Pid)
	if heapDir != "" {
		out := filepath.Join(heapDir, fmt.Sprintf("%s-%s-%d-%d.pprof", proxy, mode, n, update))
		if err := saveHeapProfile(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", mp), out); err != nil {
			cfg.Logf("heap profile of %s: %v", proxy, err)
		}
	}
	return r
}

// saveHeapProfile writes the pprof heap profile served at url to path.
func saveHeapProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteKubeSyncResults writes results.json and results.md (medians by
// proxy, mode and size, with sluice's ratio to kube-proxy) into dir.
func WriteKubeSyncResults(dir string, res []KubeSyncResult, limit time.Duration, machine string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	js, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644); err != nil {
		return "", err
	}
	type key struct {
		mode  string
		n     int
		proxy string
	}
	type vals struct{ ready, full, partial, rss, peak, effect []float64 }
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := slices.Clone(v)
		sort.Float64s(s)
		return sortedMedian(s)
	}
	by := map[key]*vals{}
	var failed []string
	failures := map[key]int{}
	for _, r := range res {
		if r.Failed != "" {
			failed = append(failed, fmt.Sprintf("- %s %s %d services, round %d: %s", r.Proxy, r.modeName(), r.Services, r.Round, r.Failed))
			failures[key{r.modeName(), r.Services, r.Proxy}]++
			continue
		}
		k := key{r.modeName(), r.Services, r.Proxy}
		if by[k] == nil {
			by[k] = &vals{}
		}
		by[k].ready = append(by[k].ready, r.ReadyS)
		by[k].full = append(by[k].full, r.FullS)
		by[k].partial = append(by[k].partial, r.PartialS)
		by[k].rss = append(by[k].rss, r.RSSMB)
		by[k].peak = append(by[k].peak, r.PeakRSSMB)
		by[k].effect = append(by[k].effect, r.EffectMS...)
	}
	var b strings.Builder
	b.WriteString("# Kernel-mode syncs beside upstream kube-proxy\n\n")
	b.WriteString("The same kube-apiserver holding N services x 10 endpoints, the same flags and node, in a private network namespace; each proxy's own sync histograms (full syncs summed over the IPv4 and IPv6 families; the partial sync is IPv4's, the family the update changes). `ready` runs from the process start to the first full sync of both families (the initial API list included). Medians of the rounds; the proxies alternate which runs first. `update to effect`: a probe Service whose endpoints answer in the namespace is moved from one endpoint to the other " + strconv.Itoa(syncProbeMoves) + " times a round, 1.5 s apart (past both proxies' 1 s minimum sync period), each timed from the EndpointSlice update call to the first new connection to its ClusterIP that reaches the new endpoint (median and worst of all moves); a run whose ClusterIP never reached its endpoint failed.\n\n")
	b.WriteString("| mode | services | proxy | ready s | first full sync s | one-Service partial sync s | update to effect p50 ms | max ms | RSS MiB | peak RSS MiB | rounds |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	var keys []key
	for k := range by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := strings.Compare(a.mode, b.mode); c != 0 {
			return c
		}
		if a.n != b.n {
			return a.n - b.n
		}
		return strings.Compare(a.proxy, b.proxy)
	})
	for _, k := range keys {
		v := by[k]
		fmt.Fprintf(&b, "| %s | %d | %s | %.2f | %.2f | %.3f | %.1f | %.1f | %.1f | %.1f | %d |\n", k.mode, k.n, k.proxy, med(v.ready), med(v.full), med(v.partial), med(v.effect), slices.Max(append([]float64{0}, v.effect...)), med(v.rss), med(v.peak), len(v.full))
	}
	// Memory per Service (one port, 10 endpoints): the growth of the
	// median RSS between consecutive sizes, which leaves the empty
	// process's share out (issue 16's budget: at most 2 KiB per port).
	b.WriteString("\nRSS per Service between sizes (KiB; one port and 10 endpoints each):\n\n| mode | proxy | from | to | KiB per Service |\n|---|---|---|---|---|\n")
	for i, k := range keys {
		for _, k2 := range keys[i+1:] {
			if k2.mode != k.mode || k2.proxy != k.proxy || k2.n <= k.n {
				continue
			}
			per := (med(by[k2].rss) - med(by[k].rss)) * 1024 / float64(k2.n-k.n)
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %.2f |\n", k.mode, k.proxy, k.n, k2.n, per)
			break
		}
	}
	b.WriteString("\nsluice / kube-proxy (below 1 is faster):\n\n| mode | services | first full sync | partial sync | update to effect p50 |\n|---|---|---|---|---|\n")
	for _, k := range keys {
		if k.proxy != "sluice" {
			continue
		}
		up := by[key{k.mode, k.n, "kube-proxy"}]
		if up == nil {
			if failures[key{k.mode, k.n, "kube-proxy"}] > 0 {
				// kube-proxy had no full sync within the limit in any
				// round: the ratio is at most sluice's time over the limit.
				fmt.Fprintf(&b, "| %s | %d | < %.3fx (kube-proxy: none within %s) | n/a | n/a |\n", k.mode, k.n, med(by[k].full)/limit.Seconds(), limit)
			}
			continue
		}
		ratio := func(a, b float64) string {
			if b == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2fx", a/b)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", k.mode, k.n, ratio(med(by[k].full), med(up.full)), ratio(med(by[k].partial), med(up.partial)), ratio(med(by[k].effect), med(up.effect)))
	}
	if len(failed) > 0 {
		b.WriteString("\nFailed:\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\nMachine:\n\n```\n" + machine + "\n```\n")
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	return b.String(), nil
}

// syncProbeMoves is how many times a run moves the probe's endpoint, and
// syncProbeSpacing the pause before each move: longer than the proxies'
// --iptables-min-sync-period (and --nftables-...), 1 s by default.
const (
	syncProbeMoves   = 3
	syncProbeSpacing = 1500 * time.Millisecond
	// syncProbeAskTimeout bounds one probe connection (see ask).
	syncProbeAskTimeout = 200 * time.Millisecond
)

// syncProbe is a Service whose endpoint answers in this namespace: one of
// kubeSyncProbeEndpoints, each served by a listener that writes its index
// and closes.
type syncProbe struct {
	client  kubernetes.Interface
	vip     netip.AddrPort
	uid     types.UID
	current int // the endpoint the slice holds
	lns     []net.Listener
}

func startSyncProbe(ctx context.Context, client kubernetes.Interface) (*syncProbe, error) {
	p := &syncProbe{client: client}
	for i, ep := range kubeSyncProbeEndpoints {
		ln, err := net.Listen("tcp", ep.String())
		if err != nil {
			p.close()
			return nil, fmt.Errorf("probe endpoint %s: %w", ep, err)
		}
		p.lns = append(p.lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte{byte('0' + i)})
				c.Close()
			}
		}()
	}
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		p.close()
		return nil, fmt.Errorf("create the probe Service: %w", err)
	}
	vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		p.close()
		return nil, fmt.Errorf("the probe Service's ClusterIP %q: %w", svc.Spec.ClusterIP, err)
	}
	p.vip, p.uid = netip.AddrPortFrom(vip, 80), svc.UID
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, p.slice(0), metav1.CreateOptions{}); err != nil {
		p.close()
		return nil, fmt.Errorf("create the probe's EndpointSlice: %w", err)
	}
	return p, nil
}

func (p *syncProbe) slice(i int) *discoveryv1.EndpointSlice {
	port, pname, proto, node, ready := int32(kubeSyncProbeEndpoints[i].Port()), "p", corev1.ProtocolTCP, "node-a", true
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "probe", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "probe"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{kubeSyncProbeEndpoints[i].Addr().String()}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
}

// ask opens a connection to the ClusterIP and returns the index of the
// endpoint that answered (-1: none did). It gives up after 200 ms (a
// connection inside the namespace takes well under one): a SYN lost while
// a restore swaps the table is retransmitted only after a second, which
// put up to 0.6 s of the probe's own waiting into a move's time.
func (p *syncProbe) ask() int {
	c, err := net.DialTimeout("tcp", p.vip.String(), syncProbeAskTimeout)
	if err != nil {
		return -1
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(syncProbeAskTimeout))
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return -1
	}
	return int(b[0] - '0')
}

// serves waits until the ClusterIP reaches the endpoint the slice holds.
func (p *syncProbe) serves(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for p.ask() != p.current {
		if time.Now().After(deadline) {
			return fmt.Errorf("the probe's ClusterIP %s never reached its endpoint %s within %s", p.vip, kubeSyncProbeEndpoints[p.current], limit)
		}
	}
	return nil
}

// move writes the slice with the other endpoint and returns how long
// from the write call until a new connection reaches it.
func (p *syncProbe) move(ctx context.Context, limit time.Duration) (time.Duration, error) {
	next := 1 - p.current
	cur, err := p.client.DiscoveryV1().EndpointSlices("default").Get(ctx, "probe", metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	sl := p.slice(next)
	sl.ResourceVersion = cur.ResourceVersion
	t0 := time.Now()
	sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: t0.Format(time.RFC3339Nano)}
	if _, err := p.client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		return 0, err
	}
	p.current = next
	for p.ask() != next {
		if time.Since(t0) > limit {
			return 0, fmt.Errorf("the probe's move to %s took no effect within %s", kubeSyncProbeEndpoints[next], limit)
		}
	}
	return time.Since(t0), nil
}

func (p *syncProbe) close() {
	for _, ln := range p.lns {
		ln.Close()
	}
}
