package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// recordingPortals is a portalFamily that keeps what it was given.
type recordingPortals struct {
	syncs int
	last  []portals.Portal
	fail  bool
}

func (r *recordingPortals) sync(ps []portals.Portal) error {
	r.syncs++
	if r.fail {
		return errors.New("refused")
	}
	r.last = ps
	return nil
}

func (r *recordingPortals) present() bool { return true }

// countingLister counts the listings of every frontend.
type countingLister struct {
	*listeners.Server
	listed int
}

func (c *countingLister) Frontends() []listeners.Frontend { c.listed++; return c.Server.Frontends() }

// The portals are worked out again only when the listeners' frontends or
// the node's addresses changed: an update of endpoints alone lists no
// frontend and syncs nothing; a frontend change, an address becoming
// local and a failed sync all lead to a sync of what is wanted.
func TestCaptureWorksOutPortalsOnlyWhenFrontendsOrAddressesChange(t *testing.T) {
	addrs := []net.Addr{&net.IPNet{IP: net.ParseIP("192.168.10.1"), Mask: net.CIDRMask(24, 32)}}
	local := &localAddrs{dump: func() ([]net.Addr, error) { return addrs, nil }}
	local.refresh()
	fam := &recordingPortals{}
	c := newPortalCapture([]portalFamily{fam}, local, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"),
		ProxyPorts: listeners.NewPortAllocator(0, 0), Retry: lb.DefaultRetryPolicy()}
	defer srv.Close()
	fes := &countingLister{Server: srv}
	port := func(ep string, externalIP string) *lb.ServicePort {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: "web", Port: "http", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Port: 80,
			Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort(ep)), Ready: true, Serving: true}}}
		if externalIP != "" {
			sp.SetExternalIPs([]netip.Addr{netip.MustParseAddr(externalIP)})
		}
		return sp
	}
	apply := func(sp *lb.ServicePort) error {
		ports := map[lb.ServicePortName]*lb.ServicePort{}
		if sp != nil {
			ports[sp.Name] = sp
		}
		snap := lb.NewSnapshot(ports)
		if err := srv.Apply(snap); err != nil {
			t.Fatal(err)
		}
		return c.after(snap, srv.FrontendsVersion(), fes)
	}
	captured := func() map[string]bool {
		out := map[string]bool{}
		for _, p := range fam.last {
			out[netip.AddrPortFrom(p.IP, p.Port).String()] = true
		}
		return out
	}
	step := func(what string, sp *lb.ServicePort, wantListed, wantSyncs int, want ...string) {
		t.Helper()
		if err := apply(sp); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := captured()
		if listed := fes.listed; listed != wantListed || fam.syncs != wantSyncs || len(got) != len(want) {
			t.Fatalf("%s: frontends listed %d times, %d syncs, captured %v; want %d, %d, %v", what, listed, fam.syncs, got, wantListed, wantSyncs, want)
		}
		for _, w := range want {
			if !got[w] {
				t.Fatalf("%s: %s not captured: %v", what, w, got)
			}
		}
	}
	step("first", port("127.0.0.1:8080", "203.0.113.10"), 1, 1, "10.96.0.10:80", "203.0.113.10:80")
	step("endpoints only", port("127.0.0.1:8081", "203.0.113.10"), 1, 1, "10.96.0.10:80", "203.0.113.10:80")
	step("endpoints only, again", port("127.0.0.1:8082", "203.0.113.10"), 1, 1, "10.96.0.10:80", "203.0.113.10:80")
	step("an external IP gone", port("127.0.0.1:8082", ""), 2, 2, "10.96.0.10:80")
	step("an external IP back", port("127.0.0.1:8082", "203.0.113.10"), 3, 3, "10.96.0.10:80", "203.0.113.10:80")
	// The external IP becomes an address of the node: it is listened on
	// directly and captured no more.
	addrs = append(addrs, &net.IPNet{IP: net.ParseIP("203.0.113.10"), Mask: net.CIDRMask(32, 32)})
	local.refresh()
	step("the external IP local", port("127.0.0.1:8083", "203.0.113.10"), 4, 4, "10.96.0.10:80")
	fam.fail = true
	if err := apply(port("127.0.0.1:8083", "")); err == nil {
		t.Fatal("a failed sync was not reported")
	}
	fam.fail = false
	step("after a failed sync, endpoints only", port("127.0.0.1:8084", ""), 6, 6, "10.96.0.10:80")
	step("the Service gone", nil, 7, 7)

	// The plane's Tick syncs again only after a failed sync.
	if err := c.resync(); err != nil || fam.syncs != 7 {
		t.Fatalf("Tick after a good sync: %v, %d syncs, want none more", err, fam.syncs)
	}
	fam.fail = true
	if err := apply(port("127.0.0.1:8085", "")); err == nil {
		t.Fatal("a failed sync was not reported")
	}
	fam.fail = false
	if err := c.resync(); err != nil || fam.syncs != 9 || len(captured()) != 1 {
		t.Fatalf("Tick after a failed sync: %v, %d syncs, captured %v; want one more sync of the port", err, fam.syncs, captured())
	}
	if err := c.resync(); err != nil || fam.syncs != 9 {
		t.Fatalf("Tick after the retry: %v, %d syncs, want none more", err, fam.syncs)
	}
}

