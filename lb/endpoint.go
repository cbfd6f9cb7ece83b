package lb

import (
	"bytes"
	"cmp"
	"net/netip"
)

// EndpointAddr is an endpoint's IP address and port in 20 bytes with no
// pointer: a netip.AddrPort is 32, a pointer word among them, and every
// Service's endpoint list is the largest thing the sources hold per
// Service (issue 16's memory budget). Lists of them are not scanned by the
// garbage collector. An endpoint's address has no IPv6 zone (the sources
// refuse one); the zero value is not valid.
type EndpointAddr struct {
	ip   [16]byte // IPv4 in the last four bytes
	port uint16
	kind uint8 // 0: not valid, 4 or 6
}

// EndpointAddrOf is ap as an EndpointAddr, dropping any IPv6 zone; an
// IPv4-mapped IPv6 address stays IPv6, as in netip.
func EndpointAddrOf(ap netip.AddrPort) EndpointAddr {
	a := ap.Addr()
	switch {
	case a.Is4():
		return EndpointAddr{ip: a.As16(), port: ap.Port(), kind: 4}
	case a.Is6():
		return EndpointAddr{ip: a.As16(), port: ap.Port(), kind: 6}
	}
	return EndpointAddr{}
}

// EndpointAddrFrom is a and port as an EndpointAddr.
func EndpointAddrFrom(a netip.Addr, port uint16) EndpointAddr {
	return EndpointAddrOf(netip.AddrPortFrom(a, port))
}

// Addr is the IP address (the zero netip.Addr when e is not valid).
func (e EndpointAddr) Addr() netip.Addr {
	if e.kind == 4 {
		return netip.AddrFrom4([4]byte(e.ip[12:]))
	}
	if e.kind == 6 {
		return netip.AddrFrom16(e.ip)
	}
	return netip.Addr{}
}

// Port is the port number.
func (e EndpointAddr) Port() uint16 { return e.port }

// AddrPort is e as a netip.AddrPort (the zero value's is the zero one).
func (e EndpointAddr) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr(), e.port) }

// String is netip.AddrPort's form: "1.2.3.4:80", "[::1]:80".
func (e EndpointAddr) String() string { return e.AddrPort().String() }

// AppendTo appends String's form to b.
func (e EndpointAddr) AppendTo(b []byte) []byte { return e.AddrPort().AppendTo(b) }

// Compare orders addresses by family, address and port (as slices.SortFunc
// and BinarySearchFunc take it): -1, 0 or 1.
func (a EndpointAddr) Compare(b EndpointAddr) int {
	if c := cmp.Compare(a.kind, b.kind); c != 0 {
		return c
	}
	if c := bytes.Compare(a.ip[:], b.ip[:]); c != 0 {
		return c
	}
	return cmp.Compare(a.port, b.port)
}

func compareEndpointAddr(a, b EndpointAddr) int { return a.Compare(b) }
