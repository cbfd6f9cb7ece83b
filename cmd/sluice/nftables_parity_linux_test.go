package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
	"github.com/sluice-proxy/sluice/kernel/nftables"
	"github.com/sluice-proxy/sluice/kernel/portals"
)

// Live parity with upstream kube-proxy v1.34.2 in nftables mode (issue
// 13): the same API objects, the same flags, the same node; kube-proxy
// programs its table, the test dumps it (nft -j), cleans up, and sluice
// programs the same node from the same API server. Both dumps, stripped of
// handles and counters and with set elements sorted, must be equal but for
// the differences listed in knownNFTablesDifferences, each a gap this test
// keeps honest: a new difference fails it, and so does a listed one that
// went away.

// knownNFTablesDifferences are the canonical lines only one side has,
// prefixed "kube-proxy only: " or "sluice only: ".
var knownNFTablesDifferences = []string{}

// parityBed is the node and the API objects both proxies are run on.
type parityBed struct {
	e         *kubeEnv
	kubeProxy string
	flags     []string // shared by both: kube-proxy's flags, which sluice takes too
	metrics   string   // host:port of the metrics server of the one running
	// The kubeproxy_* metrics each exported once its rules settled
	// (metricShapes), for checkMetrics.
	upstreamMetrics, ourMetrics []string
	upstreamPage, ourPage       string // the /metrics pages themselves
	healthz                     string // host:port of the health server
	hcnp                        string // host:port of the guarded Service's health check node port
	// What each answered on its two servers' paths (surfacePaths), and
	// on /configz (configzOf) and /metrics/slis (seriesWithoutValues),
	// kube-proxy's first.
	upstreamSurface, ourSurface map[string]string
	configz, slis               []string
	// The flags each listed on /flagz, and the lines of its /statusz
	// with their values masked (statuszShape), when the gates serve
	// them, kube-proxy's first.
	flagz   []map[string]string
	statusz []string
	// The Kubernetes Events each recorded (events), kube-proxy's first.
	upstreamEvents, ourEvents []string
	ours                      *proc // the sluice the last compare left running
	// What kube-proxy's --cleanup left after its run in the last compare
	// (leftAfterCleanup), for checkCleanup.
	upstreamLeft []string
}

// checkCleanup stops the sluice the last compare left running, runs
// sluice --cleanup, and wants the node's rules left as kube-proxy's
// --cleanup left them after its run on the same objects with the same
// flags: kubelet's KUBE-FIREWALL stays, and nothing else of either mode.
func (b *parityBed) checkCleanup(t *testing.T, mode string) {
	t.Helper()
	b.stopOursOnly()
	if out, err := exec.Command(sluiceBin, "--cleanup", "--proxy-mode="+mode).CombinedOutput(); err != nil {
		t.Fatalf("sluice --cleanup: %v\n%s", err, out)
	}
	if b.upstreamLeft == nil {
		t.Fatal("no record of what kube-proxy's --cleanup left")
	}
	// sluice's --cleanup also removes its userspace capture, which earlier
	// tests in this namespace leave and kube-proxy's leaves alone.
	notCapture := func(lines []string) []string {
		return slices.DeleteFunc(slices.Clone(lines), func(l string) bool {
			return strings.Contains(l, portals.NFTablesTable) || strings.Contains(l, "KUBE-PORTALS-")
		})
	}
	checkDifferences(t, notCapture(b.upstreamLeft), notCapture(leftAfterCleanup(t)), nil)
}

// leftAfterCleanup is what rules a node holds: every iptables table of
// both families (iptablesDump) and the nftables tables' names.
func leftAfterCleanup(t *testing.T) []string {
	t.Helper()
	lines, why := iptablesDump()
	if why != "" {
		t.Fatalf("iptables-save: %s", why)
	}
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		t.Fatalf("nft list tables: %v", err)
	}
	tables := strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(out)), " ", "_"))
	return append(append([]string{}, lines...), tables...) // not nil: checkCleanup tells "none" from "not recorded"
}

// stopOurs stops the sluice the last compare left running, and removes
// its rules (kube-proxy's --cleanup, as after kube-proxy), for another
// compare.
func (b *parityBed) stopOurs(t *testing.T, mode string) {
	t.Helper()
	b.stopOursOnly()
	if out, err := exec.Command(b.kubeProxy, "--cleanup", "--proxy-mode="+mode).CombinedOutput(); err != nil {
		t.Fatalf("kube-proxy --cleanup: %v\n%s", err, out)
	}
}

// stopOursOnly stops the sluice the last compare left running; its rules
// stay, as on any exit.
func (b *parityBed) stopOursOnly() {
	b.ours.cmd.Process.Signal(os.Interrupt)
	b.ours.exitCode()
}

