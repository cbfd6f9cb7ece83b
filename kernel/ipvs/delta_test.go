package ipvs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/lb"
)

// countingKernel counts the calls a sync makes and, while failReals is
// set, refuses to add real servers.
type countingKernel struct {
	*Fake
	calls     map[string]int
	failReals bool
}

func newCountingKernel() *countingKernel {
	return &countingKernel{Fake: NewFake(), calls: map[string]int{}}
}

func (k *countingKernel) Services() ([]Service, error) {
	k.calls["Services"]++
	return k.Fake.Services()
}
func (k *countingKernel) Reals(key Key) ([]Real, error) {
	k.calls["Reals"]++
	return k.Fake.Reals(key)
}
func (k *countingKernel) AddService(s Service) error {
	k.calls["AddService"]++
	return k.Fake.AddService(s)
}
func (k *countingKernel) DeleteService(key Key) error {
	k.calls["DeleteService"]++
	return k.Fake.DeleteService(key)
}
func (k *countingKernel) AddReal(key Key, r Real) error {
	k.calls["AddReal"]++
	if k.failReals {
		return errors.New("injected failure")
	}
	return k.Fake.AddReal(key, r)
}

// deltaPort is a random service port s<j>/<pn>: TCP or UDP, sometimes a
// NodePort, an external IP shared with other ports, affinity, Local
// policy, and one to three of four endpoints.
func deltaPort(rng *rand.Rand, j int, pn string) *lb.ServicePort {
	proto := []lb.Protocol{lb.TCP, lb.UDP}[rng.IntN(2)]
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", j), Port: pn, Protocol: proto},
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)})}, Port: 80}
	if pn == "b" {
		sp.Port = 443
	}
	if rng.IntN(3) == 0 {
		sp.NodePort = uint16(30000 + 2*j)
		if pn == "b" {
			sp.NodePort++
		}
	}
	if rng.IntN(3) == 0 { // shared by several ports: bound while any has it
		sp.SetExternalIPs([]netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(rng.IntN(2) + 1)})})
		sp.Port = uint16(8000 + 2*j)
		if pn == "b" {
			sp.Port++
		}
	}
	if rng.IntN(4) == 0 { // a load balancer, sometimes guarded; the node is in one range
		sp.SetLoadBalancerIPs([]netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(rng.IntN(2) + 1)})})
		if rng.IntN(2) == 0 {
			sp.SetSourceRanges([]netip.Prefix{[]netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("172.16.0.0/12")}[rng.IntN(2)]})
		}
	}
	if rng.IntN(5) == 0 {
		sp.HealthCheckNodePort = uint16(32000 + rng.IntN(3))
	}
	if rng.IntN(6) == 0 { // the other port's cluster IP and port: two ports, one virtual server
		sp.ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte((j+1)%8 + 1)})}
	}
	sp.Affinity = lb.Affinity{ClientIP: rng.IntN(3) == 0, Timeout: time.Duration(rng.IntN(3)+1) * time.Hour}
	sp.ExternalLocal = rng.IntN(4) == 0
	for e := range 4 {
		if rng.IntN(2) == 0 || e == 0 {
			sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(e + 1)}), 8080),
				Ready: true, Serving: true, Local: e%2 == 0})
		}
	}
	return sp
}

// randomChange is the snapshot after cur: up to three random ports set
// anew, deleted (one time in four, when they exist) or set as an equal
// copy (one time in copyOneIn).
func randomChange(rng *rand.Rand, cur *lb.Snapshot, copyOneIn int) *lb.Snapshot {
	set := map[lb.ServicePortName]*lb.ServicePort{}
	var del []lb.ServicePortName
	for k := rng.IntN(3); k >= 0; k-- {
		sp := deltaPort(rng, rng.IntN(8), []string{"a", "b"}[rng.IntN(2)])
		switch old := cur.Ports.Get(sp.Name); {
		case old != nil && rng.IntN(4) == 0:
			del = append(del, sp.Name)
		case old != nil && rng.IntN(copyOneIn) == 0:
			c := *old
			set[sp.Name] = &c
		default:
			set[sp.Name] = sp
		}
	}
	next := cur.With(set, del)
	next.ID = cur.ID + 1
	return next
}

