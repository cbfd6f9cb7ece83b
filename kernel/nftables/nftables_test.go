//go:build linux

package nftables

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/kernel/localtraffic"
	"github.com/sluice-proxy/sluice/lb"
)

func spn(ns, name, port string) lb.ServicePortName {
	return lb.ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: lb.TCP}
}

// kube-proxy's chain names, from its own test vectors.
func TestChainNamesAreKubeProxys(t *testing.T) {
	n := spn("ns1", "svc1", "p80")
	if got := ServiceChain(n); got != "service-ULMVA6XW-ns1/svc1/tcp/p80" {
		t.Fatalf("service chain %s", got)
	}
	if got := EndpointChain(n, netip.MustParseAddrPort("10.180.0.1:80")); got != "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80" {
		t.Fatalf("endpoint chain %s", got)
	}
}

func ep(s string) lb.Endpoint {
	return lb.Endpoint{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort(s)), Ready: true, Serving: true}
}

func port(name, cip string, eps ...lb.Endpoint) *lb.ServicePort {
	return &lb.ServicePort{Name: spn("ns", name, "p"), ClusterIPs: []netip.Addr{netip.MustParseAddr(cip)}, Port: 80, Endpoints: eps}
}

func snapOf(ports ...*lb.ServicePort) *lb.Snapshot {
	sPorts := map[lb.ServicePortName]*lb.ServicePort{}
	for _, p := range ports {
		sPorts[p.Name] = p
	}
	return lb.NewSnapshot(sPorts)
}

func opts() Options {
	return Options{MasqueradeBit: 14, Local: localtraffic.ByCIDR(netip.MustParsePrefix("10.244.0.0/16"))}
}

// One sync lays out kube-proxy's table: the verdict maps point each
// service's address and port at its chain, the chain picks an endpoint
// with numgen, a service without endpoints is rejected through
// no-endpoint-services, and a NodePort goes through its external chain.
func TestSyncLaysOutTheTable(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	p := &Proxier{NFT: fake, Options: opts()}
	web := port("web", "10.96.0.10", ep("10.244.1.1:8080"), ep("10.244.1.2:8080"))
	web.NodePort = 30080
	empty := port("empty", "10.96.0.12")
	if err := p.Sync(context.Background(), snapOf(web, empty)); err != nil {
		t.Fatal(err)
	}
	dump := fake.Dump()
	svc, ext := ServiceChain(web.Name), externalChain(web.Name)
	for _, want := range []string{
		"add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto " + svc + " }",
		"add element ip kube-proxy service-nodeports { tcp . 30080 : goto " + ext + " }",
		`add element ip kube-proxy no-endpoint-services { 10.96.0.12 . tcp . 80 comment "ns/empty:p" : goto reject-chain }`,
		"add element ip kube-proxy cluster-ips { 10.96.0.10 }",
		"add rule ip kube-proxy " + svc + " ip daddr 10.96.0.10 ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
		"add rule ip kube-proxy " + svc + " numgen random mod 2 vmap { 0 : goto " + EndpointChain(web.Name, netip.MustParseAddrPort("10.244.1.1:8080")) + " , 1 : goto " + EndpointChain(web.Name, netip.MustParseAddrPort("10.244.1.2:8080")) + " }",
		"add rule ip kube-proxy " + EndpointChain(web.Name, netip.MustParseAddrPort("10.244.1.1:8080")) + " meta l4proto tcp dnat to 10.244.1.1:8080",
		"add rule ip kube-proxy " + ext + " jump mark-for-masquerade",
		"add rule ip kube-proxy masquerading masquerade fully-random",
		"add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
	} {
		if !strings.Contains(dump, want+"\n") {
			t.Errorf("missing: %s", want)
		}
	}
	if t.Failed() {
		t.Logf("table:\n%s", dump)
	}
}