// events returns the Events the proxy that ran recorded (its "Starting"
// on the Node, waited for on a watch: Events are sent in the background),
// each as "type reason action regarding by controller/instance", sorted,
// and deletes them for the next one.
func (b *parityBed) events(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a safety net, never a synchronisation
	defer cancel()
	// A watch from no version starts with every Event there is.
	w, err := b.e.client.EventsV1().Events("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for started := false; !started; {
		ev, ok := <-w.ResultChan()
		if !ok {
			break // the safety net: the comparison names what is missing
		}
		if e, isEvent := ev.Object.(*eventsv1.Event); isEvent && ev.Type == watch.Added {
			started = e.Reason == "Starting"
		}
	}
	w.Stop()
	list, err := b.e.client.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		// The proxy's own: the API server's controllers record Events of
		// their own at times of their own (its IP allocator's repair loop
		// once warned ClusterIPNotAllocated for a Service it had just
		// made, during kube-proxy's run).
		if ev.ReportingController != "kube-proxy" {
			continue
		}
		r := ev.Regarding
		out = append(out, fmt.Sprintf("%s %s %s %s %s/%s by %s/%s", ev.Type, ev.Reason, ev.Action, r.Kind, r.Namespace, r.Name, ev.ReportingController, ev.ReportingInstance))
	}
	for _, ns := range []string{"default", "kube-system"} {
		if err := b.e.client.EventsV1().Events(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(out)
	return out
}

// surfacePaths are the paths a kube-proxy's metrics and health servers may
// answer, which monitoring, probes and people use: the test checks that
// sluice answers each as kube-proxy does (status code). A put is sent as a
// PUT's body.
var surfacePaths = []struct{ server, path, put string }{
	{"metrics", "/metrics", ""}, {"metrics", "/proxyMode", ""}, {"metrics", "/healthz", ""}, {"metrics", "/livez", ""},
	{"metrics", "/configz", ""}, {"metrics", "/metrics/slis", ""}, {"metrics", "/flagz", ""}, {"metrics", "/statusz", ""},
	{"metrics", "/debug/pprof/", ""}, {"metrics", "/debug/pprof", ""}, {"metrics", "/nonexistent", ""},
	// With --profiling, the log's verbosity is set by a PUT.
	{"metrics", "/debug/flags/", ""}, {"metrics", "/debug/flags/v", ""}, {"metrics", "/debug/flags/v", "2"}, {"metrics", "/debug/flags/v", "two"},
	{"healthz", "/healthz", ""}, {"healthz", "/livez", ""}, {"healthz", "/readyz", ""}, {"healthz", "/metrics", ""}, {"healthz", "/nonexistent", ""},
	// The guarded Service's health check node port, which cloud load
	// balancers probe (any path), on the node's address.
	{"hcnp", "/", ""}, {"hcnp", "/healthz", ""},
}

// surfaceKey names a surfacePaths entry.
func surfaceKey(server, path, put string) string {
	if put != "" {
		return server + " PUT " + path + " " + put
	}
	return server + " " + path
}

// surface returns what the running proxy's servers answer on surfacePaths.
func (b *parityBed) surface(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	// A redirect is an answer of its own.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range surfacePaths {
		addr := b.metrics
		switch p.server {
		case "healthz":
			addr = b.healthz
		case "hcnp":
			addr = b.hcnp
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+p.path, nil)
		if p.put != "" {
			req, _ = http.NewRequest(http.MethodPut, "http://"+addr+p.path, strings.NewReader(p.put))
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", p.server, p.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The status, the headers but the date and length, and the body
		// or its shape where it has one that does not change from run to
		// run: /proxyMode's and the metrics server's /healthz text, the
		// health check node port's JSON, /debug/flags, the health server's
		// JSON keys.
		shape := ""
		switch {
		case p.path == "/proxyMode" || p.server == "metrics" && p.path == "/healthz" || p.server == "hcnp" ||
			strings.HasPrefix(p.path, "/debug/flags") || p.path == "/debug/pprof":
			shape = " " + string(body)
		case p.server == "healthz" && resp.StatusCode == http.StatusOK:
			var keys map[string]any
			json.Unmarshal(body, &keys)
			shape = " " + strings.Join(slices.Sorted(maps.Keys(keys)), ",")
		}
		var headers []string
		for k, v := range resp.Header {
			value := strings.Join(v, ",")
			// The process's start time, in Unix seconds: each a time of
			// its own in this test.
			if sec, err := strconv.ParseInt(value, 10, 64); err == nil && k == "Process-Start-Time-Unix" &&
				time.Since(time.Unix(sec, 0)) >= -time.Second && time.Since(time.Unix(sec, 0)) < time.Hour {
				value = "(a start in this test)"
			}
			if k != "Date" && k != "Content-Length" {
				headers = append(headers, k+": "+value)
			}
		}
		slices.Sort(headers)
		out[surfaceKey(p.server, p.path, p.put)] = fmt.Sprintf("%d %s%s", resp.StatusCode, strings.Join(headers, "; "), shape)
		switch {
		case p.path == "/configz" && resp.StatusCode == http.StatusOK:
			b.configz = append(b.configz, configzOf(t, body))
		case p.path == "/metrics/slis" && resp.StatusCode == http.StatusOK:
			b.slis = append(b.slis, seriesWithoutValues(string(body)))
		case (p.path == "/flagz" || p.path == "/statusz") && resp.StatusCode == http.StatusNotAcceptable:
			// Served (the gates are on), to those who accept text/plain.
			req.Header.Set("Accept", "text/plain")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", p.server, p.path, err)
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Fatalf("%s taking text/plain: %d %q\n%s", p.path, resp.StatusCode, resp.Header.Get("Content-Type"), page)
			}
			if p.path == "/flagz" {
				b.flagz = append(b.flagz, flagzOf(t, string(page)))
			} else {
				b.statusz = append(b.statusz, statuszShape(string(page)))
			}
		}
	}
	return out
}

// zpageField cuts a zpage's line into its name and value at the
// delimiter the page picked (":", ": ", "=" or " "); names have none of
// them but " " (statusz's "Go version"), so the known names come first.
var zpageField = regexp.MustCompile(`^(Go version|Binary version|Emulation version|[^:= ]+)(?:: |:|=| )(.*)$`)

// flagzOf is a /flagz page's flags and values, after its title and
// warning.
func flagzOf(t *testing.T, page string) map[string]string {
	t.Helper()
	_, body, ok := strings.Cut(page, "purposes only.\n\n")
	if !ok {
		t.Fatalf("/flagz has no warning line:\n%s", page)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		m := zpageField.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("/flagz line %q", line)
		}
		out[m[1]] = m[2]
	}
	return out
}

