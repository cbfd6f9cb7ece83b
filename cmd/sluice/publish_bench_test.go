package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// BenchmarkPublishOneChangeAt10k is sluice's own share of one endpoint
// change at 10k service ports in userspace mode, past the source: the
// applier and the userspace plane, given the change as a delta of the
// last snapshot (issue 16). go test -bench PublishOneChange ./cmd/sluice
func BenchmarkPublishOneChangeAt10k(b *testing.B) {
	const n = 10000
	port, all := benchPorts(n)
	metrics := admin.NewMetrics()
	log := slog.New(slog.DiscardHandler)
	health := admin.NewHealth(time.Minute, nil)
	local := &localAddrs{}
	if w, err := newAddrWatch(); err == nil {
		local.watch = w
		defer w.Close()
	}
	// Wired as run wires them: node addresses (with the address watch), the SCTP count (no SCTP
	// listener, as on a kernel without SCTP) and the health check ports.
	srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
		NodePortAddrs: func() []netip.Addr { return selectNodePortAddrs(nil, local.list()) },
		SCTPSkipped:   metrics.SCTPSkipped, SCTPWhy: "benchmark"}
	servedCounters(srv, metrics)
	defer srv.Close()
	svcHealth := &admin.ServiceHealth{Addrs: func() []netip.Addr { return selectNodePortAddrs(nil, local.list()) }}
	defer svcHealth.Close()
	a := &applier{plane: userspacePlane{Server: srv, capture: noCapture{}, metrics: metrics, health: health, log: log},
		local: local, health: health, metrics: metrics, log: log, first: make(chan struct{}), svcHealth: svcHealth}
	snap := lb.NewSnapshot(all)
	snap.ID = 1
	a.Publish(snap)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sp := port(i%n, i%200+1)
		next := &lb.Snapshot{Ports: snap.Ports.With(map[lb.ServicePortName]*lb.ServicePort{sp.Name: sp}, nil), ID: snap.ID + 1, Base: snap.ID, Changed: []lb.ServicePortName{sp.Name}}
		a.Publish(next)
		snap = next
	}
}

// BenchmarkFirstPublishAt10k is a start in userspace mode at 10k
// ClusterIP service ports past the source: the first snapshot applied,
// which opens a proxy port for each, on the event loop with random proxy
// ports (no --proxy-port-range) as run picks them (sluice-picks) and as a
// bind to port 0 would (kernel-picks). go test -bench FirstPublish
// -benchtime 3x ./cmd/sluice
func BenchmarkFirstPublishAt10k(b *testing.B) {
	const n = 10000
	all := map[lb.ServicePortName]*lb.ServicePort{}
	for i := 0; i < n; i++ {
		name := lb.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: lb.TCP}
		all[name] = &lb.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80,
			Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrOf(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), 8080)), Ready: true, Serving: true}}}
	}
	snap := lb.NewSnapshot(all)
	snap.ID = 1
	for _, c := range []struct {
		name  string
		ports func() *listeners.PortAllocator
	}{
		{"sluice-picks", func() *listeners.PortAllocator {
			a, err := ephemeralProxyPorts(os.ReadFile)
			if err != nil {
				b.Fatal(err)
			}
			return a
		}},
		{"kernel-picks", func() *listeners.PortAllocator { return listeners.NewPortAllocator(0, 0) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				engine, err := listeners.NewEventLoop(listeners.Options{})
				if err != nil {
					b.Fatal(err)
				}
				metrics := admin.NewMetrics()
				log := slog.New(slog.DiscardHandler)
				health := admin.NewHealth(time.Minute, nil)
				srv := &listeners.Server{Engine: engine, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
					ProxyPorts: c.ports()}
				servedCounters(srv, metrics)
				a := &applier{plane: userspacePlane{Server: srv, capture: noCapture{}, metrics: metrics, health: health, log: log},
					local: &localAddrs{}, health: health, metrics: metrics, log: log, first: make(chan struct{})}
				b.StartTimer()
				a.Publish(snap)
				b.StopTimer()
				if got := len(srv.Frontends()); got != n {
					b.Fatalf("%d frontends, want %d", got, n)
				}
				srv.Close()
				b.StartTimer()
			}
		})
	}
}