// A service that goes away takes its chains with it; an affinity
// service's per-endpoint sets carry the timeout and go with it too.
func TestSyncDeletesWhatIsNoLongerUsed(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	p := &Proxier{NFT: fake, Options: opts()}
	sticky := port("sticky", "10.96.0.11", ep("10.244.1.1:8080"))
	sticky.Affinity = lb.Affinity{ClientIP: true, Timeout: 3 * time.Hour}
	web := port("web", "10.96.0.10", ep("10.244.1.1:8080"))
	ctx := context.Background()
	if err := p.Sync(ctx, snapOf(sticky, web)); err != nil {
		t.Fatal(err)
	}
	set := affinitySet(sticky.Name, netip.MustParseAddrPort("10.244.1.1:8080"))
	dump := fake.Dump()
	if !strings.Contains(dump, "add set ip kube-proxy "+set+" { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }") {
		t.Fatalf("affinity set:\n%s", dump)
	}
	// A fresh proxier (a restart) lists what is there before it deletes.
	p2 := &Proxier{NFT: fake, Options: opts()}
	if err := p2.Sync(ctx, snapOf(web)); err != nil {
		t.Fatal(err)
	}
	settle(t, p2, fake, snapOf(web))
	dump = fake.Dump()
	for _, gone := range []string{ServiceChain(sticky.Name), EndpointChain(sticky.Name, netip.MustParseAddrPort("10.244.1.1:8080")), set} {
		if strings.Contains(dump, gone) {
			t.Fatalf("%s still there:\n%s", gone, dump)
		}
	}
	if !strings.Contains(dump, ServiceChain(web.Name)) {
		t.Fatal("the remaining service's chain went too")
	}
	if err := Cleanup(ctx, fake); err != nil {
		t.Fatal(err)
	}
	if d := fake.Dump(); strings.Contains(d, "kube-proxy") {
		t.Fatalf("after cleanup:\n%s", d)
	}
}

// states are random service sets: ports come and go, endpoints change,
// two ports of one service share its cluster IP, affinity and NodePorts
// and externalTrafficPolicy Local come and go.
func states(rng *rand.Rand, n int) []*lb.Snapshot {
	var out []*lb.Snapshot
	for i := 0; i < n; i++ {
		var ports []*lb.ServicePort
		for j := 0; j < 5; j++ {
			if rng.IntN(5) == 0 {
				continue
			}
			var eps []lb.Endpoint
			for k := 0; k < rng.IntN(4); k++ {
				e := ep(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(1 + rng.IntN(4))}), 8080).String())
				e.Local = rng.IntN(2) == 0
				if !slices.ContainsFunc(eps, func(x lb.Endpoint) bool { return x.Addr == e.Addr }) {
					eps = append(eps, e)
				}
			}
			for _, pn := range []string{"a", "b"}[:1+j%2] {
				sp := &lb.ServicePort{Name: spn("ns", fmt.Sprintf("s%d", j), pn), ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)})},
					Port: uint16(80 + len(pn)*int(pn[0]-'a')), Endpoints: eps}
				if rng.IntN(2) == 0 {
					sp.NodePort = uint16(30000 + j*2 + int(pn[0]-'a'))
					sp.ExternalLocal = rng.IntN(2) == 0
				}
				if rng.IntN(3) == 0 {
					sp.Affinity = lb.Affinity{ClientIP: true, Timeout: time.Duration(1+rng.IntN(2)) * time.Hour}
				}
				ports = append(ports, sp)
			}
		}
		out = append(out, snapOf(ports...))
	}
	return out
}

// One long-lived proxier syncs random states, mostly partially; after
// every sync its table equals what a fresh full sync of that state makes,
// and no sync deletes a chain the table referred to when it began.
func TestPartialSyncsConverge(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	ctx := context.Background()
	partial := 0
	for round := 0; round < 8; round++ {
		fake := &busyNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)} // as a kernel before 6.2
		// Its first sync goes in batches (FullSyncBatch), the fresh ones.
		// in one transaction.
		p := &Proxier{NFT: fake, Options: opts(), FullSyncBatch: 1 + round%3}
		for step, s := range states(rng, 12) {
			st, err := p.SyncStats(ctx, s)
			if err != nil {
				t.Fatalf("round %d step %d: %v", round, step, err)
			}
			if !st.Full {
				partial++
			}
			fresh := knftables.NewFake(knftables.IPv4Family, Table)
			if err := (&Proxier{NFT: fresh, Options: opts(), FullSyncBatch: -1}).Sync(ctx, s); err != nil {
				t.Fatal(err)
			}
			if got, want := settle(t, p, fake, s), normalized(fresh.Dump()); got != want {
				t.Fatalf("round %d step %d (full=%v): the table differs from a full sync's:\n%s\nwant:\n%s", round, step, st.Full, got, want)
			}
		}
	}
	if partial < 50 {
		t.Fatalf("only %d partial syncs", partial)
	}
}