// statuszShape is a /statusz page with each line's value replaced by "V",
// but the emulation version's (the Kubernetes release it behaves as).
func statuszShape(page string) string {
	var out []string
	for _, line := range strings.Split(page, "\n") {
		if m := zpageField.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "Warning") && !strings.HasSuffix(line, " statusz") {
			if m[1] != "Emulation version" {
				m[2] = "V"
			}
			line = m[1] + ": " + strings.TrimSpace(m[2])
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// configzOf is kube-proxy's part of a /configz answer, as JSON, without
// the log verbosity (kube-proxy is run with --v=2 for its log).
func configzOf(t *testing.T, body []byte) string {
	t.Helper()
	var all map[string]map[string]any
	if err := json.Unmarshal(body, &all); err != nil {
		t.Fatalf("/configz: %v: %s", err, body)
	}
	kp := all[config.ConfigzGroup]
	if logging, ok := kp["Logging"].(map[string]any); ok {
		delete(logging, "verbosity")
	}
	out, _ := json.MarshalIndent(kp, "", "  ")
	return string(out)
}

// seriesWithoutValues is a metrics page's series, values left out.
func seriesWithoutValues(page string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			series, _, _ := strings.Cut(l, " ")
			out = append(out, series)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// checkSurface fails for each path kube-proxy answers otherwise than
// sluice does, and when kube-proxy's /configz (its configuration in
// effect, from the same flags) or the series of its /metrics/slis differ
// from sluice's.
func (b *parityBed) checkSurface(t *testing.T) {
	t.Helper()
	if len(b.configz) != 2 || b.configz[0] != b.configz[1] {
		t.Errorf("/configz differs:\nkube-proxy: %s\nsluice: %s", b.configz[0], b.configz[len(b.configz)-1])
	}
	if !slices.Equal(b.upstreamEvents, b.ourEvents) || len(b.upstreamEvents) == 0 {
		t.Errorf("Events differ:\nkube-proxy: %q\nsluice: %q", b.upstreamEvents, b.ourEvents)
	}
	if len(b.slis) != 2 || b.slis[0] != b.slis[1] {
		t.Errorf("/metrics/slis series differ:\nkube-proxy:\n%s\nsluice:\n%s", b.slis[0], b.slis[len(b.slis)-1])
	}
	for _, p := range surfacePaths {
		k := surfaceKey(p.server, p.path, p.put)
		if b.upstreamSurface[k] != b.ourSurface[k] {
			t.Errorf("%s: kube-proxy answers %q, sluice %q", k, b.upstreamSurface[k], b.ourSurface[k])
		}
	}
	if len(b.statusz) > 0 && (len(b.statusz) != 2 || b.statusz[0] != b.statusz[1]) {
		t.Errorf("/statusz differs:\nkube-proxy:\n%s\nsluice:\n%s", b.statusz[0], b.statusz[len(b.statusz)-1])
	}
	if len(b.flagz) > 0 {
		if len(b.flagz) != 2 {
			t.Fatalf("/flagz served by one of the two only")
		}
		// Every flag of kube-proxy's with its value, but --v (kube-proxy
		// runs with --v=2 for its log); sluice's own flags besides.
		for name, want := range b.flagz[0] {
			if got, ok := b.flagz[1][name]; name != "v" && (!ok || got != want) {
				t.Errorf("/flagz: kube-proxy's %s=%q, sluice's %q (listed: %t)", name, want, got, ok)
			}
		}
	}
}

// series returns a /metrics page's lines of the named metric, sorted.
func series(page, name string) []string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// knownMetricDifferences are kube-proxy's metrics sluice does not export
// yet, each with the issue that builds it. (kube-proxy's
// network_programming_duration_seconds, issue 16, has no series here: the
// test's EndpointSlices carry no last-change-trigger-time.)
var knownMetricDifferences = []string{}

// metricShapes lists the kubeproxy_* series of a /metrics page by name
// and label names ("name{a,b}"; histograms by their _bucket, _sum and
// _count series, "le" left out), sorted and without repeats.
func metricShapes(page string) []string {
	seen := map[string]bool{}
	for _, l := range strings.Split(page, "\n") {
		if !strings.HasPrefix(l, "kubeproxy_") {
			continue
		}
		series, _, _ := strings.Cut(l, " ")
		name, labels, _ := strings.Cut(series, "{")
		name = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		var keys []string
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, _, ok := strings.Cut(kv, "="); ok && k != "le" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		seen[name+"{"+strings.Join(keys, ",")+"}"] = true
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// checkMetrics fails for each kubeproxy_* metric (with its label names)
// kube-proxy exported and sluice did not, unless it is a known one, and
// for each known one sluice now has.
func (b *parityBed) checkMetrics(t *testing.T) {
	// Every feature gate upstream registers is one sluice knows
	// (config/featuregates.go), with the same stage and default.
	if path := os.Getenv("SLUICE_WRITE_KUBE_PROXY_METRICS"); path != "" {
		os.WriteFile(path, []byte(b.upstreamPage), 0o644) // for scripts/kube-proxy-feature-gates.sh
	}
	gates := 0
	for _, line := range strings.Split(b.upstreamPage, "\n") {
		m := featureSeries.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		gates++
		stage := m[2]
		if stage == "" {
			stage = "GA"
		}
		if want, got := stage+" default="+strconv.FormatBool(m[3] == "1"), gateSummary(m[1]); got != want {
			t.Errorf("feature gate %s: sluice knows it as %q, kube-proxy's /metrics says %s: run scripts/kube-proxy-feature-gates.sh", m[1], got, want)
		}
	}
	if gates < 100 {
		t.Errorf("%d kubernetes_feature_enabled series in kube-proxy's /metrics", gates)
	}
	t.Helper()
	for _, m := range b.upstreamMetrics {
		known := slices.Contains(knownMetricDifferences, m)
		has := slices.Contains(b.ourMetrics, m)
		switch {
		case !has && !known:
			t.Errorf("kube-proxy exports %s; sluice does not", m)
		case has && known:
			t.Errorf("a known metric difference is gone (take it off the list): %s", m)
		}
	}
	// Series whose values the same objects decide, once the rules settled:
	// the Services with a Local policy and no local endpoint, per family
	// and policy, and nothing pending.
	for _, name := range []string{"kubeproxy_sync_proxy_rules_no_local_endpoints_total",
		"kubeproxy_sync_proxy_rules_service_changes_pending", "kubeproxy_sync_proxy_rules_endpoint_changes_pending"} {
		if up, us := series(b.upstreamPage, name), series(b.ourPage, name); len(up) == 0 || !slices.Equal(up, us) {
			t.Errorf("%s: kube-proxy\n%s\nsluice\n%s", name, strings.Join(up, "\n"), strings.Join(us, "\n"))
		}
	}
	t.Logf("kube-proxy exported %d kubeproxy_* series shapes, sluice %d:\n%s\n%s", len(b.upstreamMetrics), len(b.ourMetrics),
		strings.Join(b.upstreamMetrics, " "), strings.Join(b.ourMetrics, " "))
}

func newParityBed(t *testing.T) *parityBed {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the parity test needs a private network namespace, which needs root"))
	}
	kubeProxy, err := kubetest.KubeProxyBinary()
	kubetest.Require(t, err)
	c := startCluster(t, kubetest.WithDualStack())
	// The node: an uplink that leads nowhere, with the node's IP.
	nodeUplink(t, "parity", []string{"addr", "add", "192.168.10.1/24", "dev", "parity0"})
	e, lb := createParityObjects(t, c)
	hz, mp := freePort(t, "tcp"), freePort(t, "tcp")
	return &parityBed{e: e, kubeProxy: kubeProxy, hcnp: fmt.Sprintf("192.168.10.1:%d", lb.Spec.HealthCheckNodePort), metrics: fmt.Sprintf("127.0.0.1:%d", mp), healthz: fmt.Sprintf("127.0.0.1:%d", hz), flags: []string{"--kubeconfig=" + c.Kubeconfig, "--hostname-override=" + kubeNode,
		"--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=192.168.10.0/24",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp)}}
}

// createParityObjects makes the parity tests' node (node-a, InternalIP
// 192.168.10.1, its pod CIDRs and zone) and Services with their slices in
// c's API server, and returns the LoadBalancer Service with a health
// check node port ("guarded").
func createParityObjects(t *testing.T, c *kubetest.Cluster) (*kubeEnv, *corev1.Service) {
	ctx := context.Background()
	e := &kubeEnv{t: t, cluster: c, client: c.Client}
	// Its pod CIDRs are for --detect-local-mode=NodeCIDR.
	// Its zone is for the topology hints.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: kubeNode, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24", "fd00:244::/64"}}}
	node, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.10.1"}}
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Services covering the layout: load balancing, affinity, NodePorts,
	// no endpoints, externalIPs, a LoadBalancer with source ranges and
	// externalTrafficPolicy Local (health-check node port), UDP.
	local, remote := readyEP("10.244.0.5"), kubeEP{ip: "10.244.1.6", node: "node-b", ready: true, serving: true}
	web := webService("web")
	e.createService(web)
	e.setSlice("web", "web-1", "http", local, remote)
	sticky := webService("sticky")
	sticky.Spec.Type = corev1.ServiceTypeClusterIP
	sticky.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	e.createService(sticky)
	e.setSlice("sticky", "sticky-1", "http", local, remote)
	empty := webService("empty")
	e.createService(empty)
	ext := webService("ext")
	ext.Spec.Type = corev1.ServiceTypeClusterIP
	ext.Spec.ExternalIPs = []string{"203.0.113.10"}
	e.createService(ext)
	e.setSlice("ext", "ext-1", "http", remote)
	lb := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "guarded"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			LoadBalancerSourceRanges: []string{"192.168.10.0/24"},
			Ports:                    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	lb = e.createService(lb)
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.20"}}
	if _, err := c.Client.CoreV1().Services("default").UpdateStatus(ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.setSlice("guarded", "guarded-1", "http", local, remote)
	// Topology-aware routing: zone hints (this node's zone, zone-a, has
	// one of the three endpoints), and node hints (PreferSameNode).
	zonal := webService("zonal")
	zonal.Spec.Type = corev1.ServiceTypeClusterIP
	e.createService(zonal)
	inZone := kubeEP{ip: "10.244.1.7", node: "node-b", ready: true, serving: true, forZones: []string{"zone-a"}}
	otherZone := kubeEP{ip: "10.244.2.8", node: "node-c", ready: true, serving: true, forZones: []string{"zone-b"}}
	bothZones := kubeEP{ip: "10.244.2.9", node: "node-c", ready: true, serving: true, forZones: []string{"zone-b", "zone-c"}}
	e.setSlice("zonal", "zonal-1", "http", inZone, otherZone, bothZones)
	nodal := webService("nodal")
	nodal.Spec.Type = corev1.ServiceTypeClusterIP
	e.createService(nodal)
	forMe := readyEP("10.244.0.7")
	forMe.forNodes, forMe.forZones = []string{kubeNode}, []string{"zone-a"}
	e.setSlice("nodal", "nodal-1", "http", forMe, kubeEP{ip: "10.244.1.8", node: "node-b", ready: true, serving: true, forNodes: []string{"node-b"}, forZones: []string{"zone-a"}})

	// The traffic policies and endpoint conditions, each a Service of its
	// own: internalTrafficPolicy Local with and without a local endpoint;
	// the terminating fall-backs (a local endpoint serving but
	// terminating under externalTrafficPolicy Local, and a Service whose
	// endpoints all terminate); endpoints neither ready nor serving.
	terminatingHere := kubeEP{ip: "10.244.0.9", node: kubeNode, serving: true, terminating: true}
	notReady := kubeEP{ip: "10.244.1.9", node: "node-b"}
	for _, c := range []struct {
		name  string
		mut   func(*corev1.Service)
		slice []kubeEP
	}{
		{"itp-local", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
		}, []kubeEP{local, remote}},
		{"itp-remote", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptrTo(corev1.ServiceInternalTrafficPolicyLocal)
		}, []kubeEP{remote}},
		{"etp-terminating", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }, []kubeEP{terminatingHere, remote}},
		{"etp-remote", func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }, []kubeEP{remote}},
		{"all-terminating", nil, []kubeEP{terminatingHere, {ip: "10.244.1.10", node: "node-b", serving: true, terminating: true}}},
		{"not-ready", nil, []kubeEP{notReady}},
		{"sticky-short", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptrTo(int32(60))}}
		}, []kubeEP{local, remote}},
	} {
		svc := webService(c.name)
		if c.mut != nil {
			c.mut(svc)
		}
		e.createService(svc)
		e.setSlice(c.name, c.name+"-1", "http", c.slice...)
	}
	// LoadBalancers: ingress IPs with ipMode Proxy (not captured on the
	// node) and VIP, externalTrafficPolicy Local with only remote
	// endpoints, no NodePorts allocated, an ingress with a hostname only.
	for _, lbc := range []struct {
		name    string
		local   bool
		ingress []corev1.LoadBalancerIngress
	}{
		{"lb-modes", false, []corev1.LoadBalancerIngress{{IP: "203.0.113.30", IPMode: ptrTo(corev1.LoadBalancerIPModeProxy)}, {IP: "203.0.113.31", IPMode: ptrTo(corev1.LoadBalancerIPModeVIP)}}},
		{"lb-remote", true, []corev1.LoadBalancerIngress{{IP: "203.0.113.32"}}},
		{"lb-hostname", false, []corev1.LoadBalancerIngress{{Hostname: "lb.example.com"}}},
	} {
		svc := webService(lbc.name)
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		if lbc.local {
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		if lbc.name == "lb-hostname" {
			svc.Spec.AllocateLoadBalancerNodePorts = ptrTo(false)
		}
		svc = e.createService(svc)
		svc.Status.LoadBalancer.Ingress = lbc.ingress
		if _, err := c.Client.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.setSlice(lbc.name, lbc.name+"-1", "http", remote)
	}
	// IPv6 (the API server is dual-stack): a NodePort Service with IPv6
	// endpoints, one on this node.
	v6 := webService("web6")
	v6.Spec.IPFamilies, v6.Spec.IPFamilyPolicy = []corev1.IPFamily{corev1.IPv6Protocol}, ptrTo(corev1.IPFamilyPolicySingleStack)
	e.createService(v6)
	e.setSliceOf("web6", "web6-1", discoveryv1.AddressTypeIPv6, "http", readyEP("fd00:244::5"), kubeEP{ip: "fd00:244:1::6", node: "node-b", ready: true, serving: true})
	// Ignored by both: a headless Service and an ExternalName.
	e.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "headless"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}})
	e.setSlice("headless", "headless-1", "http", local)
	e.createService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cname"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}})
	return e, lb
}

