package main

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/kernel/conntrack"
	"github.com/sluice-proxy/sluice/lb"
)

// ctPort is service port s<j>: UDP for even j, TCP for odd, on ClusterIP
// 10.96.0.<j+1>, with up to three of four endpoints.
func ctPort(rng *rand.Rand, j int) *lb.ServicePort {
	proto := lb.UDP
	if j%2 == 1 {
		proto = lb.TCP
	}
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", j), Port: "p", Protocol: proto},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)})}, Port: 53}
	for e := range 4 {
		if rng.IntN(2) == 0 {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(e + 1)}), 53), Ready: true, Serving: true})
		}
	}
	return sp
}

// The conntrack clean-up told what changed reads the table only when a
// UDP or SCTP port changed (or the host's addresses did, or the last one
// failed), matching only the changed ports, and leaves the table as a
// clean-up of every port after every sync leaves it: along random walks
// of changes, skipped snapshots and failed reads, with flows made between
// syncs as the kernel makes them (DNATed to a usable endpoint, or
// untranslated while the port has none).
func TestConntrackReconcileReadsTheTableOnlyForUDPChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	log := slog.New(slog.DiscardHandler)
	m := admin.NewMetrics()
	local := &localAddrs{set: map[netip.Addr]bool{netip.MustParseAddr("192.168.10.1"): true}}
	everyA, withDelta := &conntrack.Fake{}, &conntrack.Fake{}
	readsA, readsB := 0, 0
	// A failed read fails for both clean-ups: it is the kernel's table
	// that could not be read. (Failed for the one told what changed only,
	// an endpoint that went and came back while it could not read left a
	// flow the other had deleted in between, and that it rightly keeps.)
	failNext, failEvery := false, false
	ra := conntrackReconciler{del: func(_ bool, stale func(conntrack.Flow) bool) (int, error) {
		readsA++
		if failEvery {
			return 0, fmt.Errorf("injected failure")
		}
		return everyA.DeleteMatching(stale)
	}}
	rb := conntrackReconciler{del: func(_ bool, stale func(conntrack.Flow) bool) (int, error) {
		readsB++
		if failNext {
			failNext = false
			return 0, fmt.Errorf("injected failure")
		}
		return withDelta.DeleteMatching(stale)
	}}
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for j := range 8 {
		sp := ctPort(rng, j)
		ports[sp.Name] = sp
	}
	cur := lb.NewSnapshot(ports)
	cur.ID = 1
	failed := false
	steps, tcpOnly := 0, 0
	for step := range 300 {
		if step > 0 {
			udp := rng.IntN(3) == 0
			cur = randomChange(rng, cur, 2, 5, func() *lb.ServicePort {
				j := 2*rng.IntN(4) + 1 // TCP
				if udp {
					j--
				}
				return ctPort(rng, j)
			})
			if rng.IntN(10) == 0 {
				continue // never synced
			}
			if !udp {
				tcpOnly++
			}
		}
		steps++
		failNext = rng.IntN(15) == 0
		failEvery = failNext
		if failNext {
			failed = true
		}
		ra.reconcile(&lb.Snapshot{Ports: cur.Ports}, false, local, m, log)
		rb.reconcile(cur, false, local, m, log)
		if failNext { // not read: the failure waits for the next read
			failNext = false
		}
		if failed && rb.snapID[0] == cur.ID {
			// A failed read is done again, whatever changed.
			failed = false
		}
		if !failed && !slices.Equal(everyA.Flows, withDelta.Flows) {
			t.Fatalf("step %d: the table is\n%v\nwant\n%v", step, withDelta.Flows, everyA.Flows)
		}
		// Clients send: each UDP port gets a flow as the rules translate it now.
		for _, sp := range cur.Ports.All() {
			if sp.Name.Protocol != lb.UDP || rng.IntN(2) == 0 {
				continue
			}
			vip := netip.AddrPortFrom(sp.ClusterIPs[0], sp.Port)
			f := conntrack.Flow{Proto: conntrack.ProtoUDP, OrigSrc: netip.AddrPortFrom(netip.MustParseAddr("192.168.10.9"), uint16(1000+step)), OrigDst: vip, ReplySrc: vip}
			if eps := sp.Usable(); len(eps) > 0 {
				f.ReplySrc = eps[rng.IntN(len(eps))]
			}
			everyA.Flows = append(everyA.Flows, f)
			withDelta.Flows = append(withDelta.Flows, f)
		}
	}
	if readsB >= readsA-tcpOnly/2 || tcpOnly < 50 {
		t.Fatalf("the table was read %d times told what changed, %d times comparing every port (%d of %d syncs changed only TCP)", readsB, readsA, tcpOnly, steps)
	}
}

// BenchmarkConntrackReconcileAt10k is the clean-up after a sync at
// 10,000 service ports (half UDP, 10 endpoints each) with 10,000 UDP
// flows in the table: comparing every port (every) against told what
// changed (changed), for a change to one TCP port and to one UDP port.
// The table here is the fake; table-reads/op is how often the kernel's
// would be dumped.
func BenchmarkConntrackReconcileAt10k(b *testing.B) {
	log := slog.New(slog.DiscardHandler)
	m := admin.NewMetrics()
	local := &localAddrs{set: map[netip.Addr]bool{}}
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	var flows []conntrack.Flow
	for j := range 10000 {
		proto := lb.UDP
		if j%2 == 1 {
			proto = lb.TCP
		}
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", j), Port: "p", Protocol: proto},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(j >> 8), byte(j)})}, Port: 53}
		for e := range 10 {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 244, byte(j >> 8), byte(j)}), uint16(5300+e)), Ready: true, Serving: true})
		}
		ports[sp.Name] = sp
		if proto == lb.UDP {
			for f := range 2 {
				flows = append(flows, conntrack.Flow{Proto: conntrack.ProtoUDP, OrigSrc: netip.AddrPortFrom(netip.MustParseAddr("192.168.10.9"), uint16(1000+f)),
					OrigDst: netip.AddrPortFrom(sp.ClusterIPs[0], 53), ReplySrc: sp.Endpoints[f].Addr.AddrPort()})
			}
		}
	}
	for _, changedProto := range []string{"tcp", "udp"} {
		for _, mode := range []string{"every", "changed"} {
			b.Run(changedProto+"/"+mode, func(b *testing.B) {
				table := &conntrack.Fake{Flows: slices.Clone(flows)}
				reads := 0
				r := conntrackReconciler{del: func(_ bool, stale func(conntrack.Flow) bool) (int, error) {
					reads++
					return table.DeleteMatching(stale)
				}}
				cur := lb.NewSnapshot(ports)
				cur.ID = 1
				r.reconcile(cur, false, local, m, log)
				name := lb.ServicePortName{Namespace: "ns", Name: "s4321", Port: "p", Protocol: lb.TCP}
				if changedProto == "udp" {
					name = lb.ServicePortName{Namespace: "ns", Name: "s4320", Port: "p", Protocol: lb.UDP}
				}
				reads = 0
				for b.Loop() {
					sp := *ports[name]
					sp.Endpoints = ports[name].Endpoints[2:] // the flows' endpoints stay
					next := cur.With(map[lb.ServicePortName]*lb.ServicePort{name: &sp}, nil)
					next.ID = cur.ID + 1
					cur = next
					if mode == "every" {
						r.reconcile(&lb.Snapshot{Ports: cur.Ports}, false, local, m, log)
					} else {
						r.reconcile(cur, false, local, m, log)
					}
				}
				b.ReportMetric(float64(reads)/float64(b.N), "table-reads/op")
			})
		}
	}
}
