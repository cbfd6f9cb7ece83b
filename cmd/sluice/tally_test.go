package main

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// randomChange is the snapshot after cur: up to n ports made by port
// set, or, when they exist, one time in delOneIn deleted.
func randomChange(rng *rand.Rand, cur *lb.Snapshot, n, delOneIn int, port func() *lb.ServicePort) *lb.Snapshot {
	set := map[lb.ServicePortName]*lb.ServicePort{}
	var del []lb.ServicePortName
	for k := rng.IntN(n); k >= 0; k-- {
		sp := port()
		if cur.Ports.Get(sp.Name) != nil && rng.IntN(delOneIn) == 0 {
			del = append(del, sp.Name)
		} else {
			set[sp.Name] = sp
		}
	}
	next := cur.With(set, del)
	next.ID = cur.ID + 1
	return next
}

// noLocalEndpoints counts, for one IP family, the service ports with a
// Local policy that have endpoints but none on this node, walking every
// port: what noLocalTally must keep from the deltas.
func noLocalEndpoints(snap *lb.Snapshot, v6 bool) (internal, external int) {
	for _, sp := range snap.Ports.All() {
		in, ex := noLocalEndpoint(sp, v6)
		internal += in
		external += ex
	}
	return internal, external
}

// tallyPort is port i in a random shape: either family, Local policies,
// endpoints local or not, ready or not, now and then on loopback.
func tallyPort(rng *rand.Rand, i int) *lb.ServicePort {
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Protocol: lb.TCP},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})}, InternalLocal: rng.IntN(2) == 0, ExternalLocal: rng.IntN(2) == 0}
	if rng.IntN(3) == 0 {
		sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("fd00::1")}
	}
	if rng.IntN(2) == 0 {
		sp.NodePort = uint16(30000 + i)
	}
	for j := rng.IntN(3); j > 0; j-- {
		a := netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j)})
		if rng.IntN(10) == 0 {
			a = netip.MustParseAddr("127.0.0.1")
		}
		sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(a, 80), Ready: rng.IntN(4) > 0, Serving: true, Local: rng.IntN(3) == 0})
	}
	return sp
}

// The no-local-endpoint counts and the loopback warnings follow each
// snapshot's delta to what walking every port gives, along random walks
// with skipped states (whose successors' deltas are then not over the
// last one) and snapshots without a delta.
func TestKernelPlaneTalliesFollowDeltas(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	fromDelta := 0
	for round := 0; round < 20; round++ {
		var tally noLocalTally
		w := loopbackWarner{mode: "iptables", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		shouldWarn := map[lb.ServicePortName]bool{}
		ports := map[lb.ServicePortName]*lb.ServicePort{}
		for i := range 8 {
			sp := tallyPort(rng, i)
			ports[sp.Name] = sp
		}
		cur := lb.NewSnapshot(ports)
		cur.ID = 1
		for step := 0; step < 30; step++ {
			if step > 0 {
				set := map[lb.ServicePortName]*lb.ServicePort{}
				var del []lb.ServicePortName
				for k := rng.IntN(3); k >= 0; k-- {
					i := rng.IntN(10)
					if name := (lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Protocol: lb.TCP}); rng.IntN(4) == 0 {
						del = append(del, name)
					} else {
						set[name] = tallyPort(rng, i)
					}
				}
				next := cur.With(set, del)
				next.ID = cur.ID + 1
				if rng.IntN(10) == 0 {
					next = &lb.Snapshot{Ports: next.Ports, ID: next.ID} // no delta
				}
				cur = next
				if rng.IntN(6) == 0 {
					continue // never applied
				}
			}
			before := tally.snap
			tally.update(cur)
			w.check(cur)
			if _, ok := cur.DeltaSince(idOf(before)); ok && before != nil {
				fromDelta++
			}
			for _, v6 := range []bool{false, true} {
				gi, ge := tally.get(v6)
				wi, we := noLocalEndpoints(cur, v6)
				if gi != wi || ge != we {
					t.Fatalf("round %d step %d v6=%v: tally %d/%d, walk %d/%d", round, step, v6, gi, ge, wi, we)
				}
			}
			for name, sp := range cur.Ports.All() {
				for _, ep := range sp.Endpoints {
					if ep.Addr.Addr().IsLoopback() {
						shouldWarn[name] = true
					}
				}
			}
			for name := range shouldWarn {
				if !w.warned[name] {
					t.Fatalf("round %d step %d: %v has had a loopback endpoint, never warned of", round, step, name)
				}
			}
		}
	}
	if fromDelta < 100 {
		t.Fatalf("only %d updates from a delta", fromDelta)
	}
}