// featureSeries is one feature gate in a /metrics page.
var featureSeries = regexp.MustCompile(`^kubernetes_feature_enabled\{name="([^"]+)",stage="([A-Z]*)"\} ([01])$`)

// compare runs kube-proxy, then sluice, in mode and returns both dumps
// (dump returns the canonical lines, or "" in why while not settled).
// reset runs before each, so that neither sees what the other left.
func (b *parityBed) compare(t *testing.T, mode string, want []string, dump func() ([]string, string), reset func()) (upstream, ours []string) {
	return b.compareWith(t, mode, b.flags, want, dump, reset)
}

// compareWith is compare with other flags than the bed's.
func (b *parityBed) compareWith(t *testing.T, mode string, flags []string, want []string, dump func() ([]string, string), reset func()) (upstream, ours []string) {
	flags = append([]string{"--proxy-mode=" + mode}, flags...)
	b.configz, b.slis, b.flagz, b.statusz = nil, nil, nil, nil // this comparison's own
	reset()
	kp := startCmd(t, exec.Command(b.kubeProxy, append(flags, "--v=2")...))
	upstream = waitForDump(t, b.e, want, kp, dump)
	b.upstreamPage = get(t, "http://"+b.metrics+"/metrics")
	b.upstreamMetrics = metricShapes(b.upstreamPage)
	b.upstreamSurface = b.surface(t)
	b.upstreamEvents = b.events(t)
	kp.cmd.Process.Signal(os.Interrupt)
	kp.exitCode()
	if out, err := exec.Command(b.kubeProxy, "--cleanup", "--proxy-mode="+mode).CombinedOutput(); err != nil {
		t.Fatalf("kube-proxy --cleanup: %v\n%s", err, out)
	}
	b.upstreamLeft = leftAfterCleanup(t)
	reset()
	sl := start(t, append(flags, "--mode-fallback=false")...)
	b.ours = sl
	ours = waitForDump(t, b.e, want, sl, dump)
	b.ourPage = get(t, "http://"+b.metrics+"/metrics")
	b.ourMetrics = metricShapes(b.ourPage)
	b.ourSurface = b.surface(t)
	b.ourEvents = b.events(t)
	keepLog(t, sl)
	return upstream, ours
}

