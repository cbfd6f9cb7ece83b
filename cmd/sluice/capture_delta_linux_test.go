package main

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// capturePort is a random service port s<j> for the capture walks: a
// ClusterIP (now and then another port's, which collide), sometimes a
// non-local external IP, a load-balancer IP with source ranges (a portal
// with rules of its own), and endpoint policies that split the targets.
func capturePort(rng *rand.Rand, j int) *lb.ServicePort {
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", j), Port: "p", Protocol: lb.TCP},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)})}, Port: 80,
		Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort("127.0.0.1:9")), Ready: true, Serving: true, Local: rng.IntN(2) == 0}}}
	if rng.IntN(4) == 0 {
		sp.ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte((j+1)%8 + 1)})}
	}
	if rng.IntN(3) == 0 {
		sp.SetExternalIPs([]netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(j + 1)})})
		sp.ExternalLocal = rng.IntN(2) == 0
	}
	if rng.IntN(10) == 0 {
		sp.SetLoadBalancerIPs([]netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(j + 1)})})
		sp.SetSourceRanges([]netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")})
	}
	if rng.IntN(4) == 0 {
		sp.Port = 81
	}
	return sp
}

// The VIP capture told which ports changed works out only theirs and
// writes only their map elements (nftables), or gives the whole list to
// a family that cannot (iptables), and both end as a capture working out
// everything would leave them: through Services added, changed and
// removed, skipped snapshots, colliding ports and portals with rules of
// their own; with a proxy port per Service and with one capture port.
func TestCaptureChangesLeaveWhatWholeSyncsLeave(t *testing.T) {
	for _, mode := range []string{"proxy-ports", "capture-port"} {
		t.Run(mode, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(51, 52))
			local := &localAddrs{dump: func() ([]net.Addr, error) {
				return []net.Addr{&net.IPNet{IP: net.ParseIP("192.168.10.1"), Mask: net.CIDRMask(24, 32)}}, nil
			}}
			local.refresh()
			// 0.0.0.0, as run binds: portals redirect (map elements); to
			// another address they would be DNAT rules.
			srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.IPv4Unspecified(),
				ProxyPorts: listeners.NewPortAllocator(0, 0), Retry: lb.DefaultRetryPolicy(), CaptureExternal: true, IsLocal: local.has}
			defer srv.Close()
			if mode == "capture-port" {
				if err := srv.OpenCapture(); err != nil {
					t.Fatal(err)
				}
			}
			nft := knftables.NewFake(knftables.IPv4Family, portals.NFTablesTable)
			whole := &recordingPortals{}
			changer := &countingChanger{nftablesPortals: nftablesPortals{&portals.NFTables{NFT: nft}}}
			c := newPortalCapture([]portalFamily{changer, whole}, local, slog.New(slog.NewTextHandler(io.Discard, nil)))
			lister := &countingLister{Server: srv}
			ports := map[lb.ServicePortName]*lb.ServicePort{}
			for j := range 6 {
				sp := capturePort(rng, j)
				ports[sp.Name] = sp
			}
			cur := lb.NewSnapshot(ports)
			cur.ID = 1
			steps := 0
			for step := range 60 {
				if step > 0 {
					cur = randomChange(rng, cur, 3, 3, func() *lb.ServicePort { return capturePort(rng, rng.IntN(8)) })
					if rng.IntN(8) == 0 {
						continue // never applied
					}
				}
				steps++
				if err := srv.Apply(cur); err != nil {
					t.Fatal(err)
				}
				if err := c.after(cur, srv.FrontendsVersion(), lister); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				want := portalsFor(cur, srv.Frontends(), local.has)
				if got := portalStrings(whole.last); !slices.Equal(got, portalStrings(want)) {
					t.Fatalf("step %d: the whole-list family has\n%s\nwant\n%s", step, strings.Join(got, "\n"), strings.Join(portalStrings(want), "\n"))
				}
				fresh := knftables.NewFake(knftables.IPv4Family, portals.NFTablesTable)
				if err := (&portals.NFTables{NFT: fresh}).Sync(t.Context(), want); err != nil {
					t.Fatal(err)
				}
				if got, want := sortedLines(nft.Dump()), sortedLines(fresh.Dump()); got != want {
					t.Fatalf("step %d: the nftables table differs from a whole write:\n%s\nwant\n%s", step, got, want)
				}
			}
			if c.partials < steps/2 || lister.listed > steps/2 || changer.applied < steps/3 {
				t.Fatalf("%d of %d updates worked out from the change (%d written as element changes), every frontend listed %d times",
					c.partials, steps, changer.applied, lister.listed)
			}
		})
	}
}