// countingPortals is a portalFamily that only counts its syncs.
type countingPortals struct{ syncs int }

func (c *countingPortals) sync([]portals.Portal) error { c.syncs++; return nil }
func (c *countingPortals) present() bool               { return true }

// changingPortals is a portalFamily that applies changes alone, as the
// nftables one does, counting them.
type changingPortals struct {
	countingPortals
	changes int
}

func (c *changingPortals) change(del, add []portals.Portal) error { c.changes++; return nil }

// BenchmarkPublishEndpointChangeAt10kWithCapture is BenchmarkPublishOneChangeAt10k
// with each ClusterIP on a proxy port of its own and the nftables or
// iptables VIP capture in front (its kernel side counted, not run), as
// userspace mode runs on a node with nft by default: an endpoint change
// opens and closes no listener, so no portal changes either.
func BenchmarkPublishEndpointChangeAt10kWithCapture(b *testing.B) {
	const n = 10000
	port, all := benchPorts(n)
	srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
		ProxyPorts: listeners.NewPortAllocator(0, 0)}
	defer srv.Close()
	fam := &countingPortals{}
	a, snap := publishWithCapture(srv, fam, all)
	if got := srv.FrontendCount(); got != n {
		b.Fatalf("%d frontends, want %d", got, n)
	}
	first := fam.syncs
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sp := port(i%n, i%200+1)
		next := &lb.Snapshot{Ports: snap.Ports.With(map[lb.ServicePortName]*lb.ServicePort{sp.Name: sp}, nil), ID: snap.ID + 1, Base: snap.ID, Changed: []lb.ServicePortName{sp.Name}}
		a.Publish(next)
		snap = next
	}
	b.ReportMetric(float64(fam.syncs-first)/float64(b.N), "portal-syncs/op")
}

// publishWithCapture wires an applier as run does in userspace mode, with
// srv behind a VIP capture of one portal family, and publishes the first
// snapshot, of ports.
func publishWithCapture(srv *listeners.Server, fam portalFamily, ports map[lb.ServicePortName]*lb.ServicePort) (*applier, *lb.Snapshot) {
	metrics := admin.NewMetrics()
	log := slog.New(slog.DiscardHandler)
	health := admin.NewHealth(time.Minute, nil)
	local := &localAddrs{}
	local.refresh()
	a := &applier{plane: userspacePlane{Server: srv, capture: newPortalCapture([]portalFamily{fam}, local, log), metrics: metrics, health: health, log: log},
		local: local, health: health, metrics: metrics, log: log, first: make(chan struct{})}
	snap := lb.NewSnapshot(ports)
	snap.ID = 1
	a.Publish(snap)
	return a, snap
}

// benchPorts is n ClusterIP service ports of 10 endpoints each, and how to
// make port i with its endpoints in the ep-th /24.
func benchPorts(n int) (port func(i, ep int) *lb.ServicePort, all map[lb.ServicePortName]*lb.ServicePort) {
	port = func(i, ep int) *lb.ServicePort {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80}
		for j := 0; j < 10; j++ {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 244, byte(ep), byte(j)}), 8080), Ready: true, Serving: true})
		}
		return sp
	}
	all = map[lb.ServicePortName]*lb.ServicePort{}
	for i := 0; i < n; i++ {
		sp := port(i, 0)
		all[sp.Name] = sp
	}
	return port, all
}