// checkDifferences fails for each difference not in known, and for each
// known one that is gone.
func checkDifferences(t *testing.T, upstream, ours, known []string) {
	var diffs []string
	for _, l := range upstream {
		if !slices.Contains(ours, l) {
			diffs = append(diffs, "kube-proxy only: "+l)
		}
	}
	for _, l := range ours {
		if !slices.Contains(upstream, l) {
			diffs = append(diffs, "sluice only: "+l)
		}
	}
	for _, d := range diffs {
		if !slices.Contains(known, d) {
			t.Errorf("%s", d)
		}
	}
	for _, k := range known {
		if !slices.Contains(diffs, k) {
			t.Errorf("a known difference is gone (take it off the list): %s", k)
		}
	}
	t.Logf("compared %d canonical lines from kube-proxy with %d from sluice; %d known differences", len(upstream), len(ours), len(known))
}

func TestNFTablesParityWithKubeProxy(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		kubetest.Require(t, fmt.Errorf("nft: %w", err))
	}
	b := newParityBed(t)
	want := []string{"service-", "web/tcp/http", "sticky/tcp/http", "ext/tcp/http", "guarded/tcp/http", "zonal/tcp/http", "nodal/tcp/http", "203.0.113.20",
		"itp-local/tcp/http", "etp-terminating/tcp/http", "all-terminating/tcp/http", "sticky-short/udp/dns", "lb-modes/tcp/http", "lb-remote/tcp/http", "203.0.113.31", "web6/tcp/http", "fd00:244::5",
		zoneApplied}
	want = append(want, `"family":"ip6"`)
	dump := func() ([]string, string) { return nftablesDump(t) }
	reset := func() {
		if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), "kube-proxy") {
			t.Fatalf("a kube-proxy table is left: %s", out)
		}
	}
	upstream, ours := b.compare(t, "nftables", want, dump, reset)
	checkDifferences(t, upstream, ours, knownNFTablesDifferences)
	b.checkMetrics(t)
	b.checkSurface(t)

	// A ServiceCIDR added later widens the drop of unallocated ClusterIPs.
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/16"}}}
	if _, err := b.e.client.NetworkingV1().ServiceCIDRs().Create(context.Background(), extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.e.eventually("a new ServiceCIDR in the drop rule", func() (bool, string) {
		out, err := exec.Command("nft", "list", "chain", "ip", "kube-proxy", "cluster-ips-check").CombinedOutput()
		return err == nil && strings.Contains(string(out), "10.96.0.0/16") && strings.Contains(string(out), "10.100.0.0/16"), string(out)
	})

	// Again with the Node's pod CIDRs for the local traffic
	// (--detect-local-mode=NodeCIDR) and nftables mode's default
	// --nodeport-addresses, "primary": the Node's InternalIP; and with
	// --profiling, whose paths checkSurface tries. First, sluice's
	// --cleanup leaves what kube-proxy's left.
	b.checkCleanup(t, "nftables")
	var flags []string
	for _, f := range b.flags {
		if !strings.HasPrefix(f, "--nodeport-addresses=") {
			flags = append(flags, f)
		}
	}
	upstream, ours = b.compareWith(t, "nftables", append(flags, "--detect-local-mode=NodeCIDR", "--profiling"),
		append(want, `"addr":"10.244.0.0","len":24`, "192.168.10.1"), dump, reset)
	checkDifferences(t, upstream, ours, knownNFTablesDifferences)
	b.checkSurface(t) // /configz included: the resolved "primary", the mode
	for _, w := range []string{`"addr":"10.244.0.0","len":24`, "192.168.10.1"} {
		if !strings.Contains(strings.Join(ours, "\n"), w) {
			t.Errorf("NodeCIDR and primary: no %q in sluice's rules", w)
		}
	}
	// Partial syncs: the rules after changes made while each runs.
	b.stopOurs(t, "nftables")
	changed := [2][]string{{"10.244.1.21", "churn-new/tcp/http"}, {"10.244.1.22"}}
	up, us := b.compareAfterChurn(t, "nftables", false, want, changed, dump, reset)
	for i := range up {
		checkDifferences(t, up[i], us[i], knownNFTablesDifferences)
	}
	// The first change left the chains it no longer used, flushed (a
	// kernel before 6.2 cannot delete them in that transaction); the
	// second deleted them.
	stale := `"name":"service-` // of churn-gone's ports, among others
	if !slices.ContainsFunc(us[0], func(l string) bool { return strings.Contains(l, stale) && strings.Contains(l, "/churn-gone/") }) ||
		slices.ContainsFunc(us[1], func(l string) bool { return strings.Contains(l, "/churn-gone/") }) {
		t.Errorf("churn-gone's chains: not left flushed after the first change, or not deleted after the second")
	}
	// The binary swapped: each started over kube-proxy's rules, left on
	// its exit, for objects that changed meanwhile.
	b.stopOurs(t, "nftables")
	up, us = b.compareAfterChurn(t, "nftables", true, want, changed, dump, reset)
	for i := range up {
		checkDifferences(t, up[i], us[i], knownNFTablesDifferences)
	}
	// From iptables mode to nftables mode: what is left of iptables
	// mode's rules once nftables mode runs.
	b.stopOurs(t, "nftables")
	leftUp, leftUs := b.compareModeSwitch(t, "iptables", "nftables", []string{"KUBE-SVC-", "web:http"}, want, iptablesDump, dump, reset)
	checkDifferences(t, leftUp, leftUs, nil)
	if slices.ContainsFunc(leftUs, func(l string) bool { return strings.Contains(l, "KUBE-SVC-") }) {
		t.Errorf("iptables mode's service chains left in nftables mode:\n%s", strings.Join(leftUs, "\n"))
	}
}

