package ipvs

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/lb"
)

// bytesSets counts the ipset restore input written.
type bytesSets struct {
	*FakeIPSet
	bytes int
}

func (b *bytesSets) Restore(data []byte) error {
	b.bytes += len(data)
	return b.FakeIPSet.Restore(data)
}

// BenchmarkSyncAt10k is one endpoint change of one of 10,000 Services
// (ClusterIP and NodePort, 10 endpoints each) synced by the IPVS proxier
// and its sets: comparing everything (full) against being told what
// changed (changed). Beside the time on the fakes it reports the work the
// kernel would see: netlink calls and ipset restore input per sync.
func BenchmarkSyncAt10k(b *testing.B) {
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for j := range 10000 {
		sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", j), Port: "p", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(j >> 8), byte(j)})}, Port: 80, NodePort: uint16(30000 + j)}
		for e := range 10 {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 244, byte(j >> 8), byte(j)}), uint16(8000+e)), Ready: true, Serving: true})
		}
		ports[sp.Name] = sp
	}
	for _, mode := range []string{"full", "changed"} {
		b.Run(mode, func(b *testing.B) {
			k := newCountingKernel()
			sets := &bytesSets{FakeIPSet: NewFakeIPSet()}
			p := &Proxier{Kernel: k, Options: opts()}
			nf := &Netfilter{Sets: sets, IPTables: iptables.NewFake(), MasqueradeBit: 14}
			cur := lb.NewSnapshot(ports)
			cur.ID = 1
			bind, err := p.Sync(cur)
			if err != nil {
				b.Fatal(err)
			}
			if err := nf.Sync(cur, p.Options, bind); err != nil {
				b.Fatal(err)
			}
			name := lb.ServicePortName{Namespace: "ns", Name: "s4321", Port: "p", Protocol: lb.TCP}
			clear(k.calls)
			sets.bytes = 0
			i := 0
			for b.Loop() {
				sp := *cur.Ports.Get(name)
				sp.Endpoints = ports[name].Endpoints[:9+i%2] // one endpoint goes and comes back
				i++
				next := cur.With(map[lb.ServicePortName]*lb.ServicePort{name: &sp}, nil)
				next.ID = cur.ID + 1
				cur = next
				if mode == "full" {
					bind, err := p.Sync(cur)
					if err != nil {
						b.Fatal(err)
					}
					if err := nf.Sync(cur, p.Options, bind); err != nil {
						b.Fatal(err)
					}
					continue
				}
				bc, err := p.SyncChanged(cur)
				if err != nil || bc.Full {
					b.Fatalf("full %v, %v", bc.Full, err)
				}
				if full, err := nf.SyncChanged(cur, p.Options, bc, nil); err != nil || full {
					b.Fatalf("sets: full %v, %v", full, err)
				}
			}
			calls := 0
			for _, n := range k.calls {
				calls += n
			}
			b.ReportMetric(float64(calls)/float64(b.N), "netlink-calls/op")
			b.ReportMetric(float64(sets.bytes)/float64(b.N), "ipset-bytes/op")
		})
	}
}
