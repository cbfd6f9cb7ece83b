package portals

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/kernel/netnstest"
	"github.com/sluice-proxy/sluice/lb"
)

// netnsRoutedVIPs makes the private namespace's lo up and routes the
// service range through a veth pair of its own (both ends inside it, with
// 192.168.10.2 on one), so that a connection to a VIP leaves the socket
// and meets the nat hooks; nothing leaves the namespace.
func netnsRoutedVIPs() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	va := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "va"}, PeerName: "vb"}
	if err := netlink.LinkAdd(va); err != nil {
		return err
	}
	for _, name := range []string{"va", "vb"} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if name == "va" {
			a, _ := netlink.ParseAddr("192.168.10.2/24")
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			_, dst, _ := net.ParseCIDR("10.96.0.0/16")
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst}); err != nil {
				return err
			}
		}
	}
	return nil
}

// answer listens on 127.0.0.1:port (TCP and UDP) and answers each
// connection or datagram with the port; stop closes both.
func answer(port uint16) (stop func(), err error) {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		ln.Close()
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, port)
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(fmt.Sprint(port)), from)
		}
	}()
	return func() { ln.Close(); pc.Close() }, nil
}

// reach says which listener answers proto at to, or "error": a TCP
// connection to a VIP no portal redirects is dropped inside the namespace,
// so it ends at the dial timeout; an answer, once connected, gets longer.
func reach(proto, to string) string {
	c, err := net.DialTimeout(proto, to, time.Second)
	if err != nil {
		return "error"
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if proto == "udp" {
		c.Write([]byte("x"))
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil {
		return "error"
	}
	return string(buf[:n])
}

// The nftables portals for real, in a private namespace: TCP and UDP
// VIPs redirected through the maps to listeners on loopback, a change of
// one portal's proxy port and a removal written as element operations
// alone and followed at once by traffic, a VIP no portal names left
// alone, and portals with source ranges (rules of their own) capturing
// only clients inside them.
func TestNFTablesPortalsOnRealNFT(t *testing.T) {
	netnstest.Need(t, "nft")
	netnstest.Run(t, func() error {
		if err := netnsRoutedVIPs(); err != nil {
			return err
		}
		for _, p := range []uint16{20001, 20002, 20003, 20004} {
			stop, err := answer(p)
			if err != nil {
				return err
			}
			defer stop()
		}
		nft, err := knftables.New(knftables.IPv4Family, NFTablesTable)
		if err != nil {
			return err
		}
		redirect := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.IPv4Unspecified(), port) }
		var ps []Portal
		for i := range 300 { // filler: the map holds many
			ps = append(ps, Portal{Service: fmt.Sprintf("ns/f%d:p", i), Protocol: lb.TCP, IP: netip.AddrFrom4([4]byte{10, 96, 1 + byte(i>>8), byte(i)}), Port: 80, To: redirect(30000)})
		}
		ps = append(ps,
			Portal{Service: "ns/a:p", Protocol: lb.TCP, IP: netip.MustParseAddr("10.96.0.1"), Port: 80, To: redirect(20001)},
			Portal{Service: "ns/b:p", Protocol: lb.TCP, IP: netip.MustParseAddr("10.96.0.2"), Port: 80, To: redirect(20002)},
			Portal{Service: "ns/dns:p", Protocol: lb.UDP, IP: netip.MustParseAddr("10.96.0.3"), Port: 53, To: redirect(20003)},
			Portal{Service: "ns/in:p", Protocol: lb.TCP, IP: netip.MustParseAddr("10.96.0.4"), Port: 80, To: redirect(20004),
				SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24")}},
			Portal{Service: "ns/out:p", Protocol: lb.TCP, IP: netip.MustParseAddr("10.96.0.5"), Port: 80, To: redirect(20004),
				SourceRanges: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}},
		)
		c := &NFTables{NFT: nft}
		ctx := context.Background()
		if err := c.Sync(ctx, ps); err != nil {
			return err
		}
		check := func(when string, want map[string]string) error {
			for to, w := range want {
				proto := "tcp"
				if strings.HasSuffix(to, ":53") {
					proto = "udp"
				}
				if got := reach(proto, to); got != w {
					return fmt.Errorf("%s: %s %s answered %q, want %q", when, proto, to, got, w)
				}
			}
			return nil
		}
		if err := check("first sync", map[string]string{"10.96.0.1:80": "20001", "10.96.0.2:80": "20002", "10.96.0.3:53": "20003",
			"10.96.0.4:80": "20004", "10.96.0.5:80": "error", "10.96.0.9:80": "error"}); err != nil {
			return err
		}
		ps[300].To = redirect(20002) // a moved to b's listener
		ps = append(ps[:301], ps[302:]...)
		if err := c.Sync(ctx, ps); err != nil {
			return err
		}
		if c.whole != 1 || c.writes != 2 {
			return fmt.Errorf("%d transactions, %d of them whole; want 2 and 1", c.writes, c.whole)
		}
		if err := check("after a change and a removal", map[string]string{"10.96.0.1:80": "20002", "10.96.0.2:80": "error", "10.96.0.3:53": "20003"}); err != nil {
			return err
		}
		out, err := exec.Command("nft", "list", "map", "ip", NFTablesTable, "tcp-portals").CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft list map: %v: %s", err, out)
		}
		if s := string(out); !strings.Contains(s, "10.96.0.1 . 80 : 20002") || strings.Contains(s, "10.96.0.2 . 80") || strings.Contains(s, "10.96.0.4 . 80") {
			return fmt.Errorf("tcp-portals after the change:\n%s", s)
		}
		return CleanupNFTables(ctx, nft)
	})
}