// countingChanger counts the changes the nftables family applied alone.
type countingChanger struct {
	nftablesPortals
	applied int
}

func (c *countingChanger) change(del, add []portals.Portal) error {
	err := c.nftablesPortals.change(del, add)
	if err == nil {
		c.applied++
	}
	return err
}

func portalStrings(ps []portals.Portal) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = fmt.Sprintf("%s %s %s:%d -> %s %v", p.Service, p.Protocol, p.IP, p.Port, p.To, p.SourceRanges)
	}
	return out
}

// sortedLines is a dump with its element lines sorted, after the rest
// (element order is the order of writes; rule order matters).
func sortedLines(s string) string {
	var elements, other []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "add element ") {
			elements = append(elements, l)
		} else {
			other = append(other, l)
		}
	}
	slices.Sort(elements)
	return strings.Join(append(other, elements...), "\n")
}

// A TCP and a UDP port on one address and port (DNS) are two portals
// that do not collide: a change beside them, or of one of them, is worked
// out from the change alone, and leaves the other captured.
func TestCaptureTellsProtocolsApartAtOneDestination(t *testing.T) {
	srv := &listeners.Server{Engine: listeners.NewGoroutine(listeners.Options{}), BindAddress: netip.IPv4Unspecified(),
		ProxyPorts: listeners.NewPortAllocator(0, 0), Retry: lb.DefaultRetryPolicy()}
	defer srv.Close()
	nft := knftables.NewFake(knftables.IPv4Family, portals.NFTablesTable)
	c := newPortalCapture([]portalFamily{nftablesPortals{&portals.NFTables{NFT: nft}}}, &localAddrs{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	port := func(name string, proto lb.Protocol, ip string, p uint16) *lb.ServicePort {
		return &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: name, Port: string(proto), Protocol: proto},
			ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Port: p,
			Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort("127.0.0.1:9")), Ready: true, Serving: true}}}
	}
	dnsTCP, dnsUDP, web := port("dns", lb.TCP, "10.96.0.10", 53), port("dns", lb.UDP, "10.96.0.10", 53), port("web", lb.TCP, "10.96.0.11", 80)
	cur := lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{dnsTCP.Name: dnsTCP, dnsUDP.Name: dnsUDP})
	cur.ID = 1
	tcp, udp := "tcp-portals { 10.96.0.10 . 53 :", "udp-portals { 10.96.0.10 . 53 :"
	for step, ch := range []struct {
		set        *lb.ServicePort
		del        []lb.ServicePortName
		want, gone []string
	}{
		{want: []string{tcp, udp}},
		{set: web, want: []string{tcp, udp}},
		{del: []lb.ServicePortName{dnsUDP.Name}, want: []string{tcp}, gone: []string{udp}},
		{set: dnsUDP, want: []string{tcp, udp}},
	} {
		if step > 0 {
			set := map[lb.ServicePortName]*lb.ServicePort{}
			if ch.set != nil {
				set[ch.set.Name] = ch.set
			}
			id := cur.ID
			cur = cur.With(set, ch.del)
			cur.ID = id + 1
		}
		if err := srv.Apply(cur); err != nil {
			t.Fatal(err)
		}
		if err := c.after(cur, srv.FrontendsVersion(), srv); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if c.partials != step {
			t.Fatalf("step %d: %d updates worked out from the change alone, want %d (the TCP and UDP portals of 10.96.0.10:53 taken for a collision?)", step, c.partials, step)
		}
		dump := nft.Dump()
		for _, want := range ch.want {
			if !strings.Contains(dump, want) {
				t.Fatalf("step %d: no %q in\n%s", step, want, dump)
			}
		}
		for _, gone := range ch.gone {
			if strings.Contains(dump, gone) {
				t.Fatalf("step %d: %q left in\n%s", step, gone, dump)
			}
		}
	}
}
