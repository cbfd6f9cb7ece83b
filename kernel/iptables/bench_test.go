package iptables

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// bigSnapshot is n services with 10 ready endpoints each.
func bigSnapshot(n int) *lb.Snapshot {
	s := &lb.Snapshot{Ports: map[lb.ServicePortName]*lb.ServicePort{}}
	for i := 0; i < n; i++ {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}, Port: 80, NodePort: uint16(30000 + i%2768)}
		for j := 0; j < 10; j++ {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>12), byte(i >> 4), byte(j + 16*(i&15))}), 8080), Ready: true, Serving: true})
		}
		s.Ports[sp.Name] = sp
	}
	return s
}

// The sync benchmark of the iptables mode (make bench-sync): a full render,
// and a full render plus apply to the stateful Fake (which parses and
// validates like iptables-restore), at 1k and 10k services x 10 endpoints.
// Every sync is full today; there is no partial sync to compare with yet.
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		snap := bigSnapshot(n)
		b.Run(fmt.Sprintf("render/%d", n), func(b *testing.B) {
			for b.Loop() {
				Render(snap, opts())
			}
		})
		b.Run(fmt.Sprintf("render+apply-fake/%d", n), func(b *testing.B) {
			f := NewFake()
			p := &Proxier{Runner: f, Options: opts()}
			for b.Loop() {
				if err := p.Sync(snap); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
