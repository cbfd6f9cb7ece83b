//go:build linux

package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// runsTakenAsDone is an Interface whose transactions do nothing: the cost
// of a sync without the kernel's (or the Fake's).
type runsTakenAsDone struct{ knftables.Interface }

func (runsTakenAsDone) Run(context.Context, *knftables.Transaction) error { return nil }

// benchPorts is n services of 10 endpoints each, one port each.
func benchPorts(n int) map[lb.ServicePortName]*lb.ServicePort {
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for i := range n {
		sp := &lb.ServicePort{Name: spn("bench", fmt.Sprintf("svc-%d", i), "p"), ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Port: 80, NodePort: uint16(30000 + i%2768)}
		for j := range 10 {
			sp.Endpoints = append(sp.Endpoints, ep(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>12), byte(i >> 4), byte(j + 16*(i&15))}), 8080).String()))
		}
		ports[sp.Name] = sp
	}
	return ports
}

// BenchmarkProxierHeldBytesPerPort is what the nftables proxier keeps per
// service port (10 endpoints each) once a full sync of 10,000 has applied,
// and once a partial sync from a delta has followed it: what the next
// partial sync compares against (issue 16's memory budget). The Fake's
// copy of the table is not counted.
func BenchmarkProxierHeldBytesPerPort(b *testing.B) {
	const n = 10000
	ctx := context.Background()
	ports := benchPorts(n)
	base := lb.NewSnapshot(ports)
	base.ID = 1
	name := spn("bench", fmt.Sprintf("svc-%d", n/2), "p")
	moved := *base.Ports.Get(name)
	moved.Endpoints = moved.Endpoints[1:]
	var full, partial float64
	for b.Loop() {
		before := heldHeap()
		p := &Proxier{NFT: knftables.NewFake(knftables.IPv4Family, Table), Options: opts()}
		if err := p.Sync(ctx, base); err != nil {
			b.Fatal(err)
		}
		p.NFT = runsTakenAsDone{knftables.NewFake(knftables.IPv4Family, Table)} // an empty one
		full = float64(heldHeap()-before) / n
		next := base.With(map[lb.ServicePortName]*lb.ServicePort{name: &moved}, nil)
		next.ID = 2
		if st, err := p.SyncStats(ctx, next); err != nil || st.Full || st.Changed != 1 || p.deltas != 1 {
			b.Fatalf("%+v %v, %d from the delta", st, err, p.deltas)
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

// A one-Service partial sync at 1k and 10k services x 10 endpoints, the
// transaction taken as done: comparing every port (the snapshots carry no
// delta) and from the snapshot's delta.
func BenchmarkPartialSync(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1000, 10000} {
		base := lb.NewSnapshot(benchPorts(n))
		base.ID = 1
		name := spn("bench", fmt.Sprintf("svc-%d", n/2), "p")
		moved := *base.Ports.Get(name)
		moved.Endpoints = moved.Endpoints[1:]
		versions := []*lb.ServicePort{base.Ports.Get(name), &moved}
		for _, withDelta := range []bool{false, true} {
			what := "compare-all"
			if withDelta {
				what = "delta"
			}
			b.Run(fmt.Sprintf("%s/%d", what, n), func(b *testing.B) {
				p := &Proxier{NFT: knftables.NewFake(knftables.IPv4Family, Table), Options: opts()}
				if err := p.Sync(ctx, base); err != nil {
					b.Fatal(err)
				}
				p.NFT = runsTakenAsDone{p.NFT}
				cur, i := base, 0
				for b.Loop() {
					i++
					next := cur.With(map[lb.ServicePortName]*lb.ServicePort{name: versions[i%2]}, nil)
					next.ID = cur.ID + 1
					cur = next
					s := cur
					if !withDelta {
						s = &lb.Snapshot{Ports: cur.Ports}
					}
					if st, err := p.SyncStats(ctx, s); err != nil || st.Full || st.Changed != 1 {
						b.Fatalf("%+v %v", st, err)
					}
				}
				if withDelta != (p.deltas > 0) {
					b.Fatalf("%d syncs from the delta", p.deltas)
				}
			})
		}
	}
}