func idOf(s *lb.Snapshot) uint64 {
	if s == nil {
		return 0
	}
	return s.ID
}

// The per-sync walks of a kernel plane at 10k Services x 10 endpoints,
// for one one-Service update: the no-local-endpoint counts (both
// families) and the loopback check, from the snapshot's delta.
func BenchmarkKernelPlaneTallies(b *testing.B) {
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for i := range 10000 {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "b", Name: fmt.Sprint(i), Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}}
		for j := range 10 {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 1, byte(i), byte(j)}), 80), Ready: true, Serving: true})
		}
		ports[sp.Name] = sp
	}
	cur := lb.NewSnapshot(ports)
	cur.ID = 1
	name := lb.ServicePortName{Namespace: "b", Name: "5000", Port: "p", Protocol: lb.TCP}
	moved := *cur.Ports.Get(name)
	moved.Endpoints = moved.Endpoints[1:]
	versions := []*lb.ServicePort{cur.Ports.Get(name), &moved}
	var tally noLocalTally
	w := loopbackWarner{mode: "iptables", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	tally.update(cur)
	w.check(cur)
	i := 0
	for b.Loop() {
		i++
		next := cur.With(map[lb.ServicePortName]*lb.ServicePort{name: versions[i%2]}, nil)
		next.ID = cur.ID + 1
		cur = next
		tally.update(cur)
		w.check(cur)
		tally.get(false)
		tally.get(true)
	}
}

// In IPVS mode the Services with a Local policy and no local endpoint are
// counted, not their ports, as kube-proxy's IPVS mode counts them; the
// other kernel modes count ports, as kube-proxy's do.
func TestNoLocalTallyCountsServicesInIPVSMode(t *testing.T) {
	port := func(name, port string) *lb.ServicePort {
		return &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: name, Port: port, Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.5")}, InternalLocal: true, ExternalLocal: true, NodePort: 30000,
			Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrFrom(netip.MustParseAddr("10.244.1.5"), 80), Ready: true, Serving: true}}}
	}
	a, b := port("web", "http"), port("web", "dns")
	full := lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{a.Name: a, b.Name: b})
	full.ID = 1
	one := full.With(nil, []lb.ServicePortName{b.Name})
	one.ID = 2
	none := one.With(nil, []lb.ServicePortName{a.Name})
	none.ID = 3
	for _, c := range []struct {
		byService bool
		want      [3]int
	}{{false, [3]int{2, 1, 0}}, {true, [3]int{1, 1, 0}}} {
		tally := noLocalTally{byService: c.byService}
		for i, snap := range []*lb.Snapshot{full, one, none} {
			tally.update(snap)
			if in, ex := tally.get(false); in != c.want[i] || ex != c.want[i] {
				t.Errorf("byService %v, snapshot %d: %d internal, %d external; want %d", c.byService, i, in, ex, c.want[i])
			}
		}
		tally = noLocalTally{byService: c.byService}
		tally.update(&lb.Snapshot{Ports: full.Ports}) // no delta: a walk
		if in, _ := tally.get(false); in != c.want[0] {
			t.Errorf("byService %v, walked: %d, want %d", c.byService, in, c.want[0])
		}
	}
}