// zoneApplied, in a want list, waits for the Node's zone: the zonal
// Service's endpoint for another zone is in no rule once the zone hints
// apply. kube-proxy may sync first without the zone, then again (its
// minimum sync period, a second, later) when its Node watch brings it:
// under load the rules were still that first sync's after a quiet second.
const zoneApplied = "!10.244.2.8"

// nftablesDump is the kube-proxy table of both families, canonical
// (nftables.CanonicalDump), sorted; or why not (no table).
func nftablesDump(t *testing.T) ([]string, string) {
	var all []string
	for _, family := range []string{"ip", "ip6"} {
		out, err := exec.Command("nft", "-j", "list", "table", family, "kube-proxy").Output()
		if err != nil {
			return nil, err.Error()
		}
		lines, err := nftables.CanonicalDump(out)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, lines...)
	}
	slices.Sort(all)
	return all, ""
}

// iptablesDump is iptables-save's and ip6tables-save's every table,
// canonical (canonicalIPTables), sorted.
func iptablesDump() ([]string, string) {
	var lines []string
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(bin).Output()
		if err != nil {
			return nil, err.Error()
		}
		lines = append(lines, canonicalIPTables(strings.TrimSuffix(bin, "-save"), string(out))...)
	}
	slices.Sort(lines)
	return lines, ""
}

// compareModeSwitch runs kube-proxy in mode from and stops it (its rules
// stay, as on any exit), then starts kube-proxy, then sluice, in mode to
// over those rules, and returns what of from's rules each left once its
// own (dumpTo, holding wantTo) settled: kube-proxy removes the other
// modes' rules when it starts. Each begins from no rules of either mode
// (kube-proxy's --cleanup, which removes every mode's, then reset).
func (b *parityBed) compareModeSwitch(t *testing.T, from, to string, wantFrom, wantTo []string, dumpFrom, dumpTo func() ([]string, string), reset func()) (upstream, ours []string) {
	t.Helper()
	kubeProxy := func(mode string) *proc {
		return startCmd(t, exec.Command(b.kubeProxy, append([]string{"--proxy-mode=" + mode, "--v=2"}, b.flags...)...))
	}
	stop := func(p *proc) {
		p.cmd.Process.Signal(os.Interrupt)
		p.exitCode()
	}
	left := func() []string {
		lines, why := dumpFrom()
		if why != "" {
			return []string{"(none: " + why + ")"}
		}
		return lines
	}
	leave := func() {
		if out, err := exec.Command(b.kubeProxy, "--cleanup", "--proxy-mode="+from).CombinedOutput(); err != nil {
			t.Fatalf("kube-proxy --cleanup: %v\n%s", err, out)
		}
		reset()
		kp := kubeProxy(from)
		waitForDump(t, b.e, wantFrom, kp, dumpFrom)
		stop(kp)
		if lines, _ := dumpFrom(); len(lines) == 0 {
			t.Fatalf("kube-proxy in %s mode left no rules on exit", from)
		}
	}
	leave()
	kp := kubeProxy(to)
	waitForDump(t, b.e, wantTo, kp, dumpTo)
	upstream = left()
	stop(kp)
	leave()
	sl := start(t, append([]string{"--proxy-mode=" + to, "--mode-fallback=false"}, b.flags...)...)
	b.ours = sl
	waitForDump(t, b.e, wantTo, sl, dumpTo)
	ours = left()
	keepLog(t, sl)
	return upstream, ours
}

// waitForDump waits until the dump holds every string in want (and none
// of those written "!string") and has not changed for a second (a
// family's sync is one transaction, but the families sync one after the
// other and the first syncs follow each other), then returns its
// canonical lines.
func waitForDump(t *testing.T, e *kubeEnv, want []string, p *proc, dump func() ([]string, string)) []string {
	t.Helper()
	var last []string
	var since time.Time
	e.eventually("the rules complete and settled", func() (bool, string) {
		select {
		case err := <-p.done:
			p.done <- err
			var out []string
			for l := range p.lines {
				out = append(out, l)
			}
			t.Fatalf("the proxy exited: %v\n%s", err, strings.Join(out[max(0, len(out)-30):], "\n"))
		default:
		}
		lines, why := dump()
		if why != "" {
			return false, why
		}
		all := strings.Join(lines, "\n")
		for _, w := range want {
			if unwanted, ok := strings.CutPrefix(w, "!"); ok {
				if strings.Contains(all, unwanted) {
					return false, "still " + unwanted
				}
			} else if !strings.Contains(all, w) {
				return false, "no " + w
			}
		}
		if !slices.Equal(lines, last) {
			last, since = lines, time.Now()
		}
		return time.Since(since) >= time.Second, "changing"
	})
	return last
}

// knownIPTablesDifferences: as knownNFTablesDifferences, for iptables mode.
var knownIPTablesDifferences = []string{}

