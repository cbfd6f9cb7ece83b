package main

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/kernel/ipvs"
	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
)

// flakyRunner is the stateful fake whose restores fail while broken, as a
// killed or refused iptables-restore does; it counts the attempts.
type flakyRunner struct {
	*iptables.Fake
	broken   bool
	restores int
}

func (r *flakyRunner) Restore(data []byte) error {
	r.restores++
	if r.broken {
		return errors.New("iptables-restore: exit status 4")
	}
	return r.Fake.Restore(data)
}

// After failed syncs the plane waits 1 s, 2 s, 4 s ... (at most the
// resync period) before the next restore, whatever arrives meanwhile, and
// then applies the newest state; a success ends the back-off.
func TestFailedSyncsBackOff(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &flakyRunner{Fake: iptables.NewFake(), broken: true}
	cfg := config.Defaults()
	p := &iptablesPlane{cfg: cfg, local: &localAddrs{set: map[netip.Addr]bool{}}, metrics: admin.NewMetrics(),
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		proxiers: []*iptables.Proxier{{Runner: r, Options: iptablesOptions(cfg, false, nodeFacts{})}},
		backoff:  syncBackoff{now: func() time.Time { return now }, max: 5 * time.Second}}
	waits := backOffWalk(t, 5, 1, p.Apply, r, p.backoffWait, &now)
	if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	// The resync after the wait applies the newest state, and succeeds.
	recovers(t, r, func() error { return p.reapplyNewest(p.applyLocked) }, p.backoffWait, func() bool { return p.failed })
	if dump := r.Fake.Dump(); !strings.Contains(dump, "10.96.0.2") || strings.Contains(dump, "10.96.0.1/32") {
		t.Fatalf("the newest state was not the one applied:\n%s", dump)
	}
}

// IPVS mode backs off the same way: while its rules keep failing to apply,
// an update waits for the back-off instead of trying again at once, and
// the resync after the wait applies the newest state.
func TestIPVSFailedSyncsBackOff(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &flakyRunner{Fake: iptables.NewFake(), broken: true}
	b := &portals.Binder{Table: portals.NewFakeAddrTable(), Interface: ipvsInterface, DummyOnly: true}
	if _, err := b.Init(); err != nil {
		t.Fatal(err)
	}
	kernel := ipvs.NewFake()
	cfg := config.Defaults()
	p := &ipvsPlane{cfg: cfg, local: &localAddrs{set: map[netip.Addr]bool{}}, metrics: admin.NewMetrics(), binder: b,
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		proxiers: []*ipvs.Proxier{{Kernel: kernel}},
		filters:  []*ipvs.Netfilter{{Sets: ipvs.NewFakeIPSet(), IPTables: r, MasqueradeBit: 14}},
		backoff:  syncBackoff{now: func() time.Time { return now }, max: 5 * time.Second}}
	waits := backOffWalk(t, 4, 0, p.Apply, r, p.backoffWait, &now)
	if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	recovers(t, r, func() error { return p.reapplyNewest(p.applyLocked) }, p.backoffWait, func() bool { return p.failed })
	if dump := kernel.Dump(); !strings.Contains(dump, "10.96.0.2") || strings.Contains(dump, "10.96.0.1") {
		t.Fatalf("the newest state was not the one applied:\n%s", dump)
	}
}

// oneServiceAt is a snapshot of one TCP service port at ClusterIP ip.
func oneServiceAt(ip string) *lb.Snapshot {
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: "svc", Port: "p", Protocol: lb.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Port: 80}
	return lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{sp.Name: sp})
}

// backOffWalk applies the state at 10.96.0.1 n times through apply while
// r fails: each attempt must run r's restore (perAttempt times, or at
// least once for 0) and fail, and an update to 10.96.0.2 during the wait
// must be deferred without a restore. It advances *now past each wait
// and returns the waits.
func backOffWalk(t *testing.T, n, perAttempt int, apply func(*lb.Snapshot) error, r *flakyRunner, wait func() time.Duration, now *time.Time) []time.Duration {
	t.Helper()
	var waits []time.Duration
	for i := 0; i < n; i++ {
		before := r.restores
		err := apply(oneServiceAt("10.96.0.1"))
		if ran := r.restores - before; err == nil || ran == 0 || (perAttempt > 0 && ran != perAttempt) {
			t.Fatalf("attempt %d: %v, %d restores (want a failing one)", i, err, ran)
		}
		waits = append(waits, wait())
		after := r.restores
		if err := apply(oneServiceAt("10.96.0.2")); !errors.As(err, new(errBackingOff)) || r.restores != after {
			t.Fatalf("attempt %d: an update during the back-off: %v, %d restores", i, err, r.restores-after)
		}
		*now = now.Add(wait())
	}
	return waits
}

// recovers mends r, runs the plane's resync and checks that the back-off
// and the failure are over.
func recovers(t *testing.T, r *flakyRunner, resync func() error, wait func() time.Duration, failed func() bool) {
	t.Helper()
	r.broken = false
	if err := resync(); err != nil {
		t.Fatal(err)
	}
	if wait() != 0 || failed() {
		t.Fatalf("after a success: wait %v, failed %v", wait(), failed())
	}
}

// An iptables plane whose IPv6 restore fails while IPv4's succeeds says
// which family failed (for /healthz's status per family), and only it.
func TestIPTablesPlaneNamesTheFamilyThatFailed(t *testing.T) {
	cfg := config.Defaults()
	v4 := &flakyRunner{Fake: iptables.NewFake()}
	v6 := &flakyRunner{Fake: iptables.NewFake(), broken: true}
	p := &iptablesPlane{cfg: cfg, local: &localAddrs{set: map[netip.Addr]bool{}}, metrics: admin.NewMetrics(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		proxiers: []*iptables.Proxier{{Runner: v4, Options: iptablesOptions(cfg, false, nodeFacts{})},
			{Runner: v6, Options: iptablesOptions(cfg, true, nodeFacts{})}}}
	err := p.Apply(lb.NewSnapshot(nil))
	if got := failedFamilies(err); !slices.Equal(got, []string{"IPv6"}) || v4.restores != 1 {
		t.Fatalf("failed families %v (err %v), IPv4 restores %d", got, err, v4.restores)
	}
}
