package portals

import (
	"net/netip"
	"testing"
)

// BenchmarkBinderEnsureAt10k is a sync's bind work with 10,000 service
// IPs already assigned: Ensure then Prune with the same list (issue 16).
func BenchmarkBinderEnsureAt10k(b *testing.B) {
	tab := NewFakeAddrTable()
	bd := &Binder{Table: tab, DummyOnly: true}
	if _, err := bd.Init(); err != nil {
		b.Fatal(err)
	}
	want := make([]netip.Addr, 10000)
	for i := range want {
		want[i] = netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
	}
	if err := bd.Ensure(want); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := bd.Ensure(want); err != nil {
			b.Fatal(err)
		}
		if err := bd.Prune(want); err != nil {
			b.Fatal(err)
		}
	}
}
