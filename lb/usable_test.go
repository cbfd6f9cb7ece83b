package lb

import (
	"math/rand/v2"
	"net/netip"
	"slices"
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
		var out []EndpointAddr
		for _, ep := range sp.Endpoints {
			if rng.IntN(3) == 0 {
				out = append(out, ep.Addr)
			}
		}
		slices.SortFunc(out, EndpointAddr.Compare)
		sp.SetOutOfTopology(out)
		for _, local := range []bool{false, true} {
			if got, want := sp.HasUsable(local), len(sp.Select(local)) > 0; got != want {
				t.Fatalf("HasUsable(%v) = %v, Select gives %v, for %+v", local, got, sp.Select(local), sp.Endpoints)
			}
		}
	}
}

// Topology hints keep cluster traffic from the endpoints out of this
// node's topology; local traffic, and the fall-back to serving
// terminating endpoints, ignore them, as kube-proxy's CategorizeEndpoints.
func TestOutOfTopologyEndpointsTakeNoClusterTraffic(t *testing.T) {
	ep := func(last byte, ready, local bool) Endpoint {
		return Endpoint{Addr: EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 0, 0, last}), 80), Ready: ready, Serving: true, Local: local}
	}
	sp := &ServicePort{Endpoints: []Endpoint{ep(1, true, true), ep(2, true, false), ep(3, true, false)}}
	sp.SetOutOfTopology([]EndpointAddr{sp.Endpoints[0].Addr, sp.Endpoints[2].Addr})
	if got := sp.Select(false); len(got) != 1 || got[0] != sp.Endpoints[1].Addr.AddrPort() {
		t.Fatalf("cluster traffic to %v, want only the one in topology", got)
	}
	if got := sp.Select(true); len(got) != 1 || got[0] != sp.Endpoints[0].Addr.AddrPort() {
		t.Fatalf("local traffic to %v, want the local endpoint, out of topology or not", got)
	}
	sp.SetExternalIPs([]netip.Addr{netip.MustParseAddr("192.0.2.1")})
	if len(sp.OutOfTopology()) != 2 {
		t.Fatal("setting the external IPs lost the topology")
	}
	sp.SetOutOfTopology(nil)
	if len(sp.Select(false)) != 3 || len(sp.ExternalIPs()) != 1 {
		t.Fatalf("cleared: %v, external %v", sp.Select(false), sp.ExternalIPs())
	}
	sp.SetExternalIPs(nil)
	if sp.External != nil {
		t.Fatal("an External with nothing in it")
	}
}
