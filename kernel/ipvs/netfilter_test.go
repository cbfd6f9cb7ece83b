package ipvs

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/kernel/localtraffic"
	"github.com/sluice-proxy/sluice/lb"
)

func netfilterBed() (*iptables.Fake, *FakeIPSet, *Netfilter) {
	ipt := iptables.NewFake()
	sets := NewFakeIPSet()
	sets.Referenced = func(name string) bool { return strings.Contains(ipt.Dump(), "--match-set "+name+" ") }
	return ipt, sets, &Netfilter{Sets: sets, IPTables: ipt, MasqueradeBit: 14, Local: localtraffic.ByCIDR(netip.MustParsePrefix("10.244.0.0/16"))}
}

func TestNetfilterSetsRulesAndCleanup(t *testing.T) {
	ipt, sets, nf := netfilterBed()
	pristine := ipt.Dump()
	web := port("web", "10.96.0.10", lb.TCP, "10.244.0.5:8080")
	web.Endpoints[0].Local = true
	web.NodePort, web.HealthCheckNodePort, web.ExternalLocal = 30080, 32000, true
	web.SetExternalIPs([]netip.Addr{netip.MustParseAddr("203.0.113.10")})
	sig := port("sig", "10.96.0.11", lb.SCTP, "10.244.0.6:9000")
	sig.NodePort = 30090
	dns := port("dns", "fd00::10", lb.UDP, "[fd00::5]:53")
	guarded := port("guarded", "10.96.0.12", lb.TCP, "10.244.0.7:8080")
	guarded.SetLoadBalancerIPs([]netip.Addr{netip.MustParseAddr("198.51.100.1")})
	guarded.SetSourceRanges([]netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("fd00::/64")})
	o := Options{NodeIPs: []netip.Addr{node}}
	bound := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")}
	if err := nf.Sync(snap(web, sig, dns, guarded), o, bound); err != nil {
		t.Fatal(err)
	}
	for set, want := range map[string][]string{
		SetClusterIP:        {"10.96.0.10,tcp:80", "10.96.0.11,sctp:80", "10.96.0.12,tcp:80"},
		SetLoadBalancerFW:   {"198.51.100.1,tcp:80"},
		SetLBSourceCIDR:     {"198.51.100.1,tcp:80,192.168.0.0/24"},
		SetLBSourceIP:       {"198.51.100.1,tcp:80,198.51.100.1"}, // node 192.168.0.2 is inside the range
		SetNodePortTCP:      {"30080"},
		SetNodePortLocalTCP: {"30080"},
		SetNodePortSCTP:     {"192.168.0.2,sctp:30090"},
		SetExternalIPLocal:  {"203.0.113.10,tcp:80"},
		SetLoopBack:         {"10.244.0.5,tcp:8080,10.244.0.5"},
		SetHealthCheck:      {"32000"},
		SetIPVSIPs:          {"10.96.0.10", "10.96.0.11"},
		SetNodePortUDP:      nil,
	} {
		if got := sets.Entries(set); !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", set, got, want)
		}
	}
	if got := sets.Entries(SetName(SetClusterIP, false)); slices.Contains(got, "fd00::10,udp:80") {
		t.Error("an IPv6 entry in the IPv4 set")
	}
	rules := ipt.Dump()
	if !strings.Contains(rules, "-m comment --comment Kubernetes service cluster ip + port for masquerade purpose -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ") {
		t.Fatalf("no cluster IP masquerade rule:\n%s", rules)
	}
	// Fewer services: sets shrink to exactly the new state.
	if err := nf.Sync(snap(sig), o, bound[1:]); err != nil {
		t.Fatal(err)
	}
	if got := sets.Entries(SetClusterIP); !slices.Equal(got, []string{"10.96.0.11,sctp:80"}) {
		t.Fatalf("after shrinking: %v", got)
	}
	// A set still referenced by a rule cannot be destroyed.
	if err := sets.Destroy(SetClusterIP); err == nil {
		t.Fatal("destroyed a referenced set")
	}
	for i := 0; i < 2; i++ {
		if err := CleanupNetfilter(ipt, sets, false); err != nil {
			t.Fatal(err)
		}
		// The chains shared with iptables mode go with its clean-up.
		if err := iptables.Cleanup(ipt, iptables.Options{MasqueradeBit: 14}); err != nil {
			t.Fatal(err)
		}
	}
	if left, _ := sets.List(); len(left) != 0 {
		t.Fatalf("sets left: %v", left)
	}
	if ipt.Dump() != pristine {
		t.Fatalf("rules left:\n%s", ipt.Dump())
	}
}

