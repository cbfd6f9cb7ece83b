package iptables

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// failingFake is a Fake whose next restore fails when fail is set.
type failingFake struct {
	*Fake
	fail bool
	last []byte
}

func (f *failingFake) Restore(data []byte) error {
	if f.fail {
		f.fail = false
		return errors.New("restore refused")
	}
	f.last = append(f.last[:0], data...)
	return f.Fake.Restore(data)
}

// randomPort is one of n service ports, in a random shape.
func randomPort(rng *rand.Rand, i int) *lb.ServicePort {
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: lb.TCP},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})}, Port: 80}
	if rng.IntN(8) == 0 {
		sp.ClusterIPs = []netip.Addr{netip.MustParseAddr("fd00::1")} // no chains in this family
	}
	if rng.IntN(3) == 0 {
		sp.NodePort = uint16(30000 + i)
		sp.ExternalLocal = rng.IntN(2) == 0
	}
	if rng.IntN(4) == 0 {
		sp.Affinity = lb.Affinity{ClientIP: true, Timeout: time.Hour}
	}
	// Mostly a few endpoints; now and then many, so that the total
	// crosses LargeClusterEndpoints both ways during the walk.
	n := rng.IntN(5)
	if rng.IntN(6) == 0 {
		n = 200 + rng.IntN(200)
	}
	for j := range n {
		sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j%250 + 1)}), uint16(8080+j/250)),
			Ready: rng.IntN(5) > 0, Serving: true, Local: rng.IntN(2) == 0})
	}
	return sp
}

// A partial sync from a snapshot's delta writes exactly what a partial
// sync that compares every port writes, byte for byte, along a random
// walk of deltas: ports added, changed, removed, named without a change,
// large-cluster mode switched on and off, a snapshot skipped (its
// successor's delta is then not over what was applied) and failed
// restores; and the tables always equal a fresh full sync's.
func TestDeltaSyncsWriteWhatFullComparisonsWrite(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	deltas, partials := 0, 0
	for round := 0; round < 6; round++ {
		withDelta := &failingFake{Fake: NewFake()}
		compared := &failingFake{Fake: NewFake()}
		pd := &Proxier{Runner: withDelta, Options: opts()}
		pc := &Proxier{Runner: compared, Options: opts()}
		ports := map[lb.ServicePortName]*lb.ServicePort{}
		for i := range 12 {
			sp := randomPort(rng, i)
			ports[sp.Name] = sp
		}
		cur := lb.NewSnapshot(ports)
		cur.ID = 1
		for step := 0; step < 40; step++ {
			set := map[lb.ServicePortName]*lb.ServicePort{}
			var del []lb.ServicePortName
			for k := rng.IntN(4); k >= 0; k-- {
				i := rng.IntN(16)
				name := lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Port: "p", Protocol: lb.TCP}
				switch old := cur.Ports.Get(name); {
				case old != nil && rng.IntN(4) == 0:
					del = append(del, name)
				case old != nil && rng.IntN(4) == 0:
					c := *old // the same port under a new pointer
					set[name] = &c
				default:
					set[name] = randomPort(rng, i)
				}
			}
			next := cur.With(set, del)
			next.ID = cur.ID + 1
			cur = next
			if rng.IntN(8) == 0 {
				continue // never applied: the next delta is not over what was
			}
			fail := rng.IntN(10) == 0
			withDelta.fail, compared.fail = fail, fail
			before := pd.delta.deltas
			// The comparing proxier gets the same state without its delta.
			plain := &lb.Snapshot{Ports: cur.Ports}
			std, errd := pd.SyncStats(cur)
			stc, errc := pc.SyncStats(plain)
			if (errd == nil) != (errc == nil) || std != stc {
				t.Fatalf("round %d step %d: with delta %+v %v, compared %+v %v", round, step, std, errd, stc, errc)
			}
			if errd != nil {
				continue
			}
			if pd.delta.deltas > before {
				deltas++
			}
			if !std.Full {
				partials++
			}
			if string(withDelta.last) != string(compared.last) {
				t.Fatalf("round %d step %d (full=%v, delta=%v): restores differ:\n%s\nwant:\n%s", round, step, std.Full, pd.delta.deltas > before, withDelta.last, compared.last)
			}
			// What the next delta starts from is this state's ports, in
			// name order, each the very port of the snapshot.
			if len(pd.delta.order) != cur.Ports.Len() {
				t.Fatalf("round %d step %d: %d ports kept in order, the state has %d", round, step, len(pd.delta.order), cur.Ports.Len())
			}
			for i, sp := range pd.delta.order {
				if cur.Ports.Get(sp.Name) != sp || (i > 0 && pd.delta.order[i-1].Name.Compare(sp.Name) >= 0) {
					t.Fatalf("round %d step %d: port %d of the order is %v, not the state's, or out of order", round, step, i, sp.Name)
				}
			}
			fresh := NewFake()
			syncTo(t, fresh, opts(), cur)
			if got, want := withDelta.Dump(), fresh.Dump(); got != want {
				t.Fatalf("round %d step %d: tables differ from a full sync:\n%s\nwant:\n%s", round, step, got, want)
			}
		}
	}
	if deltas < partials/2 || deltas == 0 {
		t.Fatalf("%d of %d partial syncs were rendered from the delta", deltas, partials)
	}
	t.Logf("%d of %d partial syncs from the delta", deltas, partials)
}