// The same comparison for iptables mode, over iptables-save and
// ip6tables-save (every table), on the backend both pick.
func TestIPTablesParityWithKubeProxy(t *testing.T) {
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			kubetest.Require(t, fmt.Errorf("%s: %w", bin, err))
		}
	}
	b := newParityBed(t)
	want := []string{"KUBE-SVC-", "web:http", "sticky:http", "ext:http", "guarded:http", "zonal:http", "nodal:http", "203.0.113.20",
		"itp-local:http", "etp-terminating:http", "all-terminating:http", "sticky-short:dns", "lb-modes:http", "lb-remote:http", "203.0.113.31", "web6:http", "fd00:244::5", zoneApplied,
		"ip6tables nat rule PREROUTING", "ip6tables filter rule OUTPUT", "ip6tables mangle chain KUBE-PROXY-CANARY",
		"ip6tables nat rule KUBE-SERVICES", "iptables filter rule KUBE-FORWARD"}
	dump := iptablesDump
	reset := func() {
		// Start each from no rules at all: earlier tests in this namespace
		// leave chains (the userspace capture keeps its own across
		// restarts), and kube-proxy's --cleanup leaves KUBE-FIREWALL.
		for _, bin := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"} {
			for _, table := range []string{"nat", "filter", "mangle"} {
				exec.Command(bin, "-t", table, "-F").Run()
				exec.Command(bin, "-t", table, "-X").Run()
			}
		}
	}
	upstream, ours := b.compare(t, "iptables", want, dump, reset)
	checkDifferences(t, upstream, ours, knownIPTablesDifferences)
	b.checkMetrics(t)
	b.checkSurface(t)
	// The same rules, so the same counts of them in the kernel.
	if up, us := series(b.upstreamPage, "kubeproxy_sync_proxy_rules_iptables_total"), series(b.ourPage, "kubeproxy_sync_proxy_rules_iptables_total"); len(up) == 0 || !slices.Equal(up, us) {
		t.Errorf("rule counts: kube-proxy\n%s\nsluice\n%s", strings.Join(up, "\n"), strings.Join(us, "\n"))
	}
	const invalid = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 0"
	if m := get(t, "http://"+b.metrics+"/metrics"); !strings.Contains(m, invalid) {
		t.Errorf("no %q in sluice's metrics", invalid)
	}
	// Again with the pods' interfaces for the local traffic
	// (--detect-local-mode=InterfaceNamePrefix), and with the node hints
	// turned off (the nodal Service's zone hints then send its cluster
	// traffic to both its endpoints). First, sluice's --cleanup leaves
	// what kube-proxy's left: kubelet's KUBE-FIREWALL.
	b.checkCleanup(t, "iptables")
	upstream, ours = b.compareWith(t, "iptables", append(slices.Clone(b.flags), "--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth",
		"--feature-gates=PreferSameTrafficDistribution=false,ComponentFlagz=true,ComponentStatusz=true"), append(want, "veth+"), dump, reset)
	checkDifferences(t, upstream, ours, knownIPTablesDifferences)
	b.checkSurface(t) // /flagz and /statusz included: their gates are on
	if len(b.flagz) != 2 || len(b.flagz[0]) < 50 || len(b.statusz) != 2 {
		t.Errorf("/flagz and /statusz with their gates on: %d and %d pages (%v)", len(b.flagz), len(b.statusz), b.flagz)
	}
	for _, w := range []string{"! -i veth+", "-i veth+ "} {
		if !strings.Contains(strings.Join(ours, "\n"), w) {
			t.Errorf("InterfaceNamePrefix: no %q in sluice's rules", w)
		}
	}
	// Partial syncs: the rules after changes made while each runs.
	b.stopOurs(t, "iptables")
	changed := [2][]string{{"10.244.1.21", "churn-new:http"}, {"10.244.1.22"}}
	up, us := b.compareAfterChurn(t, "iptables", false, want, changed, dump, reset)
	for i := range up {
		checkDifferences(t, up[i], us[i], knownIPTablesDifferences)
	}
	// The binary swapped (see the nftables test).
	b.stopOurs(t, "iptables")
	up, us = b.compareAfterChurn(t, "iptables", true, want, changed, dump, reset)
	for i := range up {
		checkDifferences(t, up[i], us[i], knownIPTablesDifferences)
	}
	// From nftables mode to iptables mode: nftables mode's table goes.
	b.stopOurs(t, "iptables")
	leftUp, leftUs := b.compareModeSwitch(t, "nftables", "iptables", []string{"service-", "web/tcp/http"}, want,
		func() ([]string, string) { return nftablesDump(t) }, dump, reset)
	checkDifferences(t, leftUp, leftUs, nil)
	if len(leftUs) != 1 || !strings.HasPrefix(leftUs[0], "(none: ") {
		t.Errorf("nftables mode's table left in iptables mode:\n%s", strings.Join(leftUs, "\n"))
	}
	// To sluice's userspace mode (no kube-proxy mode), as the node's proxy:
	// kube-proxy's iptables rules would reject or DNAT Service traffic
	// before the capture, so they go too; kubelet's KUBE-FIREWALL stays.
	b.stopOurs(t, "iptables")
	reset()
	kp := startCmd(t, exec.Command(b.kubeProxy, append([]string{"--proxy-mode=iptables", "--v=2"}, b.flags...)...))
	waitForDump(t, b.e, want, kp, dump)
	kp.cmd.Process.Signal(os.Interrupt)
	kp.exitCode()
	sl := start(t, append([]string{"--proxy-mode=userspace"}, b.flags...)...)
	sl.waitLog("state applied")
	left, _ := iptablesDump()
	for _, l := range left {
		if strings.Contains(l, "KUBE-") && !strings.Contains(l, "KUBE-FIREWALL") && !strings.Contains(l, "KUBE-PORTALS-") {
			t.Errorf("kube-proxy's iptables rules left in userspace mode: %s", l)
		}
	}
	if out, _ := exec.Command("nft", "list", "tables").CombinedOutput(); !strings.Contains(string(out), "sluice-portals") &&
		!slices.ContainsFunc(left, func(l string) bool { return strings.Contains(l, "KUBE-PORTALS-") }) {
		t.Errorf("no userspace capture, in nftables or iptables:\n%s\n%s", out, strings.Join(left, "\n"))
	}
	sl.cmd.Process.Signal(os.Interrupt)
	sl.exitCode()
}

var sharedChains = map[string]bool{"KUBE-SERVICES": true, "KUBE-NODEPORTS": true, "KUBE-EXTERNAL-SERVICES": true, "KUBE-PROXY-FIREWALL": true}

// canonicalIPTables turns iptables-save output into lines, one per chain
// and rule, without counters, each rule keeping its place in its chain.
func canonicalIPTables(family, save string) []string {
	var lines []string
	table := ""
	pos := map[string]int{}
	for _, l := range strings.Split(save, "\n") {
		switch {
		case l == "" || strings.HasPrefix(l, "#") || l == "COMMIT":
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			f := strings.Fields(l)
			lines = append(lines, fmt.Sprintf("%s %s chain %s %s", family, table, f[0][1:], f[1]))
		case strings.HasPrefix(l, "-A "):
			chain, _, _ := strings.Cut(l[3:], " ")
			// kube-proxy writes the per-service rules of the shared chains
			// in its map's order, which changes from sync to sync and
			// means nothing (each matches its own address and port): only
			// the other rules' places count.
			if sharedChains[chain] && strings.Contains(l, `--comment "`) && strings.Contains(l, "/") {
				lines = append(lines, fmt.Sprintf("%s %s rule %s #any %s", family, table, chain, l))
				continue
			}
			k := table + " " + chain
			lines = append(lines, fmt.Sprintf("%s %s rule %s #%d %s", family, table, chain, pos[k], l))
			pos[k]++
		default:
			lines = append(lines, family+" "+table+" other "+l)
		}
	}
	return lines
}

