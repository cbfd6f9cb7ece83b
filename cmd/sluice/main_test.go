package main

import (
	"net/netip"
	"slices"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	out := []netip.Addr{}
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestSelectNodePortAddrs(t *testing.T) {
	local := addrs("127.0.0.1", "10.0.0.5", "192.168.1.7", "::1", "fd00::5")
	cases := []struct {
		spec []string
		want []netip.Addr
	}{
		{nil, nil},
		{[]string{"10.0.0.0/8"}, addrs("10.0.0.5")},
		{[]string{"127.0.0.0/8", "fd00::/8"}, addrs("127.0.0.1", "fd00::5")},
		{[]string{"primary"}, addrs("10.0.0.5", "fd00::5")},
		{[]string{"172.16.0.0/12"}, addrs()},
	}
	for _, tc := range cases {
		got := selectNodePortAddrs(tc.spec, local)
		if (got == nil) != (tc.want == nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%v: got %v, want %v", tc.spec, got, tc.want)
		}
	}
}
