package conntrack

import (
	"net/netip"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

func udpPort(eps ...string) *lb.ServicePort {
	sp := &lb.ServicePort{
		Name:       lb.ServicePortName{Namespace: "demo", Name: "dns", Port: "dns", Protocol: lb.UDP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		External:   lb.NewExternalAddrs([]netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil, nil),
		Port:       53,
		NodePort:   30053,
	}
	for _, e := range eps {
		sp.Endpoints = append(sp.Endpoints, lb.Endpoint{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort(e)), Ready: true, Serving: true})
	}
	return sp
}

func sctpPort(eps ...string) *lb.ServicePort {
	sp := udpPort(eps...)
	sp.Name.Protocol = lb.SCTP
	return sp
}

func snap(ports ...*lb.ServicePort) *lb.Snapshot {
	sPorts := map[lb.ServicePortName]*lb.ServicePort{}
	for _, p := range ports {
		sPorts[p.Name] = p
	}
	return lb.NewSnapshot(sPorts)
}

func flow(dst, reply string) Flow {
	return Flow{Proto: ProtoUDP, OrigSrc: netip.MustParseAddrPort("192.168.10.2:40000"),
		OrigDst: netip.MustParseAddrPort(dst), ReplySrc: netip.MustParseAddrPort(reply)}
}

func TestStaleFlows(t *testing.T) {
	node := netip.MustParseAddr("192.168.10.1")
	isLocal := func(a netip.Addr) bool { return a == node }
	cases := []struct {
		name  string
		snap  *lb.Snapshot
		flow  Flow
		stale bool
	}{
		{"to a live endpoint", snap(udpPort("10.244.0.6:5353")), flow("10.96.0.10:53", "10.244.0.6:5353"), false},
		{"to a removed endpoint", snap(udpPort("10.244.0.6:5353")), flow("10.96.0.10:53", "10.244.0.5:5353"), true},
		{"endpoint's target port changed", snap(udpPort("10.244.0.6:5354")), flow("10.96.0.10:53", "10.244.0.6:5353"), true},
		{"external IP to a removed endpoint", snap(udpPort("10.244.0.6:5353")), flow("203.0.113.10:53", "10.244.0.5:5353"), true},
		{"NodePort to a removed endpoint", snap(udpPort("10.244.0.6:5353")), flow("192.168.10.1:30053", "10.244.0.5:5353"), true},
		{"NodePort on a non-local address", snap(udpPort("10.244.0.6:5353")), flow("192.168.99.1:30053", "10.244.0.5:5353"), false},
		{"untranslated, endpoints now exist", snap(udpPort("10.244.0.6:5353")), flow("10.96.0.10:53", "10.96.0.10:53"), true},
		{"untranslated, still no endpoints", snap(udpPort()), flow("10.96.0.10:53", "10.96.0.10:53"), false},
		{"service gone: not ours to judge", snap(), flow("10.96.0.10:53", "10.244.0.5:5353"), false},
		{"another port of the VIP", snap(udpPort("10.244.0.6:5353")), flow("10.96.0.10:54", "10.244.0.5:5353"), false},
		{"SCTP to a removed endpoint", snap(sctpPort("10.244.0.6:5353")), Flow{Proto: ProtoSCTP, OrigDst: netip.MustParseAddrPort("10.96.0.10:53"), ReplySrc: netip.MustParseAddrPort("10.244.0.5:5353")}, true},
		{"UDP flow to an SCTP-only port", snap(sctpPort("10.244.0.6:5353")), flow("10.96.0.10:53", "10.244.0.5:5353"), false},
		{"TCP is never touched", snap(udpPort("10.244.0.6:5353")), Flow{Proto: 6, OrigDst: netip.MustParseAddrPort("10.96.0.10:53"), ReplySrc: netip.MustParseAddrPort("10.244.0.5:5353")}, false},
	}
	for _, c := range cases {
		if got := Stale(c.snap, isLocal)(c.flow); got != c.stale {
			t.Errorf("%s: stale=%v, want %v", c.name, got, c.stale)
		}
	}
}

func TestFakeDeletesOnlyMatching(t *testing.T) {
	f := &Fake{Flows: []Flow{flow("10.96.0.10:53", "10.244.0.5:5353"), flow("10.96.0.10:53", "10.244.0.6:5353")}}
	n, err := f.DeleteMatching(Stale(snap(udpPort("10.244.0.6:5353")), nil))
	if err != nil || n != 1 || len(f.Flows) != 1 || f.Flows[0].ReplySrc.Addr().String() != "10.244.0.6" {
		t.Fatalf("deleted %d (%v), left %v", n, err, f.Flows)
	}
}
