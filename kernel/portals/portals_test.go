package portals

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/lb"
)

var (
	vip  = netip.MustParseAddr("10.96.0.10")
	vip6 = netip.MustParseAddr("fd00:96::10")
	eip  = netip.MustParseAddr("203.0.113.7")
)

func portalSet() []Portal {
	return []Portal{
		{Service: "demo/web:http", Protocol: lb.TCP, IP: vip, Port: 80, To: netip.MustParseAddrPort("0.0.0.0:30001")},
		{Service: "demo/web:http", Protocol: lb.TCP, IP: eip, Port: 80, To: netip.MustParseAddrPort("0.0.0.0:30002")},
		{Service: "demo/dns:dns", Protocol: lb.UDP, IP: vip, Port: 53, To: netip.MustParseAddrPort("10.0.0.1:30003")},
		{Service: "demo/web:http", Protocol: lb.TCP, IP: vip6, Port: 80, To: netip.MustParseAddrPort("[::]:30004")},
	}
}

func pkt(proto string, dst netip.Addr, port uint16) iptables.Packet {
	return iptables.Packet{Src: netip.MustParseAddr("10.0.0.99"), Dst: dst, Proto: proto, DPort: port}
}

// Packets to each portal end at its proxy port from both hooks; other
// ports, protocols and addresses pass untouched.
func TestPortalRulesCapturePackets(t *testing.T) {
	f := iptables.NewFake()
	c := &IPTables{Runner: f}
	if err := c.Sync(portalSet()); err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		for _, tc := range []struct {
			p    iptables.Packet
			want iptables.Outcome
		}{
			{pkt("tcp", vip, 80), iptables.Outcome{Redirect: 30001}},
			{pkt("tcp", eip, 80), iptables.Outcome{Redirect: 30002}},
			{pkt("udp", vip, 53), iptables.Outcome{DNAT: netip.MustParseAddrPort("10.0.0.1:30003")}},
			{pkt("udp", vip, 80), iptables.Outcome{}},
			{pkt("tcp", vip, 53), iptables.Outcome{}},
			{pkt("tcp", netip.MustParseAddr("10.96.0.11"), 80), iptables.Outcome{}},
		} {
			got := f.Trace(hook, tc.p)
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("%s %s %s:%d: %+v, want %+v", hook, tc.p.Proto, tc.p.Dst, tc.p.DPort, got, tc.want)
			}
		}
	}
	if strings.Contains(f.Dump(), "fd00:96::10") {
		t.Fatal("an IPv6 portal landed in the IPv4 table")
	}
	f6 := iptables.NewFake()
	if err := (&IPTables{Runner: f6, IPv6: true}).Sync(portalSet()); err != nil {
		t.Fatal(err)
	}
	if got := f6.Trace("PREROUTING", iptables.Packet{Src: netip.MustParseAddr("fd00::1"), Dst: vip6, Proto: "tcp", DPort: 80}); len(got) != 1 || got[0].Redirect != 30004 {
		t.Fatalf("IPv6 portal: %+v", got)
	}
}

// Syncing states in any order converges on the last one: a removed portal
// stops capturing and the jump rules are not duplicated.
func TestPortalSyncConverges(t *testing.T) {
	all := portalSet()
	states := [][]Portal{all, all[:1], nil, all[1:3], all}
	for round := 0; round < 5; round++ {
		f := iptables.NewFake()
		c := &IPTables{Runner: f}
		order := slices.Clone(states)
		for i := range order { // a fixed rotation per round: every state comes last once
			order[i] = states[(i+round)%len(states)]
		}
		for _, s := range order {
			if err := c.Sync(s); err != nil {
				t.Fatal(err)
			}
		}
		fresh := iptables.NewFake()
		if err := (&IPTables{Runner: fresh}).Sync(order[len(order)-1]); err != nil {
			t.Fatal(err)
		}
		if f.Dump() != fresh.Dump() {
			t.Fatalf("round %d did not converge:\n%s\nwant\n%s", round, f.Dump(), fresh.Dump())
		}
	}
}