// The capture keeps each port's targets as numbered IPs and ports: they
// come back as they went in, an IP is numbered once, and no address stays
// no address.
func TestPortalTargetsAreHeldByNumberedIP(t *testing.T) {
	var a targetAddrs
	cases := []portalTargets{
		{netip.MustParseAddrPort("0.0.0.0:15001"), netip.MustParseAddrPort("0.0.0.0:15001")},
		{netip.MustParseAddrPort("0.0.0.0:40000"), netip.MustParseAddrPort("10.0.0.1:40001")},
		{netip.MustParseAddrPort("[::]:40002"), netip.MustParseAddrPort("[::]:40002")},
		{netip.MustParseAddrPort("0.0.0.0:40003"), netip.AddrPort{}},
		{},
	}
	held := make([]heldTargets, len(cases))
	for i, c := range cases {
		held[i] = a.hold(c)
	}
	for i, c := range cases {
		if got := a.get(held[i]); got != c {
			t.Errorf("held %+v, got back %+v", c, got)
		}
	}
	if len(a.ips) != 3 {
		t.Errorf("%d IPs numbered (%v), want 3", len(a.ips), a.ips)
	}
	if held[4] != (heldTargets{}) {
		t.Errorf("no targets held as %+v", held[4])
	}
}

// failingAddrs is an address table whose additions fail while fail is set.
type failingAddrs struct {
	*portals.FakeAddrTable
	fail bool
}

func (f *failingAddrs) Add(link int, a netip.Addr) error {
	if f.fail {
		return errors.New("RTM_NEWADDR: operation not permitted")
	}
	return f.FakeAddrTable.Add(link, a)
}

// In userspace mode a VIP capture that fails leaves the change pending,
// as a kernel mode's failed sync does (the ClusterIPs are not served as
// the state says): /healthz turns 503 once the change has waited the
// timeout, and 200 again when the capture's own retry (the plane's Tick)
// captures it; a failed retry keeps it 503. Through the iptables and
// nftables portals and through bind. A listener that could not be opened
// is not such a failure: it makes /healthz 503 at once instead, and
// clears it when it opens.
func TestAFailedVIPCaptureLeavesHealthPendingUntilItsRetry(t *testing.T) {
	fam := &recordingPortals{}
	addrs := &failingAddrs{FakeAddrTable: portals.NewFakeAddrTable()}
	binder := &portals.Binder{Table: addrs}
	if _, err := binder.Init(); err != nil {
		t.Fatal(err)
	}
	local := &localAddrs{}
	local.refresh()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name    string
		capture vipCapture
		fail    func(bool)
	}{
		{"portals", newPortalCapture([]portalFamily{fam}, local, log), func(on bool) { fam.fail = on }},
		{"bind", &bindCapture{binder: binder}, func(on bool) { addrs.fail = on }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1e9, 0)
			health := admin.NewHealth(time.Minute, func() time.Time { return now })
			srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.MustParseAddr("127.0.0.1"),
				ProxyPorts: listeners.NewPortAllocator(0, 0), Retry: lb.DefaultRetryPolicy()}
			defer srv.Close()
			plane := userspacePlane{Server: srv, capture: tc.capture, metrics: admin.NewMetrics(), health: health, log: log}
			a := &applier{plane: plane, local: local, health: health, metrics: admin.NewMetrics(), log: log, first: make(chan struct{})}
			a.followResyncs()
			healthy := func() bool { ok, _, _ := health.Healthy(); return ok }
			// Each state a new ClusterIP: the capture has something to do.
			state := 0
			publish := func() {
				state++
				sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("web%d", state), Port: "http", Protocol: lb.TCP},
					ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(state)})}, Port: 80,
					Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort("127.0.0.1:1")), Ready: true, Serving: true}}}
				a.Queued()
				a.Publish(lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{sp.Name: sp}))
			}
			publish()
			if !healthy() {
				t.Fatal("unhealthy after a captured first state")
			}
			tc.fail(true)
			publish()
			now = now.Add(59 * time.Second)
			if !healthy() {
				t.Fatal("unhealthy before the failed capture has waited the timeout")
			}
			now = now.Add(time.Second)
			if healthy() {
				t.Fatal("healthy with a state the capture failed to capture a minute ago")
			}
			plane.Tick() // the retry fails too
			if healthy() {
				t.Fatal("healthy after a failed retry")
			}
			tc.fail(false)
			plane.Tick()
			if !healthy() {
				t.Fatal("still unhealthy after the retry captured the state")
			}
			if plane.pendingAfter(errors.New("listen tcp 127.0.0.1:80: address already in use")) {
				t.Fatal("a listener's failure alone left health pending")
			}
		})
	}
}
