package lb

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// HasUsable says what len(Select(x)) > 0 says, for any mix of endpoint
// conditions.
func TestHasUsableIsSelectNonEmpty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for i := 0; i < 2000; i++ {
		sp := &ServicePort{}
		for j := rng.IntN(5); j > 0; j-- {
			sp.Endpoints = append(sp.Endpoints, Endpoint{Addr: EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(j)}), 80),
				Ready: rng.IntN(3) == 0, Serving: rng.IntN(2) == 0, Terminating: rng.IntN(2) == 0, Local: rng.IntN(2) == 0})
		}
		for _, local := range []bool{false, true} {
			if got, want := sp.HasUsable(local), len(sp.Select(local)) > 0; got != want {
				t.Fatalf("HasUsable(%v) = %v, Select gives %v, for %+v", local, got, sp.Select(local), sp.Endpoints)
			}
		}
	}
}
