package config

import (
	"net"
	"net/netip"
	"strconv"

	netutils "k8s.io/utils/net"
)

// kube-proxy reads its addresses and CIDRs with k8s.io/utils/net's
// "sloppy" parsers, Go's parsers before 1.17: an IPv4 octet may have
// leading zeros (read as decimal: 010.0.0.1 is 10.0.0.1), and an IPv6
// address has no zone. netip refuses the first and takes the second, so
// sluice parses as kube-proxy does and rewrites what only the sloppy
// parser takes into its canonical text, which the rest of sluice (netip,
// net.Listen) reads.

// parseIPSloppy parses an address as kube-proxy does; an IPv4-mapped IPv6
// address is IPv4, as in kube-proxy.
func parseIPSloppy(s string) (netip.Addr, bool) {
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// parseCIDRSloppy parses a CIDR as kube-proxy does, keeping the address's
// host bits (10.0.0.1/8 stays so, as netip keeps it).
func parseCIDRSloppy(s string) (netip.Prefix, bool) {
	ip, ipnet, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := ipnet.Mask.Size()
	if a.Is4In6() && len(ipnet.IP) == net.IPv4len {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, ones), true
}

// canonicalIP is s as netip writes it when only the sloppy parser takes
// it, else s unchanged.
func canonicalIP(s string) string {
	if _, err := netip.ParseAddr(s); err == nil {
		return s
	}
	if a, ok := parseIPSloppy(s); ok {
		return a.String()
	}
	return s
}

// canonicalCIDR is canonicalIP for a CIDR.
func canonicalCIDR(s string) string {
	if _, err := netip.ParsePrefix(s); err == nil {
		return s
	}
	if p, ok := parseCIDRSloppy(s); ok {
		return p.String()
	}
	return s
}

// canonicalHostPort is canonicalIP for the host of a host:port, with the
// port as a plain number.
func canonicalHostPort(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return s
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return s
	}
	return net.JoinHostPort(canonicalIP(host), strconv.Itoa(p))
}