// Syncs told what changed leave the table, the bound addresses and the
// draining queue that syncs comparing everything leave, through random
// changes, skipped snapshots, shared virtual servers and addresses,
// connections on removed real servers and failed syncs; and a one-port
// change lists no virtual servers and only its own real servers.
func TestSyncChangedLeavesWhatSyncLeaves(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	partials := 0
	for round := range 8 {
		kd, kc := newCountingKernel(), newCountingKernel()
		pd := &Proxier{Kernel: kd, Options: opts()}
		pc := &Proxier{Kernel: kc, Options: opts()}
		bound := map[netip.Addr]bool{}
		ports := map[lb.ServicePortName]*lb.ServicePort{}
		for j := range 6 {
			for _, pn := range []string{"a", "b"} {
				sp := deltaPort(rng, j, pn)
				ports[sp.Name] = sp
			}
		}
		cur := lb.NewSnapshot(ports)
		cur.ID = 1
		for step := range 40 {
			cur = randomChange(rng, cur, 4)
			if rng.IntN(8) == 0 {
				continue // never applied
			}
			// Connections on some real servers, the same in both tables.
			svcs, _ := kc.Fake.Services()
			for _, s := range svcs {
				rs, _ := kc.Fake.Reals(s.Key)
				for _, r := range rs {
					n := rng.IntN(2)
					kc.SetConns(s.Key, r.Addr, n, 0)
					kd.SetConns(s.Key, r.Addr, n, 0)
				}
			}
			fail := rng.IntN(10) == 0
			kd.failReals, kc.failReals = fail, fail
			clear(kd.calls)
			bc, errd := pd.SyncChanged(cur)
			want, errc := pc.Sync(&lb.Snapshot{Ports: cur.Ports})
			if bc.Full {
				clear(bound)
				for _, a := range bc.All {
					bound[a] = true
				}
			} else {
				partials++
				for _, a := range bc.Del {
					delete(bound, a)
				}
				for _, a := range bc.Add {
					bound[a] = true
				}
				if kd.calls["Services"] != 0 {
					t.Fatalf("round %d step %d: a sync told what changed listed every virtual server", round, step)
				}
			}
			if errc != nil {
				if errd == nil && bc.Full {
					t.Fatalf("round %d step %d: compared failed (%v), with delta did not", round, step, errc)
				}
				continue
			}
			if errd != nil {
				t.Fatalf("round %d step %d: with delta failed: %v", round, step, errd)
			}
			if kd.Dump() != kc.Dump() {
				t.Fatalf("round %d step %d (full %v):\n%s\nwant\n%s", round, step, bc.Full, kd.Dump(), kc.Dump())
			}
			got := slices.Collect(func(yield func(netip.Addr) bool) {
				for a := range bound {
					if !yield(a) {
						return
					}
				}
			})
			slices.SortFunc(got, netip.Addr.Compare)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d step %d: bound %v, want %v", round, step, got, want)
			}
			if fmt.Sprint(pd.Draining()) != fmt.Sprint(pc.Draining()) {
				t.Fatalf("round %d step %d: draining %v, want %v", round, step, pd.Draining(), pc.Draining())
			}
		}
	}
	if partials < 100 {
		t.Fatalf("only %d syncs were told what changed", partials)
	}
}

// At 1,000 Services a one-endpoint change lists no virtual server and
// the real servers of the changed port's virtual servers only, where a
// full comparison lists every virtual server's.
func TestSyncChangedWorkIsTheChange(t *testing.T) {
	k := newCountingKernel()
	p := &Proxier{Kernel: k, Options: opts()}
	ports := map[lb.ServicePortName]*lb.ServicePort{}
	for j := range 1000 {
		sp := port(fmt.Sprintf("s%d", j), netip.AddrFrom4([4]byte{10, 96, byte(j >> 8), byte(j)}).String(), lb.TCP, "10.244.0.1:8080", "10.244.0.2:8080")
		sp.NodePort = uint16(30000 + j)
		ports[sp.Name] = sp
	}
	cur := lb.NewSnapshot(ports)
	cur.ID = 1
	if bc, err := p.SyncChanged(cur); err != nil || !bc.Full || k.calls["Reals"] != 2000 {
		t.Fatalf("first sync: full %v, %v, %d real-server listings (want full, 2000)", bc.Full, err, k.calls["Reals"])
	}
	name := lb.ServicePortName{Namespace: "ns", Name: "s7", Port: "p", Protocol: lb.TCP}
	sp := *cur.Ports.Get(name)
	sp.Endpoints = sp.Endpoints[:1]
	next := cur.With(map[lb.ServicePortName]*lb.ServicePort{name: &sp}, nil)
	next.ID = 2
	clear(k.calls)
	bc, err := p.SyncChanged(next)
	if err != nil || bc.Full {
		t.Fatalf("one-port change: full %v, %v", bc.Full, err)
	}
	if k.calls["Services"] != 0 || k.calls["Reals"] != 2 { // the ClusterIP's and the NodePort's
		t.Fatalf("one-port change made %v", k.calls)
	}
	if d := k.Dump(); !strings.Contains(d, "10.96.0.7:80/TCP rr flags=0x0 timeout=0\n  -> 10.244.0.1:8080 weight 1\n10.") {
		t.Fatalf("the change is not in the table:\n%s", d[:min(len(d), 2000)])
	}
	// New node IPs: every NodePort's virtual servers change, so compare all.
	p.Options.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.0.3")}
	if bc, err := p.SyncChanged(next); err != nil || !bc.Full {
		t.Fatalf("after a node IP change: full %v, %v", bc.Full, err)
	}
	p.Invalidate()
	if bc, err := p.SyncChanged(next); err != nil || !bc.Full {
		t.Fatalf("after Invalidate: full %v, %v", bc.Full, err)
	}
}