// Cleanup removes the portal chains and jumps and nothing else, twice.
func TestPortalCleanupLeavesOthersRules(t *testing.T) {
	f := iptables.NewFake()
	if err := f.Restore([]byte("*nat\n:OTHER - [0:0]\n-A PREROUTING -j OTHER\n-A OTHER -p tcp -m tcp --dport 22 -j REDIRECT --to-ports 2222\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	if err := (&IPTables{Runner: f}).Sync(portalSet()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := CleanupIPTables(f); err != nil {
			t.Fatal(err)
		}
		if got := f.Dump(); got != before {
			t.Fatalf("after cleanup %d:\n%s\nwant\n%s", i+1, got, before)
		}
	}
}

// The fake refuses a REDIRECT to a port without a protocol, as the kernel
// does; a bad restore changes nothing.
func TestFakeRefusesRedirectWithoutProtocol(t *testing.T) {
	f := iptables.NewFake()
	before := f.Dump()
	err := f.Restore([]byte("*nat\n:" + ChainHost + " - [0:0]\n-A " + ChainHost + " -d 10.96.0.10/32 -j REDIRECT --to-ports 1\nCOMMIT\n"))
	if err == nil || f.Dump() != before {
		t.Fatalf("accepted: %v\n%s", err, f.Dump())
	}
	if err := f.Restore([]byte("*filter\n:X - [0:0]\n-A X -p tcp -j REDIRECT --to-ports 1\nCOMMIT\n")); err == nil {
		t.Fatal("accepted REDIRECT in the filter table")
	}
}

