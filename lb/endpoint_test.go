package lb

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// endpointAddrs are addresses whose pieces make a wrong form show: IPv4
// against IPv6 and IPv4-mapped IPv6, bytes high and low, ports either way.
func endpointAddrs(rng *rand.Rand, n int) []netip.AddrPort {
	fixed := []string{"1.2.3.4:80", "1.2.3.4:8080", "1.2.3.5:1", "255.0.0.1:9", "0.0.0.1:65535",
		"[::1]:80", "[::ffff:1.2.3.4]:80", "[fe80::1]:1", "[2001:db8::1]:443", "[::]:0", "0.0.0.0:0"}
	var out []netip.AddrPort
	for _, s := range fixed {
		out = append(out, netip.MustParseAddrPort(s))
	}
	for range n {
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.IntN(3)) * 127 // few values, so ties come up
		}
		port := uint16(rng.IntN(3))
		if rng.IntN(2) == 0 {
			out = append(out, netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[:4])), port))
		} else {
			out = append(out, netip.AddrPortFrom(netip.AddrFrom16(b), port))
		}
	}
	return out
}

// An EndpointAddr is its netip.AddrPort again, prints as it, and is
// equal to another exactly when their AddrPorts are.
func TestEndpointAddrAgreesWithAddrPort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	all := endpointAddrs(rng, 200)
	for _, ap := range all {
		e := EndpointAddrOf(ap)
		if got := e.AddrPort(); got != ap {
			t.Fatalf("%v came back as %v", ap, got)
		}
		if e.Addr() != ap.Addr() || e.Port() != ap.Port() {
			t.Fatalf("%v: addr %v port %d", ap, e.Addr(), e.Port())
		}
		if e.String() != ap.String() || string(e.AppendTo([]byte("x"))) != "x"+ap.String() {
			t.Fatalf("%v prints as %q and %q", ap, e.String(), e.AppendTo(nil))
		}
		if e != EndpointAddrFrom(ap.Addr(), ap.Port()) {
			t.Fatalf("%v: EndpointAddrFrom differs", ap)
		}
	}
	for _, a := range all {
		for _, b := range all {
			if ea, eb := EndpointAddrOf(a), EndpointAddrOf(b); (ea == eb) != (a == b) {
				t.Fatalf("%v == %v: %v, want %v", a, b, ea == eb, a == b)
			}
		}
	}
	if EndpointAddrOf(netip.AddrPort{}) != (EndpointAddr{}) || (EndpointAddr{}).AddrPort() != (netip.AddrPort{}) {
		t.Fatal("the zero EndpointAddr is not the zero AddrPort")
	}
}
