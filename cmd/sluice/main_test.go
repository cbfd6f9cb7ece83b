package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"k8s.io/klog/v2"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane"
	"github.com/sluice-proxy/sluice/lb"
)

func addrs(ss ...string) []netip.Addr {
	out := []netip.Addr{}
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestSelectNodePortAddrs(t *testing.T) {
	// fe80::5 is left out every time: it cannot be bound without its
	// interface (found by TestIPTablesParityWithKubeProxy's userspace run).
	local := addrs("127.0.0.1", "10.0.0.5", "192.168.1.7", "::1", "fd00::5", "fe80::5")
	cases := []struct {
		spec []string
		want []netip.Addr
	}{
		{nil, nil},
		// As kube-proxy, per family: IPv6, which no CIDR names, answers on
		// every address (found beside kube-proxy v1.34.2 by
		// TestIPTablesParityWithKubeProxy).
		{[]string{"10.0.0.0/8"}, addrs("10.0.0.5", "::1", "fd00::5")},
		{[]string{"127.0.0.0/8", "fd00::/8"}, addrs("127.0.0.1", "fd00::5")},
		{[]string{"172.16.0.0/12", "fc00::/8"}, addrs()},
		{[]string{"fe80::/10"}, addrs("10.0.0.5", "127.0.0.1", "192.168.1.7")},
		{[]string{"fd00::/8"}, addrs("10.0.0.5", "127.0.0.1", "192.168.1.7", "fd00::5")},
	}
	for _, tc := range cases {
		got := selectNodePortAddrs(tc.spec, local)
		if (got == nil) != (tc.want == nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%v: got %v, want %v", tc.spec, got, tc.want)
		}
	}
	// A kernel mode's rules for a family the flag leaves alone match every
	// local address (nil), as kube-proxy's match-all rule does.
	if got := nodePortAddrsFor([]string{"10.0.0.0/8"}, local, true); got != nil {
		t.Errorf("IPv6 with only an IPv4 CIDR: %v, want nil (all)", got)
	}
	if got := nodePortAddrsFor([]string{"10.0.0.0/8"}, local, false); !slices.Contains(got, netip.MustParseAddr("10.0.0.5")) {
		t.Errorf("IPv4 with an IPv4 CIDR: %v", got)
	}
}

// failingPlane is a data plane whose every Apply fails, as a killed or
// refused iptables-restore does.
type failingPlane struct{ err error }

func (p failingPlane) Apply(*lb.Snapshot) error { return p.err }
func (p failingPlane) Dump() any                { return nil }
func (p failingPlane) Tick()                    {}

// A state the data plane failed to apply is logged as an error, not as
// "state applied", and is not counted as a sync (issue 18).
func TestAFailedApplyIsNotReportedAsApplied(t *testing.T) {
	var logs bytes.Buffer
	metrics := admin.NewMetrics()
	a := &applier{plane: failingPlane{errors.New("iptables-restore: killed")}, local: &localAddrs{}, health: admin.NewHealth(time.Minute, nil),
		metrics: metrics, log: slog.New(slog.NewTextHandler(&logs, nil)), first: make(chan struct{})}
	a.Publish(lb.NewSnapshot(nil))
	if strings.Contains(logs.String(), "state applied") || !strings.Contains(logs.String(), "state not applied in full") {
		t.Fatalf("log after a failed apply:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "iptables-restore: killed") {
		t.Fatalf("the failure itself is not logged:\n%s", logs.String())
	}
	if n, err := testutil.GatherAndCount(metrics.Registry, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_duration_seconds"); err != nil || n != 0 {
		t.Fatalf("a failed apply was counted as a sync: %d series, %v", n, err)
	}
	if a.lastErr() == nil {
		t.Fatal("the failure is not kept for --bind-address-hard-fail")
	}
}

// resyncPlane is a kernel plane's sync state (latestState) whose syncs fail
// while fail is set, as a refused iptables-restore does.
type resyncPlane struct {
	latestState
	fail bool
}

func (p *resyncPlane) Apply(snap *lb.Snapshot) error { return p.applyNewest(snap, p.apply) }
func (p *resyncPlane) apply(*lb.Snapshot) error {
	if p.fail {
		return errors.New("iptables-restore: killed")
	}
	return nil
}
func (p *resyncPlane) Dump() any { return nil }
func (p *resyncPlane) Tick()     {}

// In the kernel modes a change that failed to apply stays pending, as in
// kube-proxy, whose syncs mark the health server updated only when they
// succeed: /healthz turns 503 once the change has waited the timeout, and
// 200 again when the plane's resync applies it. A plane with no retry of
// its own that tells (here one whose every apply fails) counts a failed
// apply as processed; userspace mode's capture retries and tells
// (TestAFailedVIPCaptureLeavesHealthPendingUntilItsRetry).
func TestAFailedKernelSyncLeavesHealthPendingUntilAResync(t *testing.T) {
	now := time.Unix(1e9, 0)
	clock := func() time.Time { return now }
	newApplier := func(plane dataPlane) *applier {
		a := &applier{plane: plane, local: &localAddrs{}, health: admin.NewHealth(time.Minute, clock), metrics: admin.NewMetrics(),
			log: slog.New(slog.NewTextHandler(io.Discard, nil)), first: make(chan struct{})}
		a.followResyncs()
		return a
	}
	healthy := func(a *applier) bool { ok, _, _ := a.health.Healthy(); return ok }

	p := &resyncPlane{}
	a := newApplier(p)
	a.Publish(lb.NewSnapshot(nil))
	if !healthy(a) {
		t.Fatal("unhealthy after a successful first sync")
	}
	p.fail = true
	a.Queued()
	a.Publish(lb.NewSnapshot(nil))
	now = now.Add(59 * time.Second)
	if !healthy(a) {
		t.Fatal("unhealthy before the failed change has waited the timeout")
	}
	now = now.Add(time.Second)
	if healthy(a) {
		t.Fatal("healthy with a change that failed to apply a minute ago")
	}
	if err := p.reapplyNewest(p.apply); err == nil {
		t.Fatal("the resync applied while syncs still fail")
	}
	if healthy(a) {
		t.Fatal("healthy after a failed resync")
	}
	p.fail = false
	if err := p.reapplyNewest(p.apply); err != nil {
		t.Fatal(err)
	}
	if !healthy(a) {
		t.Fatal("still unhealthy after a resync applied the change")
	}

	u := newApplier(failingPlane{errors.New("VIP capture: nft: refused")})
	u.Queued()
	u.Publish(lb.NewSnapshot(nil))
	now = now.Add(time.Hour)
	if !healthy(u) {
		t.Fatal("a userspace plane's failed apply left health pending")
	}
}

// familyPlane is a kernel plane whose families sync apart, IPv6 failing
// while failV6 is set.
type familyPlane struct {
	latestState
	failV4, failV6 bool
}

func (p *familyPlane) Apply(snap *lb.Snapshot) error { return p.applyNewest(snap, p.apply) }
func (p *familyPlane) apply(*lb.Snapshot) error {
	var errs []error
	if p.failV4 {
		errs = append(errs, &familyError{"IPv4", errors.New("IPv4: iptables-restore: exit status 1")})
	}
	if p.failV6 {
		errs = append(errs, &familyError{"IPv6", errors.New("IPv6: ip6tables-restore: exit status 1")})
	}
	return errors.Join(errs...)
}
func (p *familyPlane) Dump() any { return nil }
func (p *familyPlane) Tick()     {}

// Where one family of a plane whose families sync apart fails and the
// other syncs, only the failed one waits: /healthz answers 503 once its
// change has waited the timeout, and its status alone is unhealthy (as
// kube-proxy's per-family proxiers each mark their own); the resync that
// applies it clears it. When every family fails, all wait, and the state
// was last brought up to date by the sync before.
func TestAFamilyThatFailsAloneWaitsAlone(t *testing.T) {
	now := time.Unix(1e9, 0)
	health := admin.NewHealth(time.Minute, func() time.Time { return now })
	metrics := admin.NewMetrics()
	metrics.SetFamilies("IPv4", "IPv6")
	p := &familyPlane{}
	a := &applier{plane: p, local: &localAddrs{}, health: health, metrics: metrics,
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), first: make(chan struct{})}
	a.followResyncs()
	hz := (&admin.Endpoints{Health: health, Metrics: metrics, ProxyMode: "iptables"}).HealthzHandler()
	status := func() (int, string) {
		rec := httptest.NewRecorder()
		hz.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	a.Publish(lb.NewSnapshot(nil))
	p.failV6 = true
	a.Queued()
	a.Publish(lb.NewSnapshot(nil))
	now = now.Add(time.Minute)
	code, body := status()
	if code != 503 || !strings.Contains(body, `"IPv4":{"lastUpdated":`) || !strings.Contains(body, `"IPv6":{"lastUpdated":`) {
		t.Fatalf("IPv6 failed a minute ago: %d %s", code, body)
	}
	if !regexp.MustCompile(`"IPv4":\{[^}]*"healthy":true`).MatchString(body) || !regexp.MustCompile(`"IPv6":\{[^}]*"healthy":false`).MatchString(body) {
		t.Fatalf("IPv6 failed a minute ago, IPv4 synced: %s", body)
	}
	p.failV6 = false
	if err := p.reapplyNewest(p.apply); err != nil {
		t.Fatal(err)
	}
	if code, body := status(); code != 200 {
		t.Fatalf("after the resync: %d %s", code, body)
	}
	resynced := now.UTC().Format(time.RFC3339)
	p.failV4, p.failV6 = true, true
	now = now.Add(time.Second)
	a.Queued()
	a.Publish(lb.NewSnapshot(nil))
	now = now.Add(time.Minute)
	if code, body := status(); code != 503 || strings.Contains(body, `"healthy":true`) || !strings.HasPrefix(body, `{"lastUpdated":"`+resynced) {
		t.Fatalf("every family failed a minute ago, up to date at %s: %d %s", resynced, code, body)
	}
}

// kube-proxy's no_local_endpoints counts a Local port only when it has
// endpoints, none of them here; per family and policy.
func TestNoLocalEndpointsCount(t *testing.T) {
	ep := func(s string, local bool) lb.Endpoint {
		return lb.Endpoint{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort(s)), Ready: true, Serving: true, Local: local}
	}
	port := func(name, cip string, eps ...lb.Endpoint) *lb.ServicePort {
		return &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: name, Protocol: lb.TCP}, ClusterIPs: []netip.Addr{netip.MustParseAddr(cip)}, Endpoints: eps}
	}
	remoteOnly := port("a", "10.96.0.1", ep("10.244.1.1:80", false))
	remoteOnly.ExternalLocal, remoteOnly.NodePort = true, 30001
	hasLocal := port("b", "10.96.0.2", ep("10.244.1.2:80", true))
	hasLocal.ExternalLocal, hasLocal.NodePort = true, 30002
	internal := port("c", "10.96.0.3", ep("10.244.1.3:80", false))
	internal.InternalLocal = true
	none := port("d", "10.96.0.4")
	none.InternalLocal = true
	v6 := port("e", "fd00::1", ep("[fd00:244::1]:80", false))
	v6.InternalLocal = true
	snapPorts := map[lb.ServicePortName]*lb.ServicePort{}
	for _, p := range []*lb.ServicePort{remoteOnly, hasLocal, internal, none, v6} {
		snapPorts[p.Name] = p
	}
	snap := lb.NewSnapshot(snapPorts)
	if in, ex := noLocalEndpoints(snap, false); in != 1 || ex != 1 {
		t.Fatalf("IPv4: internal %d external %d, want 1 and 1", in, ex)
	}
	if in, ex := noLocalEndpoints(snap, true); in != 1 || ex != 0 {
		t.Fatalf("IPv6: internal %d external %d, want 1 and 0", in, ex)
	}
}