// Rules of iptables mode (which shares chain names) are left to its own
// clean-up: CleanupNetfilter touches nothing when IPVS mode's chains are
// absent, and the two clean-ups together leave nothing.
func TestNetfilterCleanupLeavesIPTablesModeAlone(t *testing.T) {
	ipt, sets, _ := netfilterBed()
	pristine := ipt.Dump()
	web := port("web", "10.96.0.10", lb.TCP, "10.244.0.5:8080")
	if err := (&iptables.Proxier{Runner: ipt, Options: iptables.Options{MasqueradeBit: 14}}).Sync(snap(web)); err != nil {
		t.Fatal(err)
	}
	before := ipt.Dump()
	if err := CleanupNetfilter(ipt, sets, false); err != nil || ipt.Dump() != before {
		t.Fatalf("touched iptables mode's rules: %v", err)
	}
	if err := iptables.Cleanup(ipt, iptables.Options{MasqueradeBit: 14}); err != nil || ipt.Dump() != pristine {
		t.Fatalf("iptables cleanup: %v\n%s", err, ipt.Dump())
	}
}

func TestFakeIPSetRefuses(t *testing.T) {
	s := NewFakeIPSet()
	for _, bad := range []string{
		"add KUBE-CLUSTER-IP 10.0.0.1,tcp:80\n",
		"create X hash:ip,port family inet\nadd X 10.0.0.1\n",
		"create X hash:ip,port family inet\nadd X fd00::1,tcp:80\n",
		"create Y bitmap:port range 0-65535\nadd Y 70000\n",
		"create Z hash:ip family inet\ncreate Z bitmap:port range 0-65535 -exist\n",
		"create A hash:ip family inet\ncreate B bitmap:port range 0-65535\nswap A B\n",
	} {
		if err := NewFakeIPSet().Restore([]byte(bad)); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	if err := s.Destroy("nope"); err == nil {
		t.Error("destroyed a missing set")
	}
	if SetName(SetNodePortLocalSCTP, true) != "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS" {
		t.Errorf("IPv6 name %q", SetName(SetNodePortLocalSCTP, true))
	}
}

// The SNAT rule takes --random-fully when iptables has it, as kube-proxy's
// IPVS mode writes it.
func TestSNATRuleRandomFully(t *testing.T) {
	without := string(renderRules(Options{}, 14, false, localtraffic.Match{}, false, ruleInputs{}))
	with := string(renderRules(Options{}, 14, false, localtraffic.Match{}, true, ruleInputs{}))
	rule := `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE`
	if !strings.Contains(without, rule+"\n") || !strings.Contains(with, rule+" --random-fully\n") {
		t.Fatalf("without:\n%s\nwith:\n%s", without, with)
	}
}

// The cluster IP masquerade takes each --detect-local-mode's match, as
// kube-proxy's IPVS mode writes it (its localDetector's IfNotLocal);
// with none, what comes from a service IP is masqueraded instead.
func TestClusterIPMasqueradeFollowsTheLocalMatch(t *testing.T) {
	set := "-m set --match-set KUBE-CLUSTER-IP "
	for _, tc := range []struct {
		m    localtraffic.Match
		want string
	}{
		{localtraffic.ByCIDR(netip.MustParsePrefix("10.244.0.0/16")), set + "dst,dst ! -s 10.244.0.0/16 -j"},
		{localtraffic.ByInterface("cbr0"), set + "dst,dst ! -i cbr0 -j"},
		{localtraffic.ByInterfacePrefix("veth"), set + "dst,dst ! -i veth+ -j"},
		{localtraffic.Match{}, set + "src,dst -j KUBE-MARK-MASQ"},
	} {
		rules := string(renderRules(Options{}, 14, false, tc.m, false, ruleInputs{filled: func(s string) bool { return s == SetClusterIP }}))
		var line string
		for _, l := range strings.Split(rules, "\n") {
			if strings.Contains(l, set) && strings.Contains(l, "KUBE-MARK-MASQ") {
				line = l
			}
		}
		if !strings.Contains(line, tc.want) {
			t.Errorf("%v: %q, want %q in it", tc.m, line, tc.want)
		}
	}
}

// The rules are kube-proxy v1.34's IPVS mode's, rule for rule: a rule that
// matches on a set is there only while the set holds entries (with the
// set's comment), external IPs are accepted from off the node, the node is
// kept from a load-balancer IP whose source ranges leave it out, and the
// jumps into the built-in chains come in kube-proxy's order, the earlier
// sluice's hook into KUBE-PROXY-FIREWALL gone. Its clean-up takes all of
// it, kube-proxy's firewall hooks included.
func TestNetfilterRulesAreKubeProxysLayout(t *testing.T) {
	ipt, sets, nf := netfilterBed()
	pristine := ipt.Dump()
	if err := ipt.EnsureChain("filter", iptables.ChainProxyFirewall); err != nil {
		t.Fatal(err)
	}
	if err := ipt.EnsureRule("filter", "INPUT", legacyFirewallJump...); err != nil {
		t.Fatal(err)
	}
	o := Options{NodeIPs: []netip.Addr{node}}
	empty := port("empty", "10.96.0.9", lb.TCP)
	if err := nf.Sync(snap(empty), o, nil); err != nil {
		t.Fatal(err)
	}
	rules := ipt.Dump()
	for _, absent := range []string{"KUBE-EXTERNAL-IP dst,dst -j KUBE-MARK-MASQ", "KUBE-NODE-PORT-TCP dst", "KUBE-LOAD-BALANCER dst,dst -j ACCEPT", "KUBE-LOOP-BACK",
		"-j KUBE-SOURCE-RANGES-FIREWALL", "-m ipvs", "kubernetes load balancer firewall", "--ctstate INVALID"} {
		if strings.Contains(rules, absent) {
			t.Errorf("with empty sets, a rule with %q:\n%s", absent, rules)
		}
	}
	for _, want := range []string{
		"-A INPUT -m comment --comment kubernetes ipvs access filter -j KUBE-IPVS-FILTER\n-A INPUT -m comment --comment kube-proxy firewall rules -j KUBE-PROXY-FIREWALL\n-A INPUT -m comment --comment kubernetes health check rules -j KUBE-NODE-PORT\n",
		"-A FORWARD -m comment --comment kube-proxy firewall rules -j KUBE-PROXY-FIREWALL\n-A FORWARD -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD\n",
		"-A OUTPUT -m comment --comment kubernetes ipvs access filter -j KUBE-IPVS-OUT-FILTER\n",
		"-A KUBE-SERVICES -m comment --comment Kubernetes service cluster ip + port for masquerade purpose -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n",
		"-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("no\n%s\nin\n%s", want, rules)
		}
	}

	web := port("web", "10.96.0.10", lb.TCP, "10.244.0.5:8080")
	web.NodePort, web.ExternalLocal = 30080, true
	web.SetExternalIPs([]netip.Addr{netip.MustParseAddr("203.0.113.10")})
	shut := port("shut", "10.96.0.12", lb.UDP, "10.244.0.7:53")
	shut.SetLoadBalancerIPs([]netip.Addr{netip.MustParseAddr("198.51.100.1")})
	shut.SetSourceRanges([]netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}) // not the node's
	if err := nf.Sync(snap(empty, web, shut), o, nil); err != nil {
		t.Fatal(err)
	}
	rules = ipt.Dump()
	for _, want := range []string{
		"-A KUBE-NODE-PORT -p tcp -m comment --comment Kubernetes nodeport TCP port with externalTrafficPolicy=local -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN\n" +
			"-A KUBE-NODE-PORT -p tcp -m comment --comment Kubernetes nodeport TCP port for masquerade purpose -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ\n",
		"-m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT\n",
		"-m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m addrtype --dst-type LOCAL -j ACCEPT\n",
		"-A KUBE-SERVICES -m comment --comment Kubernetes service lb portal -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER\n",
		"-A KUBE-PROXY-FIREWALL -m comment --comment Kubernetes service load balancer ip + port for load balancer with sourceRange -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL\n",
		"-A KUBE-IPVS-OUT-FILTER -s 198.51.100.1 -m ipvs --vaddr 198.51.100.1 --vproto udp --vport 80 -j DROP\n",
		"-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT\n",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("no\n%s\nin\n%s", want, rules)
		}
	}
	for i := 0; i < 2; i++ {
		if err := CleanupNetfilter(ipt, sets, false); err != nil {
			t.Fatal(err)
		}
		if err := iptables.Cleanup(ipt, iptables.Options{MasqueradeBit: 14}); err != nil {
			t.Fatal(err)
		}
	}
	if ipt.Dump() != pristine {
		t.Fatalf("rules left:\n%s", ipt.Dump())
	}
}
