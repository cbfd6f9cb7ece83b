package iptables

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/kernel/localtraffic"
	"github.com/sluice-proxy/sluice/lb"
)

var (
	clusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	nodeIP      = netip.MustParseAddr("192.168.0.2")
	clientIP    = netip.MustParseAddr("192.168.0.9")
	podIP       = netip.MustParseAddr("10.244.1.7")
)

func opts() Options {
	return Options{MasqueradeBit: 14, Local: localtraffic.ByCIDR(clusterCIDR), LocalhostNodePorts: true}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func svcPort(name string, cip string, eps ...lb.Endpoint) *lb.ServicePort {
	return &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: name, Port: "p", Protocol: lb.TCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(cip)}, Port: 80, Endpoints: eps}
}

func readyEP(s string, local bool) lb.Endpoint {
	return lb.Endpoint{Addr: lb.EndpointAddrOf(ap(s)), Ready: true, Serving: true, Local: local}
}

func snap(ports ...*lb.ServicePort) *lb.Snapshot {
	sPorts := map[lb.ServicePortName]*lb.ServicePort{}
	for _, p := range ports {
		sPorts[p.Name] = p
	}
	return lb.NewSnapshot(sPorts)
}

func isLocal(a netip.Addr) bool { return a == nodeIP || a.IsLoopback() }

func dnats(out []Outcome) []string {
	var s []string
	for _, o := range out {
		switch {
		case o.Verdict != "":
			s = append(s, o.Verdict)
		case o.DNAT.IsValid():
			d := o.DNAT.String()
			if o.Masq {
				d += "+masq"
			}
			s = append(s, d)
		default:
			s = append(s, "untouched")
		}
	}
	slices.Sort(s)
	return slices.Compact(s)
}

func syncTo(t *testing.T, f *Fake, o Options, s *lb.Snapshot) {
	t.Helper()
	p := &Proxier{Runner: f, Options: o}
	if err := p.Sync(s); err != nil {
		t.Fatal(err)
	}
}

