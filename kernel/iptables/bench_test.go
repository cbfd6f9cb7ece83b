package iptables

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// bigSnapshot is n services with 10 ready endpoints each.
func bigSnapshot(n int) *lb.Snapshot {
	sPorts := map[lb.ServicePortName]*lb.ServicePort{}
	for i := 0; i < n; i++ {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80, NodePort: uint16(30000 + i%2768)}
		for j := 0; j < 10; j++ {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>12), byte(i >> 4), byte(j + 16*(i&15))}), 8080), Ready: true, Serving: true})
		}
		sPorts[sp.Name] = sp
	}
	return lb.NewSnapshot(sPorts)
}

// The in-process sync benchmark of the iptables mode: full and partial
// renders, and syncs applied to the stateful Fake (which parses and
// validates like iptables-restore), at 1k and 10k services x 10 endpoints.
// A partial sync follows a change of one service's endpoints. The same with
// the real iptables-restore, in a private network namespace, is
// `make bench-sync` (bench/cmd/sluice-bench sync).
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		snap := bigSnapshot(n)
		changed := bigSnapshot(n)
		one := changed.Sorted()[n/2]
		one.Endpoints = one.Endpoints[1:]
		b.Run(fmt.Sprintf("render-full/%d", n), func(b *testing.B) {
			for b.Loop() {
				Render(snap, opts())
			}
		})
		_, applied, _ := RenderPartial(snap, opts(), nil)
		b.Run(fmt.Sprintf("render-partial/%d", n), func(b *testing.B) {
			for b.Loop() {
				RenderPartial(changed, opts(), applied)
			}
		})
		// The proxier's own partial sync (render with its port cache,
		// rule counts), the restore taken as done: what sluice itself
		// spends and allocates per partial sync.
		b.Run(fmt.Sprintf("sync-partial-proxier/%d", n), func(b *testing.B) {
			f := NewFake()
			p := &Proxier{Runner: f, Options: opts()}
			if err := p.Sync(snap); err != nil {
				b.Fatal(err)
			}
			p.Runner = restoresTakenAsDone{f}
			// As the sources publish: the unchanged ports are the same
			// pointers in both states, which the port cache relies on.
			ports := map[lb.ServicePortName]*lb.ServicePort{}
			for _, sp := range snap.Ports.All() {
				ports[sp.Name] = sp
			}
			ports[one.Name] = one
			states := []*lb.Snapshot{snap, lb.NewSnapshot(ports)}
			i := 0
			for b.Loop() {
				i++
				if err := p.Sync(states[i%2]); err != nil {
					b.Fatal(err)
				}
			}
		})
		// The same, from each snapshot's delta (as the sources publish
		// them: the one before with one port replaced): what a partial
		// sync costs when only the changed port is looked at.
		b.Run(fmt.Sprintf("sync-partial-delta/%d", n), func(b *testing.B) {
			f := NewFake()
			p := &Proxier{Runner: f, Options: opts()}
			cur := &lb.Snapshot{Ports: snap.Ports, ID: 1}
			if err := p.Sync(cur); err != nil {
				b.Fatal(err)
			}
			p.Runner = restoresTakenAsDone{f}
			versions := []*lb.ServicePort{snap.Ports.Get(one.Name), one}
			i := 0
			for b.Loop() {
				i++
				next := cur.With(map[lb.ServicePortName]*lb.ServicePort{one.Name: versions[i%2]}, nil)
				next.ID = cur.ID + 1
				cur = next
				if err := p.Sync(cur); err != nil {
					b.Fatal(err)
				}
			}
			if p.delta.deltas == 0 {
				b.Fatal("no sync was rendered from the delta")
			}
		})
		b.Run(fmt.Sprintf("sync-full-fake/%d", n), func(b *testing.B) {
			f := NewFake()
			p := &Proxier{Runner: f, Options: opts()}
			for b.Loop() {
				p.Invalidate()
				if err := p.Sync(snap); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("sync-partial-fake/%d", n), func(b *testing.B) {
			f := NewFake()
			p := &Proxier{Runner: f, Options: opts()}
			states := []*lb.Snapshot{snap, changed}
			if err := p.Sync(snap); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				i++
				if err := p.Sync(states[i%2]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// restoresTakenAsDone is a Runner whose restores do nothing: the cost of
// a sync without iptables-restore's.
type restoresTakenAsDone struct{ Runner }

func (restoresTakenAsDone) Restore([]byte) error { return nil }

// BenchmarkProxierHeldBytesPerPort is what the iptables proxier keeps per
// service port (10 endpoints each) once a full sync of 10,000 has applied,
// and once a partial sync from a delta has followed it: its port cache,
// fingerprints and order, which the next partial sync starts from (issue
// 16's memory budget). The Fake's copy of the tables is not counted.
func BenchmarkProxierHeldBytesPerPort(b *testing.B) {
	const n = 10000
	snap := bigSnapshot(n)
	one := *snap.Sorted()[n/2]
	one.Endpoints = one.Endpoints[1:]
	var full, partial float64
	for b.Loop() {
		cur := &lb.Snapshot{Ports: snap.Ports, ID: 1}
		before := heldHeap()
		f := NewFake()
		p := &Proxier{Runner: f, Options: opts()}
		if err := p.Sync(cur); err != nil {
			b.Fatal(err)
		}
		p.Runner = restoresTakenAsDone{}
		f = nil
		full = float64(heldHeap()-before) / n
		next := cur.With(map[lb.ServicePortName]*lb.ServicePort{one.Name: &one}, nil)
		next.ID = 2
		if err := p.Sync(next); err != nil {
			b.Fatal(err)
		}
		if p.delta.deltas != 1 {
			b.Fatal("the partial sync was not rendered from the delta")
		}
		partial = float64(heldHeap()-before) / n
		runtime.KeepAlive(p)
		runtime.KeepAlive(next)
	}
	b.ReportMetric(full, "B/port-full")
	b.ReportMetric(partial, "B/port-partial")
}

func heldHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
