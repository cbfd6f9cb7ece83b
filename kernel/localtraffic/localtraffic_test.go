package localtraffic

import (
	"net/netip"
	"strings"
	"testing"
)

// The words are kube-proxy's localdetector.go's, for each mode, matched
// and negated; the zero Match writes nothing.
func TestMatchWordsAreKubeProxys(t *testing.T) {
	for _, tc := range []struct {
		m                        Match
		ipt, iptNot, nft, nftNot string
	}{
		{ByCIDR(netip.MustParsePrefix("10.244.0.0/16")), "-s 10.244.0.0/16", "! -s 10.244.0.0/16", "ip saddr 10.244.0.0/16", "ip saddr != 10.244.0.0/16"},
		{ByCIDR(netip.MustParsePrefix("fd00:244::/64")), "-s fd00:244::/64", "! -s fd00:244::/64", "ip6 saddr fd00:244::/64", "ip6 saddr != fd00:244::/64"},
		{ByInterface("cbr0"), "-i cbr0", "! -i cbr0", "iifname cbr0", "iifname != cbr0"},
		{ByInterfacePrefix("veth"), "-i veth+", "! -i veth+", "iifname veth*", "iifname != veth*"},
		{Match{}, "", "", "", ""},
	} {
		if got := strings.Join(tc.m.IPTables(false), " "); got != tc.ipt {
			t.Errorf("%v: iptables %q, want %q", tc.m, got, tc.ipt)
		}
		if got := strings.Join(tc.m.IPTables(true), " "); got != tc.iptNot && tc.m.IsSet() {
			t.Errorf("%v: iptables negated %q, want %q", tc.m, got, tc.iptNot)
		}
		if got := tc.m.NFT(false); got != tc.nft {
			t.Errorf("%v: nft %q, want %q", tc.m, got, tc.nft)
		}
		if got := tc.m.NFT(true); got != tc.nftNot {
			t.Errorf("%v: nft negated %q, want %q", tc.m, got, tc.nftNot)
		}
		if tc.m.IsSet() == (tc.ipt == "") {
			t.Errorf("%v: IsSet %v", tc.m, tc.m.IsSet())
		}
	}
}