// portalBench runs fn in a private namespace whose sluice-portals table
// holds 10,000 TCP portals. Everything, b.Loop included, runs in fn, on
// the namespace's thread: a sub-benchmark (b.Run) would run on another
// goroutine, in the machine's own namespace.
func portalBench(b *testing.B, fn func(c *NFTables, ps []Portal) error) {
	netnstest.Need(b, "nft")
	netnstest.Run(b, func() error {
		if err := netnsRoutedVIPs(); err != nil {
			return err
		}
		nft, err := knftables.New(knftables.IPv4Family, NFTablesTable)
		if err != nil {
			return err
		}
		var ps []Portal
		for i := range 10000 {
			ps = append(ps, Portal{Service: fmt.Sprintf("ns/s%d:p", i), Protocol: lb.TCP, IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80,
				To: netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(20000+i%30000))})
		}
		c := &NFTables{NFT: nft}
		if err := c.Sync(context.Background(), ps); err != nil {
			return err
		}
		if err := fn(c, ps); err != nil {
			return err
		}
		return CleanupNFTables(context.Background(), nft)
	})
}

// A Sync of 10,000 portals that writes the table whole: what every
// update did before the maps.
func BenchmarkNFTablesPortalSyncWhole(b *testing.B) {
	portalBench(b, func(c *NFTables, ps []Portal) error {
		for b.Loop() {
			c.Invalidate()
			if err := c.Sync(context.Background(), ps); err != nil {
				return err
			}
		}
		return nil
	})
}

// A Sync of 10,000 portals after one portal's proxy port changed.
func BenchmarkNFTablesPortalSyncOneChanged(b *testing.B) {
	portalBench(b, func(c *NFTables, ps []Portal) error {
		i := 0
		for b.Loop() {
			i++
			ps[len(ps)/2].To = netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(50000+i%2))
			if err := c.Sync(context.Background(), ps); err != nil {
				return err
			}
		}
		if c.whole != 1 {
			return fmt.Errorf("%d whole writes", c.whole)
		}
		return nil
	})
}

// A new TCP connection to the VIP of the last of 10,000 portals,
// redirected to a listener on loopback.
func BenchmarkNFTablesPortalConnectToLast(b *testing.B) {
	portalBench(b, func(c *NFTables, ps []Portal) error {
		last := ps[len(ps)-1]
		stop, err := answer(last.To.Port())
		if err != nil {
			return err
		}
		defer stop()
		to := netip.AddrPortFrom(last.IP, last.Port).String()
		for b.Loop() {
			if got := reach("tcp", to); got != fmt.Sprint(last.To.Port()) {
				return fmt.Errorf("%s answered %q", to, got)
			}
		}
		return nil
	})
}