// An external IP one port gives up and another takes in the same change
// stays bound: it is neither added nor deleted.
func TestSyncChangedKeepsAnAddressMovedBetweenPorts(t *testing.T) {
	p := &Proxier{Kernel: NewFake(), Options: opts()}
	eip := netip.MustParseAddr("203.0.113.7")
	a := port("a", "10.96.0.1", lb.TCP, "10.244.0.1:8080")
	b := port("b", "10.96.0.2", lb.TCP, "10.244.0.2:8080")
	b.Port = 81 // not a's virtual server on the external IP
	a.SetExternalIPs([]netip.Addr{eip})
	cur := snap(a, b)
	cur.ID = 1
	if bc, err := p.SyncChanged(cur); err != nil || !slices.Contains(bc.All, eip) {
		t.Fatalf("first sync: %+v %v", bc, err)
	}
	a2, b2 := *a, *b
	a2.SetExternalIPs(nil)
	b2.SetExternalIPs([]netip.Addr{eip})
	next := cur.With(map[lb.ServicePortName]*lb.ServicePort{a.Name: &a2, b.Name: &b2}, nil)
	next.ID = 2
	bc, err := p.SyncChanged(next)
	if err != nil || bc.Full || slices.Contains(bc.Del, eip) {
		t.Fatalf("moved address: %+v %v; want it kept", bc, err)
	}
	next2 := next.With(nil, []lb.ServicePortName{b.Name})
	next2.ID = 3
	if bc, err := p.SyncChanged(next2); err != nil || bc.Full || !slices.Equal(bc.Del, []netip.Addr{netip.MustParseAddr("10.96.0.2"), eip}) {
		t.Fatalf("last holder gone: %+v %v; want the address and b's cluster IP deleted", bc, err)
	}
}

// Set syncs told what changed, fed the bind changes of proxier syncs told
// what changed (as the IPVS plane feeds them), leave every set as syncs
// writing everything leave it, through failed restores too; and a change
// that changes no entry runs no ipset at all.
func TestNetfilterSyncChangedLeavesWhatSyncLeaves(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	partials, silent := 0, 0
	for round := range 8 {
		px := &Proxier{Kernel: NewFake(), Options: opts()}
		setsD, setsC := &countingSets{FakeIPSet: NewFakeIPSet()}, NewFakeIPSet()
		nd := &Netfilter{Sets: setsD, IPTables: iptables.NewFake(), MasqueradeBit: 14}
		nc := &Netfilter{Sets: setsC, IPTables: iptables.NewFake(), MasqueradeBit: 14}
		bound := map[netip.Addr]bool{}
		ports := map[lb.ServicePortName]*lb.ServicePort{}
		for j := range 6 {
			sp := deltaPort(rng, j, "a")
			ports[sp.Name] = sp
		}
		cur := lb.NewSnapshot(ports)
		cur.ID = 1
		for step := range 40 {
			cur = randomChange(rng, cur, 3)
			if rng.IntN(8) == 0 {
				continue
			}
			bc, err := px.SyncChanged(cur)
			if err != nil {
				t.Fatal(err)
			}
			if bc.Full {
				clear(bound)
			}
			for _, a := range slices.Concat(bc.All, bc.Add) {
				bound[a] = true
			}
			for _, a := range bc.Del {
				delete(bound, a)
			}
			all := func() []netip.Addr {
				var out []netip.Addr
				for a := range bound {
					out = append(out, a)
				}
				slices.SortFunc(out, netip.Addr.Compare)
				return out
			}
			setsD.fail = rng.IntN(10) == 0
			restores := setsD.restores
			full, errd := nd.SyncChanged(cur, px.Options, bc, all)
			if errd != nil {
				if !setsD.fail {
					t.Fatalf("round %d step %d: %v", round, step, errd)
				}
				continue
			}
			if err := nc.Sync(&lb.Snapshot{Ports: cur.Ports}, px.Options, all()); err != nil {
				t.Fatal(err)
			}
			if !full {
				partials++
				if setsD.restores == restores {
					silent++
				}
			}
			for _, st := range setTypes {
				if got, want := setsD.Entries(st.Name), setsC.Entries(st.Name); !slices.Equal(got, want) {
					t.Fatalf("round %d step %d (full %v): %s = %v, want %v", round, step, full, st.Name, got, want)
				}
			}
			// The rules too, which follow the sets that hold entries.
			if got, want := nd.IPTables.(*iptables.Fake).Dump(), nc.IPTables.(*iptables.Fake).Dump(); got != want {
				t.Fatalf("round %d step %d (full %v): rules\n%s\nwant\n%s", round, step, full, got, want)
			}
		}
	}
	if partials < 100 || silent == 0 {
		t.Fatalf("%d set syncs told what changed, %d of them with nothing to write", partials, silent)
	}
}

// countingSets counts restores and, while fail is set, refuses them.
type countingSets struct {
	*FakeIPSet
	restores int
	fail     bool
}

func (c *countingSets) Restore(data []byte) error {
	c.restores++
	if c.fail {
		return errors.New("injected failure")
	}
	return c.FakeIPSet.Restore(data)
}