func TestBinderUsesDummyAndPrunesOnlyItsOwn(t *testing.T) {
	tbl := NewFakeAddrTable()
	b := &Binder{Table: tbl}
	why, err := b.Init()
	if err != nil || why != "dummy interface sluice0" {
		t.Fatalf("Init: %q %v", why, err)
	}
	if err := b.Ensure([]netip.Addr{vip, vip6, eip}); err != nil {
		t.Fatal(err)
	}
	if got := tbl.All("sluice0"); !slices.Equal(got, []netip.Addr{vip, eip, vip6}) {
		t.Fatalf("sluice0 holds %v", got)
	}
	if err := b.Ensure([]netip.Addr{vip}); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := b.Prune([]netip.Addr{vip}); err != nil {
		t.Fatal(err)
	}
	if got := tbl.All("sluice0"); !slices.Equal(got, []netip.Addr{vip}) {
		t.Fatalf("after prune sluice0 holds %v", got)
	}
	for i := 0; i < 2; i++ {
		if err := CleanupAddrs(tbl, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tbl.LinkIndex("sluice0"); err == nil {
		t.Fatal("cleanup left sluice0")
	}
}

func TestBinderFallsBackToLoAndLeavesForeignAddresses(t *testing.T) {
	tbl := NewFakeAddrTable()
	tbl.NoDummy = true
	b := &Binder{Table: tbl}
	why, err := b.Init()
	if err != nil || !strings.HasPrefix(why, "lo (") || !strings.Contains(why, "dummy") {
		t.Fatalf("Init: %q %v", why, err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	if err := b.Ensure([]netip.Addr{vip, lo}); err != nil { // 127.0.0.1 is lo's own
		t.Fatal(err)
	}
	if err := b.Prune(nil); err != nil {
		t.Fatal(err)
	}
	if got := tbl.All("lo"); !slices.Equal(got, []netip.Addr{lo, netip.MustParseAddr("::1")}) {
		t.Fatalf("lo holds %v, want only its own addresses", got)
	}
	if err := b.Ensure([]netip.Addr{vip6}); err != nil {
		t.Fatal(err)
	}
	if err := CleanupAddrs(tbl, ""); err != nil {
		t.Fatal(err)
	}
	if got := tbl.All("lo"); len(got) != 2 {
		t.Fatalf("cleanup left lo with %v", got)
	}
	if err := (&Binder{Table: tbl}).Ensure([]netip.Addr{vip}); err == nil {
		t.Fatal("Ensure before Init succeeded")
	}
}

// A load-balancer portal with source ranges captures only those sources.
func TestPortalSourceRanges(t *testing.T) {
	f := iptables.NewFake()
	lbIP := netip.MustParseAddr("198.51.100.1")
	p := Portal{Service: "demo/web:http", Protocol: lb.TCP, IP: lbIP, Port: 80, To: netip.MustParseAddrPort("0.0.0.0:30001"),
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	if err := (&IPTables{Runner: f}).Sync([]Portal{p}); err != nil {
		t.Fatal(err)
	}
	in := pkt("tcp", lbIP, 80)
	in.Src = netip.MustParseAddr("10.1.2.3")
	if got := f.Trace("PREROUTING", in); len(got) != 1 || got[0].Redirect != 30001 {
		t.Fatalf("allowed source: %+v", got)
	}
	out := in
	out.Src = netip.MustParseAddr("192.0.2.9")
	if got := f.Trace("PREROUTING", out); len(got) != 1 || got[0] != (iptables.Outcome{}) {
		t.Fatalf("source outside the ranges was captured: %+v", got)
	}
}

// Change adds and removes without listing, never removes an address it
// did not assign (lo's own, or one already there when it was asked to
// add it), and knows what an earlier run left from Init.
func TestBinderChangeTouchesOnlyItsOwn(t *testing.T) {
	tbl := NewFakeAddrTable()
	lo := netip.MustParseAddr("127.0.0.1")
	tbl.NoDummy = true
	b := &Binder{Table: tbl}
	if _, err := b.Init(); err != nil {
		t.Fatal(err)
	}
	if err := b.Change([]netip.Addr{vip, lo}, nil); err != nil {
		t.Fatal(err)
	}
	if !b.Has(vip) || b.Has(lo) {
		t.Fatalf("Has: vip %v, lo %v; want true, false", b.Has(vip), b.Has(lo))
	}
	if err := b.Change([]netip.Addr{eip}, []netip.Addr{vip, lo, vip6}); err != nil {
		t.Fatal(err)
	}
	if got := tbl.All("lo"); !slices.Equal(got, []netip.Addr{lo, eip, netip.MustParseAddr("::1")}) {
		t.Fatalf("lo holds %v", got)
	}
	// A new Binder on the same table (a restart) knows eip is its own.
	again := &Binder{Table: tbl}
	if _, err := again.Init(); err != nil {
		t.Fatal(err)
	}
	if err := again.Change(nil, []netip.Addr{eip}); err != nil {
		t.Fatal(err)
	}
	if got := tbl.All("lo"); len(got) != 2 {
		t.Fatalf("after a restart's Change lo holds %v", got)
	}
	// An address in both lists stays.
	if err := again.Change([]netip.Addr{vip}, []netip.Addr{vip}); err != nil || !slices.Contains(tbl.All("lo"), vip) {
		t.Fatalf("add and delete of one address: %v, lo holds %v", err, tbl.All("lo"))
	}
}

// With Adopt (IPVS mode's kube-ipvs0), what another proxy left on the
// interface is sluice's: counted as bound, kept when wanted and removed
// when not, as kube-proxy treats every address there; an IPv6
// link-local address is no service address and stays. Without it, an
// unmarked address is left alone.
func TestBinderAdoptsWhatIsOnItsInterface(t *testing.T) {
	stale, kept := netip.MustParseAddr("10.96.0.77"), netip.MustParseAddr("203.0.113.20")
	linkLocal := netip.MustParseAddr("fe80::1")
	for _, adopt := range []bool{false, true} {
		tbl := NewFakeAddrTable()
		idx, err := tbl.EnsureDummy("kube-ipvs0")
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range []netip.Addr{stale, kept, linkLocal} {
			if err := tbl.AddUnmarked(idx, a); err != nil {
				t.Fatal(err)
			}
		}
		b := &Binder{Table: tbl, Interface: "kube-ipvs0", DummyOnly: true, Adopt: adopt}
		if _, err := b.Init(); err != nil {
			t.Fatal(err)
		}
		if b.Has(kept) != adopt || b.Has(linkLocal) {
			t.Fatalf("adopt %v: Has(%s) %v, Has(%s) %v", adopt, kept, b.Has(kept), linkLocal, b.Has(linkLocal))
		}
		if err := b.Ensure([]netip.Addr{kept}); err != nil {
			t.Fatal(err)
		}
		if err := b.Prune([]netip.Addr{kept}); err != nil {
			t.Fatal(err)
		}
		want := []netip.Addr{stale, kept, linkLocal}
		if adopt {
			want = []netip.Addr{kept, linkLocal}
		}
		if got := tbl.All("kube-ipvs0"); !slices.Equal(got, want) {
			t.Errorf("adopt %v: left %v, want %v", adopt, got, want)
		}
		if owned, _ := b.Owned(); adopt != slices.Contains(owned, kept) {
			t.Errorf("adopt %v: Owned %v", adopt, owned)
		}
	}
}
