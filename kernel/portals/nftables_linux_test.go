package portals

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// The nftables method: one rule per portal in each chain, REDIRECT to the
// proxy port for an unspecified listener, DNAT to an address otherwise,
// source ranges as a set, the other family left out; a second sync with
// fewer portals leaves exactly those (the table is flushed in the same
// transaction); cleanup deletes the table and a second cleanup is no error.
func TestNFTablesPortals(t *testing.T) {
	ps := []Portal{
		{Service: "e2e/web:http", Protocol: lb.TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, To: netip.MustParseAddrPort("0.0.0.0:40001")},
		{Service: "e2e/web:dns", Protocol: lb.UDP, IP: netip.MustParseAddr("10.96.0.10"), Port: 53, To: netip.MustParseAddrPort("192.168.10.1:40002")},
		{Service: "e2e/lb:http", Protocol: lb.TCP, IP: netip.MustParseAddr("203.0.113.20"), Port: 80, To: netip.MustParseAddrPort("0.0.0.0:40003"),
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/24"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}},
		{Service: "e2e/v6:http", Protocol: lb.TCP, IP: netip.MustParseAddr("fd00:96::10"), Port: 80, To: netip.MustParseAddrPort("[::]:40004")},
	}
	fake := knftables.NewFake(knftables.IPv4Family, NFTablesTable)
	c := &NFTables{NFT: fake}
	if err := c.Sync(context.Background(), ps); err != nil {
		t.Fatal(err)
	}
	dump := fake.Dump()
	for _, chain := range []string{"prerouting", "output"} {
		for _, want := range []string{
			"add chain ip sluice-portals " + chain + " { type nat hook " + chain + " priority -100 ; }",
			"add rule ip sluice-portals " + chain + " ip daddr 10.96.0.10 tcp dport 80 redirect to :40001 comment \"e2e/web:http\"",
			"add rule ip sluice-portals " + chain + " ip daddr 10.96.0.10 udp dport 53 dnat to 192.168.10.1:40002 comment \"e2e/web:dns\"",
			"add rule ip sluice-portals " + chain + " ip saddr { 192.168.10.0/24, 10.0.0.0/8 } ip daddr 203.0.113.20 tcp dport 80 redirect to :40003 comment \"e2e/lb:http\"",
		} {
			if !strings.Contains(dump, want+"\n") {
				t.Errorf("no %q in\n%s", want, dump)
			}
		}
	}
	if strings.Contains(dump, "fd00") {
		t.Errorf("IPv6 in the ip table:\n%s", dump)
	}
	if ok, err := c.Present(context.Background()); !ok || err != nil {
		t.Fatalf("Present after a sync: %v, %v", ok, err)
	}
	if err := c.Sync(context.Background(), ps[:1]); err != nil {
		t.Fatal(err)
	}
	if dump := fake.Dump(); strings.Count(dump, "add rule") != 2 || !strings.Contains(dump, "e2e/web:http") {
		t.Fatalf("after a sync with one portal:\n%s", dump)
	}
	for i := 0; i < 2; i++ {
		if err := CleanupNFTables(context.Background(), fake); err != nil {
			t.Fatalf("cleanup #%d: %v", i+1, err)
		}
	}
	if ok, err := c.Present(context.Background()); ok || err != nil {
		t.Fatalf("Present after cleanup: %v, %v", ok, err)
	}
}
