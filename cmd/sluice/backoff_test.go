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
		proxiers: []*iptables.Proxier{{Runner: r, Options: iptablesOptions(cfg, false)}},
		backoff:  syncBackoff{now: func() time.Time { return now }, max: 5 * time.Second}}
	snap := func(ip string) *lb.Snapshot {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: "svc", Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Port: 80}
		return lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{sp.Name: sp})
	}
	var waits []time.Duration
	for i := 0; i < 5; i++ {
		before := r.restores
		if err := p.Apply(snap("10.96.0.1")); err == nil || r.restores != before+1 {
			t.Fatalf("attempt %d: %v, %d restores (want one, failing)", i, err, r.restores-before)
		}
		waits = append(waits, p.backoffWait())
		// Updates during the wait are not applied, and say why.
		if err := p.Apply(snap("10.96.0.2")); !errors.As(err, new(errBackingOff)) || r.restores != before+1 {
			t.Fatalf("attempt %d: an update during the back-off: %v, %d restores", i, err, r.restores-before)
		}
		now = now.Add(p.backoffWait())
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	// The resync after the wait applies the newest state, and succeeds.
	r.broken = false
	if err := p.reapplyNewest(p.applyLocked); err != nil {
		t.Fatal(err)
	}
	if p.backoffWait() != 0 || p.failed {
		t.Fatalf("after a success: wait %v, failed %v", p.backoffWait(), p.failed)
	}
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
	snap := func(ip string) *lb.Snapshot {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: "svc", Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Port: 80}
		return lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{sp.Name: sp})
	}
	var waits []time.Duration
	for i := 0; i < 4; i++ {
		before := r.restores
		if err := p.Apply(snap("10.96.0.1")); err == nil || r.restores == before {
			t.Fatalf("attempt %d: %v, %d restores (want a failing one)", i, err, r.restores-before)
		}
		waits = append(waits, p.backoffWait())
		after := r.restores
		if err := p.Apply(snap("10.96.0.2")); !errors.As(err, new(errBackingOff)) || r.restores != after {
			t.Fatalf("attempt %d: an update during the back-off: %v, %d restores", i, err, r.restores-after)
		}
		now = now.Add(p.backoffWait())
	}
	if want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	r.broken = false
	if err := p.reapplyNewest(p.applyLocked); err != nil {
		t.Fatal(err)
	}
	if p.backoffWait() != 0 || p.failed {
		t.Fatalf("after a success: wait %v, failed %v", p.backoffWait(), p.failed)
	}
	if dump := kernel.Dump(); !strings.Contains(dump, "10.96.0.2") || strings.Contains(dump, "10.96.0.1") {
		t.Fatalf("the newest state was not the one applied:\n%s", dump)
	}
}
