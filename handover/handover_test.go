package handover

import (
	"net/netip"
	"runtime"
	"slices"
	"testing"
)

// What is held is what is offered: every network and kind of address,
// the ones held compactly and the ones held as they are, and nothing once
// released.
func TestHeldSocketsAreOfferedAsHeld(t *testing.T) {
	held := []socket{
		{key{"tcp", netip.MustParseAddrPort("10.0.0.1:80")}, 3},
		{key{"udp", netip.MustParseAddrPort("[2001:db8::1]:53")}, 4},
		{key{"sctp", netip.MustParseAddrPort("[::ffff:10.0.0.1]:9")}, 5},
		{key{"tcp", netip.MustParseAddrPort("0.0.0.0:30080")}, 6},
		{key{"tcp", netip.MustParseAddrPort("[fe80::1%eth0]:80")}, 7},
		{key{"tcp4", netip.MustParseAddrPort("127.0.0.1:1")}, 8},
	}
	var b Broker
	for _, s := range held {
		b.Hold(s.network, s.addr, s.fd)
	}
	b.Hold("udp", netip.MustParseAddrPort("10.0.0.2:53"), 9)
	b.Release(9)
	var got []socket
	b.eachHeld(func(s socket) error { got = append(got, s); return nil })
	byFD := func(a, b socket) int { return a.fd - b.fd }
	slices.SortFunc(got, byFD)
	if !slices.Equal(got, held) {
		t.Fatalf("offered %v, want %v", got, held)
	}
}

// A held socket costs the broker about 40 bytes at 10k, where a key with
// the network's name and a netip.AddrPort cost 101 (issue 16's memory
// budget). Counted, not timed.
func TestHeldSocketsAreHeldCompactly(t *testing.T) {
	const n = 10000
	var b Broker
	before := liveHeap()
	for i := range n {
		b.Hold("tcp", netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), 80), 100+i)
	}
	per := float64(liveHeap()-before) / n
	runtime.KeepAlive(&b)
	t.Logf("%.1f bytes per held socket", per)
	if per > 50 {
		t.Fatalf("%.0f bytes per held socket, want at most 50", per)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