// A partial sync that changes one endpoint writes that port alone.
func TestAPartialSyncWritesOnlyWhatChanged(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	p := &Proxier{NFT: fake, Options: opts()}
	ctx := context.Background()
	a := port("a", "10.96.0.1", ep("10.244.1.1:80"))
	b := port("b", "10.96.0.2", ep("10.244.2.1:80"))
	if st, err := p.SyncStats(ctx, snapOf(a, b)); err != nil || !st.Full {
		t.Fatalf("first: %+v %v", st, err)
	}
	b2 := port("b", "10.96.0.2", ep("10.244.2.2:80"))
	st, err := p.SyncStats(ctx, snapOf(a, b2))
	if err != nil || st.Full || st.Changed != 1 {
		t.Fatalf("second: %+v %v; want a partial sync of one port", st, err)
	}
	if st, err := p.SyncStats(ctx, snapOf(a, b2)); err != nil || st.Changed != 0 {
		t.Fatalf("unchanged: %+v %v; want nothing written", st, err)
	}
}

// normalized is a table dump in an order that does not depend on the
// order objects were added in (the kernel's sets and maps have none): the
// rules of each chain keep their order, everything else is sorted.
func normalized(dump string) string {
	rules := map[string][]string{}
	var other []string
	for _, l := range strings.Split(strings.TrimSpace(dump), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[0] == "add" && f[1] == "rule" {
			rules[f[4]] = append(rules[f[4]], l)
			continue
		}
		other = append(other, l)
	}
	slices.Sort(other)
	chains := slices.Sorted(maps.Keys(rules))
	for _, c := range chains {
		other = append(other, rules[c]...)
	}
	return strings.Join(other, "\n")
}

// Only the per-service objects count as stale candidates: the static
// chains share their prefixes (service-endpoints-check, firewall-check)
// and a restart's full sync once deleted them.
func TestStaticChainsAreNotServiceObjects(t *testing.T) {
	for _, c := range []string{chainServiceEPCheck, chainFirewallCheck, chainServices, chainReject, "service-", "endpoint-x"} {
		if isServiceObject(c) {
			t.Errorf("%s taken for a per-service object", c)
		}
	}
	n := spn("ns1", "svc1", "p80")
	for _, c := range []string{ServiceChain(n), localChain(n), externalChain(n), firewallChain(n), EndpointChain(n, netip.MustParseAddrPort("10.0.0.1:80")), affinitySet(n, netip.MustParseAddrPort("10.0.0.1:80"))} {
		if !isServiceObject(c) {
			t.Errorf("%s not taken for a per-service object", c)
		}
	}
}