func TestPacketFlows(t *testing.T) {
	web := svcPort("web", "10.96.0.10", readyEP("10.244.1.1:8080", true), readyEP("10.244.2.1:8080", false))
	web.NodePort = 30080
	web.SetExternalIPs([]netip.Addr{netip.MustParseAddr("203.0.113.5")})
	empty := svcPort("empty", "10.96.0.11")
	empty.NodePort = 30081
	local := svcPort("local", "10.96.0.12", readyEP("10.244.2.2:8080", false)) // no local endpoint
	local.NodePort, local.ExternalLocal = 30082, true
	sticky := svcPort("sticky", "10.96.0.13", readyEP("10.244.1.3:8080", true))
	sticky.Affinity = lb.Affinity{ClientIP: true, Timeout: 30 * time.Second}

	f := NewFake()
	syncTo(t, f, opts(), snap(web, empty, local, sticky))
	both := []string{"10.244.1.1:8080", "10.244.2.1:8080"}
	bothMasq := []string{"10.244.1.1:8080+masq", "10.244.2.1:8080+masq"}
	for _, tc := range []struct {
		name string
		hook string
		p    Packet
		want []string
	}{
		{"pod to ClusterIP: both endpoints, no SNAT", "PREROUTING", Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", DPort: 80}, both},
		{"node to ClusterIP: SNAT (not from the cluster CIDR)", "OUTPUT", Packet{Src: nodeIP, Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", DPort: 80}, bothMasq},
		{"wrong port: untouched", "PREROUTING", Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", DPort: 81}, []string{"untouched"}},
		{"wrong protocol: untouched", "PREROUTING", Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.10"), Proto: "udp", DPort: 80}, []string{"untouched"}},
		{"NodePort from outside: SNAT", "PREROUTING", Packet{Src: clientIP, Dst: nodeIP, Proto: "tcp", DPort: 30080}, bothMasq},
		{"NodePort on localhost", "OUTPUT", Packet{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.1"), Proto: "tcp", DPort: 30080}, bothMasq},
		{"NodePort on a non-local address: untouched", "PREROUTING", Packet{Src: clientIP, Dst: netip.MustParseAddr("192.168.0.77"), Proto: "tcp", DPort: 30080}, []string{"untouched"}},
		{"externalIP", "PREROUTING", Packet{Src: clientIP, Dst: netip.MustParseAddr("203.0.113.5"), Proto: "tcp", DPort: 80}, bothMasq},
		{"no endpoints: ClusterIP rejected", "PREROUTING", Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.11"), Proto: "tcp", DPort: 80}, []string{"REJECT"}},
		{"no endpoints: NodePort rejected", "PREROUTING", Packet{Src: clientIP, Dst: nodeIP, Proto: "tcp", DPort: 30081}, []string{"REJECT"}},
		{"Local policy, no local endpoint: NodePort dropped", "PREROUTING", Packet{Src: clientIP, Dst: nodeIP, Proto: "tcp", DPort: 30082}, []string{"DROP"}},
		{"Local policy: ClusterIP still served", "PREROUTING", Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.12"), Proto: "tcp", DPort: 80}, []string{"10.244.2.2:8080"}},
		{"affinity: one endpoint", "PREROUTING", Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.13"), Proto: "tcp", DPort: 80}, []string{"10.244.1.3:8080"}},
	} {
		tc.p.Local = isLocal
		if got := dnats(f.Trace(tc.hook, tc.p)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// kube-proxy's statistic series for three endpoints.
	three := svcPort("three", "10.96.0.14", readyEP("10.244.1.1:80", false), readyEP("10.244.1.2:80", false), readyEP("10.244.1.3:80", false))
	rules := string(Render(snap(three), opts()))
	for _, want := range []string{"--probability 0.3333333333 -j", "--probability 0.5000000000 -j"} {
		if !strings.Contains(rules, want) {
			t.Errorf("rules lack %q", want)
		}
	}
	// ClientIP affinity uses recent with the timeout in seconds.
	if r := string(Render(snap(sticky), opts())); !strings.Contains(r, "-m recent --name "+EndpointChain(sticky.Name, ap("10.244.1.3:8080"))+" --rcheck --seconds 30 --reap") {
		t.Errorf("affinity rules:\n%s", r)
	}
}

func TestMasqueradeAllAndMark(t *testing.T) {
	o := opts()
	o.MasqueradeAll, o.MasqueradeBit = true, 3
	f := NewFake()
	web := svcPort("web", "10.96.0.10", readyEP("10.244.1.1:8080", true))
	syncTo(t, f, o, snap(web))
	got := dnats(f.Trace("PREROUTING", Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", DPort: 80, Local: isLocal}))
	if !slices.Equal(got, []string{"10.244.1.1:8080+masq"}) {
		t.Fatalf("--masquerade-all: %v", got)
	}
	if r := string(Render(snap(web), o)); !strings.Contains(r, "--or-mark 0x00000008") {
		t.Fatalf("mark for bit 3 missing")
	}
}

// States applied in any order converge to what a fresh sync of the last
// state gives, and stale per-service chains are garbage-collected.
func TestStatesConvergeInAnyOrder(t *testing.T) {
	var states []*lb.Snapshot
	for i := 0; i < 6; i++ {
		var ports []*lb.ServicePort
		for j := 0; j <= i; j++ {
			var eps []lb.Endpoint
			for k := 0; k < (i+j)%4; k++ {
				eps = append(eps, readyEP(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(j), byte(k + 1)}), 8080).String(), k%2 == 0))
			}
			sp := svcPort("s"+string(rune('a'+j)), netip.AddrFrom4([4]byte{10, 96, 0, byte(j + 1)}).String(), eps...)
			sp.NodePort = uint16(30000 + j)
			sp.ExternalLocal = j%3 == 0
			sp.Affinity.ClientIP = i%2 == 0
			sp.Affinity.Timeout = time.Hour
			ports = append(ports, sp)
		}
		states = append(states, snap(ports...))
	}
	fresh := NewFake()
	syncTo(t, fresh, opts(), states[2])
	want := fresh.Dump()
	for round := 0; round < 20; round++ {
		f := NewFake()
		for _, i := range rand.Perm(len(states)) {
			syncTo(t, f, opts(), states[i])
		}
		syncTo(t, f, opts(), states[2])
		if got := f.Dump(); got != want {
			t.Fatalf("round %d did not converge:\n%s\nwant:\n%s", round, got, want)
		}
	}
}

func TestFakeRefusesWhatTheKernelRefuses(t *testing.T) {
	f := NewFake()
	before := f.Dump()
	for _, bad := range []string{
		"*nat\n:KUBE-X - [0:0]\n-A KUBE-X -j KUBE-MISSING\nCOMMIT\n",
		"*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n",
		"*nat\n-X PREROUTING\nCOMMIT\n",
		"*nat\n:KUBE-X - [0:0]\n",
		"*nat\n:KUBE-THIS-NAME-IS-FAR-TOO-LONG-FOR-IPTABLES - [0:0]\nCOMMIT\n",
	} {
		if err := f.Restore([]byte(bad)); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	if f.Dump() != before {
		t.Fatal("a refused transaction changed state")
	}
	if err := f.Restore([]byte("*nat\n:A - [0:0]\n:B - [0:0]\n-A A -j B\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore([]byte("*nat\n-X B\nCOMMIT\n")); err == nil {
		t.Fatal("deleted a chain still referenced")
	}
}

func TestCanaryAndCleanup(t *testing.T) {
	f := NewFake()
	pristine := f.Dump()
	r := &countingRunner{Runner: f}
	p := &Proxier{Runner: r, Options: opts()}
	web := svcPort("web", "10.96.0.10", readyEP("10.244.1.1:8080", true))
	web.NodePort = 30080
	if err := p.Sync(snap(web)); err != nil {
		t.Fatal(err)
	}
	// Each check reads mangle, a few rules; every canaryEveryTable-th
	// check reads nat and filter too, so a flush of nat alone is seen
	// within that many checks and the big nat table is read a tenth as often.
	for i := 1; i <= 2*canaryEveryTable; i++ {
		r.ran = nil
		if p.CanaryGone() {
			t.Fatalf("check %d: canary missing right after a sync", i)
		}
		want := []string{"chains mangle"}
		if i%canaryEveryTable == 0 {
			want = []string{"chains mangle", "chains nat", "chains filter"}
		}
		if !slices.Equal(r.ran, want) {
			t.Fatalf("check %d ran %v, want %v", i, r.ran, want)
		}
	}
	f.Flush("nat") // nat alone
	seen := 0
	for i := 1; i <= canaryEveryTable && seen == 0; i++ {
		if p.CanaryGone() {
			seen = i
		}
	}
	if seen != canaryEveryTable {
		t.Fatalf("a flush of nat alone seen at check %d, want %d", seen, canaryEveryTable)
	}
	if err := p.Sync(snap(web)); err != nil {
		t.Fatal(err)
	}
	if p.CanaryGone() {
		t.Fatal("canary missing after the resync")
	}
	for _, table := range CanaryTables { // a firewall reload
		f.Flush(table)
	}
	if !p.CanaryGone() {
		t.Fatal("flush not detected")
	}
	if err := p.Sync(snap(web)); err != nil {
		t.Fatal(err)
	}
	pkt := Packet{Src: podIP, Dst: netip.MustParseAddr("10.96.0.10"), Proto: "tcp", DPort: 80, Local: isLocal}
	if got := dnats(f.Trace("PREROUTING", pkt)); !slices.Equal(got, []string{"10.244.1.1:8080"}) {
		t.Fatalf("after resync: %v", got)
	}
	// Another mode's start-up, as kube-proxy's: everything but the
	// kubelet's KUBE-FIREWALL and its jumps goes.
	if err := CleanupLeftovers(f, opts()); err != nil {
		t.Fatal(err)
	}
	kept, _ := f.Chains("filter")
	if !slices.Contains(kept, ChainFirewall) {
		t.Fatalf("CleanupLeftovers took %s: %v", ChainFirewall, kept)
	}
	for _, table := range []string{"filter", "nat", "mangle"} {
		chains, _ := f.Chains(table)
		for _, c := range chains {
			if strings.HasPrefix(c, "KUBE-") && c != ChainFirewall {
				t.Fatalf("CleanupLeftovers left %s %s:\n%s", table, c, f.Dump())
			}
		}
	}
	for i := 0; i < 2; i++ { // idempotent
		if err := Cleanup(f, opts()); err != nil {
			t.Fatal(err)
		}
		if got := f.Dump(); got != pristine {
			t.Fatalf("cleanup %d left:\n%s", i, got)
		}
	}
}

// loadBalancerSourceRanges: KUBE-FW lets allowed sources through to the
// endpoints; others are not translated and KUBE-PROXY-FIREWALL drops them.
// The health check node port is accepted in the filter table.
func TestLoadBalancerSourceRangesAndHealthCheckNodePort(t *testing.T) {
	lbIP := netip.MustParseAddr("198.51.100.1")
	web := svcPort("web", "10.96.0.10", readyEP("10.244.1.1:8080", true))
	web.SetLoadBalancerIPs([]netip.Addr{lbIP})
	web.SetSourceRanges([]netip.Prefix{netip.MustParsePrefix("192.168.0.0/24")})
	web.NodePort = 30080
	web.HealthCheckNodePort = 32000
	web.ExternalLocal = true
	f := NewFake()
	o := opts()
	o.NodeIPs = []netip.Addr{nodeIP}
	syncTo(t, f, o, snap(web))
	allowed := Packet{Src: clientIP, Dst: lbIP, Proto: "tcp", DPort: 80, Local: isLocal}
	if got := dnats(f.Trace("PREROUTING", allowed)); !slices.Equal(got, []string{"10.244.1.1:8080"}) {
		t.Fatalf("allowed source: %v", got)
	}
	denied := allowed
	denied.Src = netip.MustParseAddr("203.0.113.5")
	if got := dnats(f.Trace("PREROUTING", denied)); !slices.Equal(got, []string{"DROP"}) {
		t.Fatalf("source outside the ranges: %v, want DROP", got)
	}
	// The node is inside the range, so its hairpin (source = LB IP) passes.
	hairpin := allowed
	hairpin.Src = lbIP
	if got := dnats(f.Trace("OUTPUT", hairpin)); !slices.Equal(got, []string{"10.244.1.1:8080+masq"}) && !slices.Equal(got, []string{"10.244.1.1:8080"}) {
		t.Fatalf("node hairpin: %v", got)
	}
	if !strings.Contains(f.Dump(), "--dport 32000 -j ACCEPT") {
		t.Fatalf("no health check node port rule:\n%s", f.Dump())
	}
	// Without ranges no KUBE-FW chain is used.
	web2 := *web
	web2.SetSourceRanges(nil)
	syncTo(t, f, o, snap(&web2))
	if got := dnats(f.Trace("PREROUTING", denied)); !slices.Equal(got, []string{"10.244.1.1:8080"}) {
		t.Fatalf("no ranges: %v", got)
	}
	if strings.Contains(f.Dump(), FirewallChain(web.Name)) {
		t.Fatal("stale KUBE-FW chain left")
	}
}