// BenchmarkPublishServiceAddAt10kWithCapture is a Service added to (and
// the next op removed from) 10k ClusterIP service ports in userspace mode
// with the VIP capture in front (its kernel side counted, not run): a
// frontend comes or goes, so the capture's portals change. With one
// capture port (capture-port) or a proxy port each (proxy-ports).
func BenchmarkPublishServiceAddAt10kWithCapture(b *testing.B) {
	for _, mode := range []string{"proxy-ports", "capture-port"} {
		b.Run(mode, func(b *testing.B) {
			const n = 10000
			port, all := benchPorts(n)
			srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
				ProxyPorts: listeners.NewPortAllocator(0, 0), CaptureExternal: true}
			if mode == "capture-port" {
				if err := srv.OpenCapture(); err != nil {
					b.Fatal(err)
				}
			}
			defer srv.Close()
			// As the nftables family: it can apply a change alone.
			a, snap := publishWithCapture(srv, &changingPortals{}, all)
			added := port(n, 0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				next := snap.With(map[lb.ServicePortName]*lb.ServicePort{added.Name: added}, nil)
				if i%2 == 1 {
					next = snap.With(nil, []lb.ServicePortName{added.Name})
				}
				next.ID = snap.ID + 1
				a.Publish(next)
				snap = next
			}
			b.StopTimer()
			if got := srv.FrontendCount(); got != n+b.N%2 {
				b.Fatalf("%d frontends, want %d", got, n+b.N%2)
			}
		})
	}
}

// BenchmarkHeldBytesPerPortWithCapture is what the userspace plane holds
// per ClusterIP service port of 10 endpoints once a state of 10k is
// applied, past the snapshot itself: the engine's frontends and pickers,
// the per-port metrics and the capture's portals, wired as run wires them
// with one capture port (issue 16's memory budget). Counted, not timed:
// the live heap after a collection, before and after the first publish.
// go test -run '^$' -bench HeldBytesPerPort -benchtime 3x ./cmd/sluice
func BenchmarkHeldBytesPerPortWithCapture(b *testing.B) {
	const n = 10000
	_, all := benchPorts(n)
	var perPort float64
	for b.Loop() {
		metrics := admin.NewMetrics()
		srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
			Ejection: lb.DefaultEjectionPolicy(), ProxyPorts: listeners.NewPortAllocator(0, 0), CaptureExternal: true,
			Log: slog.New(slog.DiscardHandler)}
		servedCounters(srv, metrics)
		if err := srv.OpenCapture(); err != nil {
			b.Fatal(err)
		}
		perPort = heldPerPort(b, srv, all)
		srv.Close()
	}
	b.ReportMetric(perPort, "B/port")
}

// BenchmarkHeldBytesPerPortWithListeners is BenchmarkHeldBytesPerPortWithCapture
// as userspace mode runs by default: a proxy port and a listener of its own
// per service port, on the event loop, the VIP capture in front (its
// kernel side counted, not run). The sockets' kernel memory is not in it.
func BenchmarkHeldBytesPerPortWithListeners(b *testing.B) {
	const n = 10000
	_, all := benchPorts(n)
	var perPort float64
	for b.Loop() {
		engine, err := listeners.NewEventLoop(listeners.Options{})
		if err != nil {
			b.Fatal(err)
		}
		metrics := admin.NewMetrics()
		srv := &listeners.Server{Engine: engine, BindAddress: netip.MustParseAddr("127.0.0.1"), Retry: lb.DefaultRetryPolicy(),
			Ejection: lb.DefaultEjectionPolicy(), ProxyPorts: listeners.NewPortAllocator(0, 0),
			Log: slog.New(slog.DiscardHandler)}
		servedCounters(srv, metrics)
		perPort = heldPerPort(b, srv, all)
		srv.Close()
		engine.Shutdown(context.Background())
	}
	b.ReportMetric(perPort, "B/port")
}

// heldPerPort is what srv and the user-space side of its VIP capture hold
// per port once all is published, every port with a frontend.
func heldPerPort(b *testing.B, srv *listeners.Server, all map[lb.ServicePortName]*lb.ServicePort) float64 {
	before := liveHeap()
	a, snap := publishWithCapture(srv, &changingPortals{}, all)
	perPort := float64(liveHeap()-before) / float64(len(all))
	if got := srv.FrontendCount(); got != len(all) {
		b.Fatalf("%d frontends, want %d", got, len(all))
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(snap)
	return perPort
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