// The whole table matches kube-proxy's for the same services, line for
// line (upstream's
// TestOverallNFTablesRules vectors: a ClusterIP service; a LoadBalancer with
// externalTrafficPolicy Local whose one endpoint is on another node; a
// LoadBalancer with source ranges and ClientIP affinity; a service with
// no endpoints).
func TestRulesMatchKubeProxys(t *testing.T) {
	mk := func(ns, name, cip string, eps ...lb.Endpoint) *lb.ServicePort {
		return &lb.ServicePort{Name: lb.ServicePortName{Namespace: ns, Name: name, Port: "p80", Protocol: lb.TCP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr(cip)}, Port: 80, Endpoints: eps}
	}
	svc1 := mk("ns1", "svc1", "172.30.0.41", ep("10.180.0.1:80"))
	svc2 := mk("ns2", "svc2", "172.30.0.42", ep("10.180.0.2:80"))
	svc2.NodePort, svc2.ExternalLocal, svc2.HealthCheckNodePort = 3001, true, 30000
	svc2.SetLoadBalancerIPs([]netip.Addr{netip.MustParseAddr("1.2.3.4")})
	svc2.SetExternalIPs([]netip.Addr{netip.MustParseAddr("192.168.99.22")})
	svc5 := mk("ns5", "svc5", "172.30.0.45", ep("10.180.0.3:80"))
	svc5.NodePort = 3002
	svc5.SetLoadBalancerIPs([]netip.Addr{netip.MustParseAddr("5.6.7.8")})
	svc5.SetSourceRanges([]netip.Prefix{netip.MustParsePrefix("203.0.113.0/25")})
	svc5.Affinity = lb.Affinity{ClientIP: true, Timeout: 10800 * time.Second}
	svc6 := mk("ns6", "svc6", "172.30.0.46")
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	o := Options{MasqueradeBit: 14, Local: localtraffic.ByCIDR(netip.MustParsePrefix("10.0.0.0/8")), NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.168.0.2")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")}}
	if err := (&Proxier{NFT: fake, Options: o}).Sync(context.Background(), snapOf(svc1, svc2, svc5, svc6)); err != nil {
		t.Fatal(err)
	}
	dump := fake.Dump()
	// The base rules (upstream's baseRules, with --nodeport-addresses
	// 192.168.0.2/32 and upstream's fake proxier's service CIDRs).
	base := `add table ip kube-proxy { comment "rules for kube-proxy" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add chain ip kube-proxy firewall-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
`
	want := base + `add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }`
	have := map[string]bool{}
	var ours []string
	for _, l := range strings.Split(dump, "\n") {
		// Upstream's fake proxier is given the mark as "0x4000"; the
		// same value as the "%#08x" kube-proxy and sluice print.
		if l = strings.ReplaceAll(strings.TrimSpace(l), "0x00004000", "0x4000"); l != "" {
			have[l] = true
			ours = append(ours, l)
		}
	}
	wanted := map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		wanted[l] = true
		if !have[l] {
			t.Errorf("kube-proxy has, sluice lacks: %s", l)
		}
	}
	for _, l := range ours {
		if !wanted[l] {
			t.Errorf("sluice has, kube-proxy lacks: %s", l)
		}
	}
}

// A table from the earlier layout (kube-proxy before v1.34, or an earlier
// sluice) loses its old base chains on the first full sync.
func TestLegacyBaseChainsAreRemoved(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, Table)
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "filter-prerouting", Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(knftables.PreroutingHook), Priority: knftables.PtrTo(knftables.DNATPriority + "-10")})
	tx.Add(&knftables.Rule{Chain: "filter-prerouting", Rule: "ct state new drop"})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if err := (&Proxier{NFT: fake, Options: opts()}).Sync(context.Background(), snapOf(port("web", "10.96.0.10", ep("10.244.1.1:80")))); err != nil {
		t.Fatal(err)
	}
	if d := fake.Dump(); strings.Contains(d, "chain ip kube-proxy filter-prerouting ") || strings.Contains(d, "ct state new drop") {
		t.Fatalf("the old base chain is still there:\n%s", d)
	}
}

// As a source hands them over, consecutive snapshots share the ports that
// did not change (the same pointers); a partial sync skips rendering those
// and still leaves exactly the table a fresh full sync makes.
func TestPartialSyncsConvergeWithSharedPorts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	ctx := context.Background()
	fake := &busyNFT{Fake: knftables.NewFake(knftables.IPv4Family, Table)} // as a kernel before 6.2
	p := &Proxier{NFT: fake, Options: opts()}
	prev := snapOf()
	skipped := 0
	for step, fresh := range states(rng, 40) {
		nextPorts := map[lb.ServicePortName]*lb.ServicePort{}
		for name, sp := range fresh.Ports.All() {
			if old := prev.Ports.Get(name); old != nil && rng.IntN(3) > 0 {
				nextPorts[name] = old // unchanged: shared
				skipped++
			} else {
				nextPorts[name] = sp
			}
		}
		next := lb.NewSnapshot(nextPorts)
		if err := p.Sync(ctx, next); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		full := knftables.NewFake(knftables.IPv4Family, Table)
		if err := (&Proxier{NFT: full, Options: opts()}).Sync(ctx, next); err != nil {
			t.Fatal(err)
		}
		if got, want := settle(t, p, fake, next), normalized(full.Dump()); got != want {
			t.Fatalf("step %d: the table differs from a full sync's:\n%s\nwant:\n%s", step, got, want)
		}
		prev = next
	}
	if skipped < 50 {
		t.Fatalf("only %d shared ports", skipped)
	}
}