// The churn Services' fixed cluster IPs and NodePorts, so that each
// program's run starts from the same objects, made anew. Both are in the
// API server's static bands (the first 256 addresses of the /16, the
// first 86 ports of 30000-32767), which it allocates from only when the
// rest is full: a fixed NodePort of the dynamic band collided with one
// given to another Service now and then.
const (
	churnIP, churnGoneIP, churnTypeIP, churnNewIP = "10.96.0.210", "10.96.0.211", "10.96.0.212", "10.96.0.213"
	churnNodePort, churnTypeNodePort              = 30010, 30012
)

var churnServices = []string{"churn", "churn-gone", "churn-type", "churn-new"}

// churnReset deletes the churn Services and their slices, and waits until
// their cluster IPs are free again.
func (b *parityBed) churnReset(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, name := range churnServices {
		b.e.client.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{})
		b.e.client.DiscoveryV1().EndpointSlices("default").Delete(ctx, name+"-1", metav1.DeleteOptions{})
	}
	b.e.eventually("the churn Services' cluster IPs freed", func() (bool, string) {
		for _, ip := range []string{churnIP, churnGoneIP, churnTypeIP, churnNewIP} {
			if _, err := b.e.client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{}); err == nil {
				return false, ip + " still allocated"
			}
		}
		return true, ""
	})
}

// churnService is webService with a fixed cluster IP and, for a NodePort
// Service, fixed NodePorts (nodePort for http, the next for dns).
func churnService(name, ip string, nodePort int32) *corev1.Service {
	svc := webService(name)
	svc.Spec.ClusterIP = ip
	svc.Spec.Type = corev1.ServiceTypeClusterIP
	if nodePort != 0 {
		svc.Spec.Type = corev1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort = nodePort, nodePort+1
	}
	return svc
}

// churnStart makes the churn Services as each program first sees them.
func (b *parityBed) churnStart(t *testing.T) {
	t.Helper()
	b.e.createService(churnService("churn", churnIP, churnNodePort))
	b.e.setSlice("churn", "churn-1", "http", readyEP("10.244.0.20"), kubeEP{ip: "10.244.1.20", node: "node-b", ready: true, serving: true})
	b.e.createService(churnService("churn-gone", churnGoneIP, 0))
	b.e.setSlice("churn-gone", "churn-gone-1", "http", readyEP("10.244.0.21"))
	b.e.createService(churnService("churn-type", churnTypeIP, churnTypeNodePort))
	b.e.setSlice("churn-type", "churn-type-1", "http", kubeEP{ip: "10.244.1.23", node: "node-b", ready: true, serving: true})
}

// churnChange changes them while the program runs: endpoints replaced, a
// Service deleted, one turned from NodePort to ClusterIP with affinity,
// one added.
func (b *parityBed) churnChange(t *testing.T) {
	t.Helper()
	b.e.setSlice("churn", "churn-1", "http", kubeEP{ip: "10.244.1.20", node: "node-b", ready: true, serving: true}, kubeEP{ip: "10.244.1.21", node: "node-b", ready: true, serving: true})
	if err := b.e.client.CoreV1().Services("default").Delete(context.Background(), "churn-gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b.e.updateService("default", "churn-type", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.Ports[0].NodePort, s.Spec.Ports[1].NodePort = 0, 0
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	b.e.createService(churnService("churn-new", churnNewIP, 0))
	b.e.setSlice("churn-new", "churn-new-1", "http", readyEP("10.244.0.22"))
}

// compareAfterChurn runs kube-proxy, then sluice, in mode, each from the
// churn Services' first state, then changes them twice while it runs
// (churnChange, then one more endpoint, more than a second later), and
// returns both dumps after each change: what partial syncs leave. After
// the first, kube-proxy's nftables table still holds the chains no longer
// used, flushed; the second change's sync deletes them, a second on. want
// is waited for at start; wantChanged after each change.
//
// With takeover, each starts instead over the rules a kube-proxy run on
// the first state left when it stopped (kube-proxy leaves them on exit),
// the first change made while nothing ran: the binary swapped on a node.
func (b *parityBed) compareAfterChurn(t *testing.T, mode string, takeover bool, want []string, wantChanged [2][]string, dump func() ([]string, string), reset func()) (upstream, ours [2][]string) {
	t.Helper()
	flags := append([]string{"--proxy-mode=" + mode}, b.flags...)
	startKubeProxy := func() *proc {
		kp := startCmd(t, exec.Command(b.kubeProxy, append(flags, "--v=2")...))
		keepLogOf(t, kp, "kube-proxy")
		return kp
	}
	stopKubeProxy := func(kp *proc, cleanup bool) {
		kp.cmd.Process.Signal(os.Interrupt)
		kp.exitCode()
		if !cleanup {
			return
		}
		if out, err := exec.Command(b.kubeProxy, "--cleanup", "--proxy-mode="+mode).CombinedOutput(); err != nil {
			t.Fatalf("kube-proxy --cleanup: %v\n%s", err, out)
		}
	}
	first := append(slices.Clone(want), "10.244.0.20", churnGoneIP, fmt.Sprint(churnTypeNodePort))
	run := func(start func() *proc) (out [2][]string, p *proc) {
		b.churnReset(t)
		reset()
		b.churnStart(t)
		if takeover {
			kp := startKubeProxy()
			waitForDump(t, b.e, first, kp, dump)
			stopKubeProxy(kp, false)
			b.churnChange(t)
			p = start()
		} else {
			p = start()
			waitForDump(t, b.e, first, p, dump)
			b.churnChange(t)
		}
		out[0] = waitForDump(t, b.e, append(slices.Clone(want), wantChanged[0]...), p, dump)
		b.e.setSlice("churn", "churn-1", "http", kubeEP{ip: "10.244.1.20", node: "node-b", ready: true, serving: true},
			kubeEP{ip: "10.244.1.21", node: "node-b", ready: true, serving: true}, kubeEP{ip: "10.244.1.22", node: "node-b", ready: true, serving: true})
		out[1] = waitForDump(t, b.e, append(slices.Clone(want), wantChanged[1]...), p, dump)
		return out, p
	}
	upstream, kp := run(startKubeProxy)
	stopKubeProxy(kp, true)
	ours, sl := run(func() *proc {
		p := start(t, append(flags, "--mode-fallback=false")...)
		keepLog(t, p)
		return p
	})
	b.ours = sl
	return upstream, ours
}