// moby/ipvs's logrus lines come out in sluice's log and format, its
// ordinary fall-back lines as debug ones (issue 17).
func TestLogrusLinesJoinSluicesLog(t *testing.T) {
	var out bytes.Buffer
	routeLogrus(slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	logrus.Warnf("Running modprobe ip_vs failed with message: `%s`, error: %v", "nope", "exit status 1")
	logrus.Error("something else went wrong")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"level":"DEBUG"`) || !strings.Contains(lines[0], `"from":"moby/ipvs"`) ||
		!strings.Contains(lines[1], `"level":"ERROR"`) || !strings.Contains(lines[1], "something else") {
		t.Fatalf("log:\n%s", out.String())
	}
}

// okPlane is a data plane whose every Apply succeeds.
type okPlane struct{}

func (okPlane) Apply(*lb.Snapshot) error { return nil }
func (okPlane) Dump() any                { return nil }
func (okPlane) Tick()                    {}

// An applied update's times go into kube-proxy's network programming
// latency (per family) and sluice_update_apply_seconds; a failed one's do
// not (it was not programmed).
func TestUpdateTimesObservedOnceApplied(t *testing.T) {
	for _, tc := range []struct {
		plane dataPlane
		want  int
	}{{okPlane{}, 1}, {failingPlane{errors.New("iptables-restore: killed")}, 0}} {
		metrics := admin.NewMetrics()
		a := &applier{plane: tc.plane, local: &localAddrs{}, health: admin.NewHealth(time.Minute, nil),
			metrics: metrics, log: slog.New(slog.DiscardHandler), first: make(chan struct{})}
		now := time.Now()
		a.PublishTimed(lb.NewSnapshot(nil), controlplane.UpdateTimes{
			Triggers: []controlplane.Trigger{{Family: "IPv4", At: now.Add(-2 * time.Second)}}, Arrived: []time.Time{now.Add(-time.Millisecond)}})
		families, err := metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		observed := map[string]uint64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				observed[f.GetName()] += m.GetHistogram().GetSampleCount()
			}
		}
		for _, name := range []string{"kubeproxy_network_programming_duration_seconds", "sluice_update_apply_seconds"} {
			if observed[name] != uint64(tc.want) {
				t.Errorf("%T: %s observed %d times, want %d", tc.plane, name, observed[name], tc.want)
			}
		}
	}
}

// stepClock is a clock that moves a millisecond each time it is read,
// and as much more as it is told.
type stepClock struct{ at time.Time }

func (c *stepClock) now() time.Time {
	c.at = c.at.Add(time.Millisecond)
	return c.at
}

// slowLog is a log handler that takes a minute of c's time per record,
// as a log write stuck behind a full pipe would.
type slowLog struct{ c *stepClock }

func (h slowLog) Enabled(context.Context, slog.Level) bool { return true }
func (h slowLog) Handle(context.Context, slog.Record) error {
	h.c.at = h.c.at.Add(time.Minute)
	return nil
}
func (h slowLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h slowLog) WithGroup(string) slog.Handler      { return h }

// An update's latency ends when the data plane has it, as kube-proxy's
// network programming latency ends once its rules are in the kernel: what
// the apply does after that (the "state applied" line, the health-check
// ports) is not in the update's latency. The last sync's timestamp is
// that same moment, as kube-proxy stamps it right after the latency.
func TestUpdateLatencyEndsWhenThePlaneHasIt(t *testing.T) {
	clock := &stepClock{at: time.Unix(1_700_000_000, 0)}
	metrics := admin.NewMetrics()
	a := &applier{plane: okPlane{}, local: &localAddrs{}, health: admin.NewHealth(time.Hour, nil),
		metrics: metrics, log: slog.New(slowLog{clock}), first: make(chan struct{}), clock: clock.now}
	trigger, arrived := clock.at.Add(-2*time.Second), clock.at.Add(-3*time.Millisecond)
	a.PublishTimed(lb.NewSnapshot(nil), controlplane.UpdateTimes{
		Triggers: []controlplane.Trigger{{Family: "IPv4", At: trigger}}, Arrived: []time.Time{arrived}})
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]float64{}
	var last float64
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				sums[f.GetName()] += h.GetSampleSum()
			}
			if f.GetName() == "kubeproxy_sync_proxy_rules_last_timestamp_seconds" {
				last = m.GetGauge().GetValue()
			}
		}
	}
	own := sums["sluice_update_apply_seconds"]
	if own <= 0 || own >= 1 {
		t.Fatalf("own share %v s: want the few ticks to the plane's apply, not the log's minute", own)
	}
	// Both latencies end at the last sync's timestamp.
	applied := float64(arrived.UnixNano())/1e9 + own
	if d := last - applied; d > 1e-6 || d < -1e-6 {
		t.Errorf("last sync stamped at %.6f, the own share ended at %.6f", last, applied)
	}
	if d := sums["kubeproxy_network_programming_duration_seconds"] - (own + 2 - 0.003); d > 1e-6 || d < -1e-6 {
		t.Errorf("network programming %v s, want the own share's end less the trigger (%v)", sums["kubeproxy_network_programming_duration_seconds"], own+2-0.003)
	}
}

// The changed-ports log names the same ports whether the snapshot says
// what changed (a delta of the last) or the two are compared whole.
func TestChangedPortsFromADeltaOrAComparison(t *testing.T) {
	port := func(name string, p uint16) *lb.ServicePort {
		return &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: name, Port: "p", Protocol: lb.TCP}, Port: p}
	}
	a, b, c := port("a", 80), port("b", 80), port("c", 80)
	prev := lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{a.Name: a, b.Name: b})
	prev.ID = 4
	b2 := port("b", 81)
	set := map[lb.ServicePortName]*lb.ServicePort{b2.Name: b2, c.Name: c}
	next := &lb.Snapshot{Ports: prev.Ports.With(set, []lb.ServicePortName{a.Name}), ID: 5, Base: 4, Changed: []lb.ServicePortName{c.Name, b2.Name, a.Name}}
	whole := &lb.Snapshot{Ports: next.Ports}
	want := "ns/a:p/TCP,ns/b:p/TCP,ns/c:p/TCP"
	for _, tc := range []struct {
		how  string
		next *lb.Snapshot
	}{{"from the delta", next}, {"compared", whole}} {
		n, first := changedPorts(prev, tc.next)
		if got := portNames(first); n != 3 || got != want {
			t.Fatalf("%s: %d, %v, want 3, %v", tc.how, n, got, want)
		}
	}
	// Of many, the first eight in name order are named, all are counted.
	many := map[lb.ServicePortName]*lb.ServicePort{}
	for i := 19; i >= 0; i-- {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%02d", i), Port: "p", Protocol: lb.UDP}, Port: 53}
		many[sp.Name] = sp
	}
	n, first := changedPorts(nil, lb.NewSnapshot(many))
	if got, want := portNames(first), "ns/s00:p/UDP,ns/s01:p/UDP,ns/s02:p/UDP,ns/s03:p/UDP,ns/s04:p/UDP,ns/s05:p/UDP,ns/s06:p/UDP,ns/s07:p/UDP"; n != 20 || got != want {
		t.Fatalf("20 new ports: %d, %q, want 20, %q", n, got, want)
	}
}

func TestUnjoinNilIsNothing(t *testing.T) {
	if errs := unjoin(nil); len(errs) != 0 {
		t.Fatalf("unjoin(nil) = %v", errs)
	}
	if errs := unjoin(errors.Join(errors.New("a"), errors.New("b"))); len(errs) != 2 {
		t.Fatalf("unjoin of two = %v", errs)
	}
}

// Start-up says where the proxy mode came from: the flag, the config
// file, or the default, which differs from kube-proxy's.
func TestModeOrigin(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kp.yaml")
	for _, tc := range []struct {
		config string
		args   []string
		want   string
	}{
		{"", nil, "the default (sluice's is userspace; kube-proxy's is iptables)"},
		{"", []string{"--proxy-mode=iptables"}, "the --proxy-mode flag"},
		{"mode: nftables\n", nil, "mode in " + file},
		{"mode: \"\"\n", nil, "the default: mode is empty in " + file + ", which is userspace to sluice (iptables to kube-proxy)"},
		{"mode: nftables\n", []string{"--proxy-mode=ipvs"}, "mode in " + file}, // the file holds it, as in kube-proxy
	} {
		args := tc.args
		if tc.config != "" {
			os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+tc.config), 0o644)
			args = append([]string{"--config", file}, args...)
		}
		cfg, _, err := config.Parse(args)
		if err != nil {
			t.Fatal(err)
		}
		if got := modeOrigin(cfg); got != tc.want {
			t.Errorf("%v: %q, want %q", args, got, tc.want)
		}
	}
}

// TestHealthCheckPortsFollowDeltas walks random deltas (health check node
// ports added, moved, dropped; local endpoints changed; ports removed),
// with now and then a snapshot that is not a delta of the last one, and
// checks after each that the tracked list is the one a walk of every port
// gives.
func TestHealthCheckPortsFollowDeltas(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 1))
	name := func(i int) lb.ServicePortName {
		// Two ports per Service: they share its health check node port.
		return lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i/2), Port: fmt.Sprintf("p%d", i%2), Protocol: lb.TCP}
	}
	port := func(i int) *lb.ServicePort {
		sp := &lb.ServicePort{Name: name(i), Port: 80}
		if rng.IntN(3) > 0 {
			sp.HealthCheckNodePort = uint16(30000 + i/2)
		}
		for j := range rng.IntN(4) {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), byte(j)}), 80),
				Local: rng.IntN(2) == 0, Ready: rng.IntN(4) > 0})
		}
		return sp
	}
	whole := func(snap *lb.Snapshot) []admin.HealthCheckService {
		var all []*lb.ServicePort
		for _, sp := range snap.Ports.All() {
			all = append(all, sp)
		}
		return healthCheckServices(slices.Values(all))
	}
	var h healthCheckPorts
	snap := lb.NewSnapshot(nil)
	snap.ID = 1
	deltas := 0
	for step := range 500 {
		set := map[lb.ServicePortName]*lb.ServicePort{}
		var del, changed []lb.ServicePortName
		for range rng.IntN(4) + 1 {
			i := rng.IntN(40)
			if rng.IntN(4) == 0 {
				delete(set, name(i))
				del = append(del, name(i))
			} else {
				sp := port(i)
				set[sp.Name] = sp
				del = slices.DeleteFunc(del, func(n lb.ServicePortName) bool { return n == sp.Name })
			}
			changed = append(changed, name(i))
		}
		next := &lb.Snapshot{Ports: snap.Ports.With(set, del), ID: snap.ID + 1, Base: snap.ID, Changed: changed}
		if rng.IntN(10) == 0 {
			next.Base, next.Changed = 0, nil // not a delta: the whole map is walked
		} else {
			deltas++
		}
		got := h.update(next)
		if want := whole(next); !slices.Equal(got, want) {
			t.Fatalf("step %d: tracked %v, a walk of every port gives %v", step, got, want)
		}
		snap = next
	}
	if deltas < 400 {
		t.Fatalf("only %d of 500 steps were deltas", deltas)
	}
}

type fakeAddrWatch struct{ changed bool }

func (f *fakeAddrWatch) Changed() bool { c := f.changed; f.changed = false; return c }

// With a watch, the local addresses are listed on the first refresh,
// after the watch says they changed, and after a listing failed; not
// otherwise.
func TestLocalAddrsListOnlyAfterAChange(t *testing.T) {
	w := &fakeAddrWatch{}
	dumps := 0
	var fail error
	l := &localAddrs{watch: w, dump: func() ([]net.Addr, error) {
		dumps++
		return []net.Addr{&net.IPNet{IP: net.IPv4(192, 0, 2, byte(dumps)), Mask: net.CIDRMask(32, 32)}}, fail
	}}
	step := func(changed bool, want int) {
		t.Helper()
		w.changed = changed
		l.refresh()
		if dumps != want {
			t.Fatalf("%d listings, want %d", dumps, want)
		}
	}
	step(false, 1) // the first refresh lists
	step(false, 1)
	step(true, 2)
	if !l.has(netip.MustParseAddr("192.0.2.2")) {
		t.Fatalf("addresses %v, want the second listing's", l.list())
	}
	fail = errors.New("netlink: no buffer space")
	step(true, 3)
	fail = nil
	step(false, 4) // the last listing failed: list again
	step(false, 4)
}

// A large applied state asks for its garbage to be handed back (run does
// it, off the publishing goroutine); a small update, and a state that
// failed to apply, do not.
func TestABigAppliedStateAsksForAMemoryRelease(t *testing.T) {
	ports := func(n int) *lb.Snapshot {
		sps := map[lb.ServicePortName]*lb.ServicePort{}
		for i := range n {
			name := lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Protocol: lb.TCP}
			sps[name] = &lb.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80}
		}
		return lb.NewSnapshot(sps)
	}
	asked := func(a *applier) bool {
		select {
		case <-a.release:
			return true
		default:
			return false
		}
	}
	newApplier := func(p dataPlane) *applier {
		return &applier{plane: p, local: &localAddrs{}, health: admin.NewHealth(time.Minute, nil), metrics: admin.NewMetrics(),
			log: slog.New(slog.DiscardHandler), first: make(chan struct{}), release: make(chan struct{}, 1)}
	}
	small := newApplier(okPlane{})
	small.Publish(ports(bigApply - 1))
	if asked(small) {
		t.Fatalf("%d changed ports asked for a release", bigApply-1)
	}
	small.Publish(ports(bigApply)) // one more port
	if asked(small) {
		t.Fatal("one changed port asked for a release")
	}
	a := newApplier(okPlane{})
	big := ports(bigApply)
	a.Publish(big)
	if !asked(a) {
		t.Fatalf("%d changed ports did not ask for a release", bigApply)
	}
	a.Publish(big) // nothing changed
	if asked(a) {
		t.Fatal("an unchanged state asked for a release")
	}
	f := newApplier(failingPlane{errors.New("iptables-restore: killed")})
	f.Publish(big)
	if asked(f) {
		t.Fatal("a state that failed to apply asked for a release")
	}
}

// The garbage of large states is handed back handBackDelay after the first
// ask, once for every ask until then, and not before: a restarted proxy's
// first updates do not meet the collection it forces.
func TestHandBackWaitsAndCoalescesAsks(t *testing.T) {
	asks := make(chan struct{})
	timers := make(chan chan time.Time, 8)
	freed := make(chan struct{}, 8)
	h := handBack{asks: asks, delay: handBackDelay, log: slog.New(slog.DiscardHandler),
		after: func(d time.Duration) <-chan time.Time {
			if d != handBackDelay {
				t.Errorf("waits %v, want %v", d, handBackDelay)
			}
			c := make(chan time.Time, 1)
			timers <- c
			return c
		},
		free: func() { freed <- struct{}{} }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// A guard against a hang, not a wait: each event is due at once.
	within := func(what string, c <-chan chan time.Time) chan time.Time {
		select {
		case x := <-c:
			return x
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", what)
			return nil
		}
	}
	for round := range 2 {
		asks <- struct{}{}
		timer := within("wait", timers)
		asks <- struct{}{} // taken while the first waits: no wait of its own
		asks <- struct{}{}
		if len(freed) != 0 {
			t.Fatalf("round %d: handed back before its delay", round)
		}
		timer <- time.Now()
		select {
		case <-freed:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: not handed back when its delay ran out", round)
		}
		// The asks were handled before the hand-back, in order.
		if len(timers) != 0 || len(freed) != 0 {
			t.Fatalf("round %d: %d more waits, %d more hand-backs; want none", round, len(timers), len(freed))
		}
	}
}

// TestStartCollectionLowersTheGoalUntilTheFirstState checks that the
// collector runs at startGCPercent until the first state is applied, then
// at Go's default, and that a GOGC of the user's is left alone.
func TestStartCollectionLowersTheGoalUntilTheFirstState(t *testing.T) {
	set := make(chan int, 4)
	c := startCollection{getenv: func(string) string { return "" }, log: slog.New(slog.DiscardHandler),
		setPercent: func(p int) int { set <- p; return 37 }} // the previous goal, not put back
	first := make(chan struct{})
	c.until(context.Background(), first)
	if got := <-set; got != startGCPercent {
		t.Fatalf("goal %d at start, want %d", got, startGCPercent)
	}
	if len(set) != 0 {
		t.Fatalf("goal put back before the first state")
	}
	close(first)
	select {
	case got := <-set:
		if got != defaultGCPercent {
			t.Fatalf("goal %d after the first state, want Go's default %d", got, defaultGCPercent)
		}
	case <-time.After(10 * time.Second): // a guard against a hang, not a wait
		t.Fatal("goal not put back after the first state")
	}

	// Put back once, however often asked.
	restore := c.lower()
	<-set
	restore()
	restore()
	if got := <-set; got != defaultGCPercent || len(set) != 0 {
		t.Fatalf("put back as %d, with %d more", got, len(set))
	}

	// The user's GOGC is theirs.
	user := startCollection{getenv: func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	}, log: slog.New(slog.DiscardHandler), setPercent: func(p int) int { set <- p; return 200 }}
	user.lower()()
	if len(set) != 0 {
		t.Fatalf("goal set to %d with GOGC in the environment", <-set)
	}
}

// lineSignal is a log writer that hands each line that holds want to
// found, once.
type lineSignal struct {
	want  string
	found chan string
	buf   bytes.Buffer // the line being written
	all   bytes.Buffer // everything written
	sent  bool
}

func (w *lineSignal) Write(p []byte) (int, error) {
	w.all.Write(p)
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line) // a partial line waits for its end
			return len(p), nil
		}
		if !w.sent && strings.Contains(line, w.want) {
			w.sent = true
			w.found <- line
		}
	}
}

// A Windows node's kube-proxy configuration says mode: kernelspace (HNS
// load balancers), which config.Validate takes on Windows only. sluice
// serves it in userspace mode, saying why in one line, or with
// --mode-fallback=false refuses to start. The configuration is made here
// as Windows's validation leaves it and run in process.
func TestKernelspaceIsServedInUserspaceMode(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// runConfigured routes klog and logrus into its log: put both back
	// for the tests after this one.
	std := logrus.StandardLogger()
	hooks, out, level := std.ReplaceHooks(make(logrus.LevelHooks)), std.Out, std.GetLevel()
	t.Cleanup(func() {
		std.ReplaceHooks(hooks)
		std.SetOutput(out)
		std.SetLevel(level)
		klog.ClearLogger()
	})
	for _, fallback := range []bool{true, false} {
		cfg, _, err := config.Parse([]string{"--manifests", file, "--healthz-bind-address=", "--metrics-bind-address=", "--userspace-capture=none",
			"--handover-socket=", fmt.Sprintf("--mode-fallback=%v", fallback)})
		if err != nil {
			t.Fatal(err)
		}
		cfg.KubeProxy.Mode = config.ModeKernelspace
		fellBack := &lineSignal{want: "proxy mode kernelspace is unavailable; falling back to userspace mode", found: make(chan string, 1)}
		ctx, cancel := context.WithCancel(context.Background())
		code := make(chan int, 1)
		go func() { code <- runConfigured(ctx, cfg, nil, fellBack, fellBack) }()
		if fallback {
			var line string
			select {
			case line = <-fellBack.found:
			case c := <-code:
				cancel()
				t.Fatalf("exit %d before any fall-back:\n%s", c, fellBack.all.String())
			}
			if !strings.Contains(line, "HNS") {
				t.Errorf("the fall-back line does not say why: %q", line)
			}
			cancel()
			if c := <-code; c != 0 {
				t.Errorf("exit %d after the fall-back:\n%s", c, fellBack.all.String())
			}
			continue
		}
		c := <-code
		cancel()
		if out := fellBack.all.String(); c == 0 || fellBack.sent || !strings.Contains(out, "--proxy-mode=kernelspace") || !strings.Contains(out, "HNS") {
			t.Errorf("--mode-fallback=false: exit %d, fell back %v, output:\n%s", c, fellBack.sent, out)
		}
	}
}