// kube-proxy lets the LB IPs themselves through a service's firewall when
// a source range holds the node's IP (the node's own traffic to a VIP it
// holds comes back from the VIP); found by the live parity test against
// kube-proxy v1.34.2 (cmd/sluice TestNFTablesParityWithKubeProxy).
func TestFirewallAllowsLBIPsWhenARangeHoldsTheNode(t *testing.T) {
	svc := &lb.ServicePort{Name: spn("ns5", "svc5", "p80"), ClusterIPs: []netip.Addr{netip.MustParseAddr("172.30.0.45")}, Port: 80,
		NodePort: 3002, Endpoints: []lb.Endpoint{ep("10.180.0.3:80")},
		External: lb.NewExternalAddrs(nil, []netip.Addr{netip.MustParseAddr("5.6.7.8"), netip.MustParseAddr("fd00::8")},
			[]netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("192.168.0.0/24")})}
	for _, tc := range []struct {
		node string
		want string
	}{
		{"192.168.0.2", "ip saddr != { 203.0.113.0/25, 192.168.0.0/24, 5.6.7.8 } drop"},
		{"192.168.1.2", "ip saddr != { 203.0.113.0/25, 192.168.0.0/24 } drop"},
	} {
		fake := knftables.NewFake(knftables.IPv4Family, Table)
		o := Options{MasqueradeBit: 14, NodeIPs: []netip.Addr{netip.MustParseAddr(tc.node)}}
		if err := (&Proxier{NFT: fake, Options: o}).Sync(context.Background(), snapOf(svc)); err != nil {
			t.Fatal(err)
		}
		want := "add rule ip kube-proxy " + firewallChain(svc.Name) + " " + tc.want
		if dump := fake.Dump(); !strings.Contains(dump, want+"\n") {
			t.Errorf("node %s: no %q in\n%s", tc.node, want, dump)
		}
	}
}

// With NodePorts on every address, kube-proxy's NodePort endpoint check
// excludes loopback without a fib lookup (its services rule keeps one);
// found by the live parity test.
func TestNodePortChecksMatchAllAsKubeProxy(t *testing.T) {
	for _, tc := range []struct {
		fam  knftables.Family
		v6   bool
		want []string
	}{
		{knftables.IPv4Family, false, []string{
			"add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports\n",
			"add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n"}},
		{knftables.IPv6Family, true, []string{
			"add rule ip6 kube-proxy nodeport-endpoints-check ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports\n",
			"add rule ip6 kube-proxy services fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports\n"}},
	} {
		fake := knftables.NewFake(tc.fam, Table)
		if err := (&Proxier{NFT: fake, Options: Options{IPv6: tc.v6, MasqueradeBit: 14}}).Sync(context.Background(), snapOf()); err != nil {
			t.Fatal(err)
		}
		dump := fake.Dump()
		for _, w := range tc.want {
			if !strings.Contains(dump, w) {
				t.Errorf("no %q in\n%s", w, dump)
			}
		}
	}
}

// settle runs the sync that deletes the chains p's syncs flushed (the same
// state, StaleChainDelay later) and returns fake's table after it,
// normalized. It fails unless those chains, each empty, were all the table
// held beyond it.
func settle(t *testing.T, p *Proxier, fake interface{ Dump() string }, snap *lb.Snapshot) string {
	t.Helper()
	before := normalized(fake.Dump())
	stale := slices.Collect(maps.Keys(p.stale))
	now, was := time.Now(), p.Now
	if was != nil {
		now = was()
	}
	p.Now = func() time.Time { return now.Add(StaleChainDelay) }
	st, err := p.SyncStats(context.Background(), snap)
	p.Now = was
	if err != nil || st.CleanupErr != nil {
		t.Fatalf("the sync after the stale chains' delay: %v, %v", err, st.CleanupErr)
	}
	if p.StaleChains() {
		t.Fatalf("stale chains left after their delay: %v", slices.Collect(maps.Keys(p.stale)))
	}
	after := normalized(fake.Dump())
	var kept []string
	for _, l := range strings.Split(before, "\n") {
		if !slices.ContainsFunc(stale, func(c string) bool { return l == "add chain ip "+Table+" "+c }) {
			kept = append(kept, l)
		}
	}
	if got := strings.Join(kept, "\n"); got != after {
		t.Fatalf("before the stale chains %v went, the table was not the one after with them empty:\n%s\nafter:\n%s", stale, before, after)
	}
	return after
}
