package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/kernel/localtraffic"
	"github.com/sluice-proxy/sluice/lb"
)

// The ipsets of IPVS mode (kube-proxy's names; IPv6 sets are KUBE-6-...).
const (
	SetClusterIP         = "KUBE-CLUSTER-IP"
	SetExternalIP        = "KUBE-EXTERNAL-IP"
	SetExternalIPLocal   = "KUBE-EXTERNAL-IP-LOCAL"
	SetLoadBalancer      = "KUBE-LOAD-BALANCER"
	SetLoadBalancerLocal = "KUBE-LOAD-BALANCER-LOCAL"
	SetLoadBalancerFW    = "KUBE-LOAD-BALANCER-FW"
	SetLBSourceCIDR      = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
	SetLBSourceIP        = "KUBE-LOAD-BALANCER-SOURCE-IP"
	SetNodePortTCP       = "KUBE-NODE-PORT-TCP"
	SetNodePortUDP       = "KUBE-NODE-PORT-UDP"
	SetNodePortLocalTCP  = "KUBE-NODE-PORT-LOCAL-TCP"
	SetNodePortLocalUDP  = "KUBE-NODE-PORT-LOCAL-UDP"
	SetNodePortSCTP      = "KUBE-NODE-PORT-SCTP-HASH"
	SetNodePortLocalSCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
	SetLoopBack          = "KUBE-LOOP-BACK"
	SetHealthCheck       = "KUBE-HEALTH-CHECK-NODE-PORT"
	SetIPVSIPs           = "KUBE-IPVS-IPS"
)

// The iptables chains of IPVS mode that iptables mode does not have.
const (
	ChainNodePort     = "KUBE-NODE-PORT"
	ChainLoadBalancer = "KUBE-LOAD-BALANCER"
	ChainIPVSFilter   = "KUBE-IPVS-FILTER"
	// ChainIPVSOutFilter keeps the node from load-balancer IPs whose
	// source ranges leave it out.
	ChainIPVSOutFilter = "KUBE-IPVS-OUT-FILTER"
	// ChainSourceRanges admits loadBalancerSourceRanges, dropping the rest.
	ChainSourceRanges = "KUBE-SOURCE-RANGES-FIREWALL"
)

// SetSpec is one ipset: its type and, in Sets, its entries.
type SetSpec struct {
	Name, Type string
}

var setTypes = []SetSpec{
	{SetClusterIP, "hash:ip,port"}, {SetExternalIP, "hash:ip,port"}, {SetExternalIPLocal, "hash:ip,port"},
	{SetLoadBalancer, "hash:ip,port"}, {SetLoadBalancerLocal, "hash:ip,port"},
	{SetLoadBalancerFW, "hash:ip,port"}, {SetLBSourceCIDR, "hash:ip,port,net"}, {SetLBSourceIP, "hash:ip,port,ip"},
	{SetNodePortTCP, "bitmap:port"}, {SetNodePortUDP, "bitmap:port"}, {SetNodePortLocalTCP, "bitmap:port"}, {SetNodePortLocalUDP, "bitmap:port"},
	{SetNodePortSCTP, "hash:ip,port"}, {SetNodePortLocalSCTP, "hash:ip,port"},
	{SetLoopBack, "hash:ip,port,ip"}, {SetHealthCheck, "bitmap:port"}, {SetIPVSIPs, "hash:ip"},
}

// SetName is a set's name in a family: IPv6 sets are KUBE-6-*.
func SetName(name string, ipv6 bool) string {
	if !ipv6 {
		return name
	}
	n := "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
	if len(n) > 31 {
		n = n[:31]
	}
	return n
}

// Sets renders every set of one family with its entries: a pure function
// of the snapshot, the bound addresses and the node IPs.
func Sets(snap *lb.Snapshot, o Options, bound []netip.Addr) (specs []SetSpec, entries map[string][]string) {
	specs, entries, _ = sets(snap, o, bound)
	return specs, entries
}

// setEntry is one entry of one set (by its name in the family).
type setEntry struct{ set, entry string }

// sets is Sets, with each port's entries for SyncChanged.
func sets(snap *lb.Snapshot, o Options, bound []netip.Addr) (specs []SetSpec, entries map[string][]string, byPort map[lb.ServicePortName][]setEntry) {
	entries = map[string][]string{}
	byPort = map[lb.ServicePortName][]setEntry{}
	for _, sp := range snap.Sorted() {
		es := portEntries(sp, o)
		for _, e := range es {
			entries[e.set] = append(entries[e.set], e.entry)
		}
		if len(es) > 0 {
			byPort[sp.Name] = es
		}
	}
	for _, a := range bound {
		if a.Is6() == o.IPv6 {
			n := SetName(SetIPVSIPs, o.IPv6)
			entries[n] = append(entries[n], a.String())
		}
	}
	for set, es := range entries {
		slices.Sort(es)
		entries[set] = slices.Compact(es)
	}
	for _, s := range setTypes {
		specs = append(specs, SetSpec{Name: SetName(s.Name, o.IPv6), Type: s.Type})
	}
	return specs, entries, byPort
}

// portEntries renders the set entries of one service port (nil: none),
// each once.
func portEntries(sp *lb.ServicePort, o Options) []setEntry {
	if sp == nil {
		return nil
	}
	var out []setEntry
	add := func(set, e string) {
		se := setEntry{SetName(set, o.IPv6), e}
		if !slices.Contains(out, se) {
			out = append(out, se)
		}
	}
	fam := func(a netip.Addr) bool { return a.Is6() == o.IPv6 }
	proto := strings.ToLower(string(sp.Name.Protocol))
	ipPort := func(a netip.Addr, port uint16) string { return fmt.Sprintf("%s,%s:%d", a, proto, port) }
	for _, ip := range sp.ClusterIPs {
		if fam(ip) {
			add(SetClusterIP, ipPort(ip, sp.Port))
		}
	}
	for _, ip := range sp.ExternalIPs() {
		if fam(ip) {
			add(SetExternalIP, ipPort(ip, sp.Port))
			if sp.ExternalLocal {
				add(SetExternalIPLocal, ipPort(ip, sp.Port))
			}
		}
	}
	ranges, nodeInRange := sourceRanges(sp, o)
	for _, ip := range sp.LoadBalancerIPs() {
		if fam(ip) {
			add(SetLoadBalancer, ipPort(ip, sp.Port))
			if sp.ExternalLocal {
				add(SetLoadBalancerLocal, ipPort(ip, sp.Port))
			}
			if len(ranges) > 0 {
				add(SetLoadBalancerFW, ipPort(ip, sp.Port))
				for _, r := range ranges {
					add(SetLBSourceCIDR, ipPort(ip, sp.Port)+","+r.String())
				}
				if nodeInRange { // the node's own hairpin comes from the LB IP
					add(SetLBSourceIP, ipPort(ip, sp.Port)+","+ip.String())
				}
			}
		}
	}
	hasFamily := slices.ContainsFunc(sp.ClusterIPs, fam)
	// Without a node IP of the family, kube-proxy leaves a NodePort
	// Service's NodePort and health check node port out of its sets.
	nodePortless := sp.NodePort != 0 && !slices.ContainsFunc(o.NodeIPs, fam)
	if sp.NodePort != 0 && hasFamily && !nodePortless {
		switch sp.Name.Protocol {
		case lb.TCP, lb.UDP:
			set, local := SetNodePortTCP, SetNodePortLocalTCP
			if sp.Name.Protocol == lb.UDP {
				set, local = SetNodePortUDP, SetNodePortLocalUDP
			}
			add(set, fmt.Sprint(sp.NodePort))
			if sp.ExternalLocal {
				add(local, fmt.Sprint(sp.NodePort))
			}
		case lb.SCTP:
			for _, ip := range o.NodeIPs {
				if fam(ip) {
					add(SetNodePortSCTP, ipPort(ip, sp.NodePort))
					if sp.ExternalLocal {
						add(SetNodePortLocalSCTP, ipPort(ip, sp.NodePort))
					}
				}
			}
		}
	}
	if sp.HealthCheckNodePort != 0 && hasFamily && !nodePortless {
		add(SetHealthCheck, fmt.Sprint(sp.HealthCheckNodePort))
	}
	for _, ep := range sp.Endpoints {
		if ep.Local && fam(ep.Addr.Addr()) {
			add(SetLoopBack, fmt.Sprintf("%s,%s:%d,%s", ep.Addr.Addr(), proto, ep.Addr.Port(), ep.Addr.Addr()))
		}
	}
	return out
}

// portNoNodeAccess are the "ip,proto,port" of sp's load-balancer IPs in
// o's family whose source ranges (of the family) hold none of the node
// IPs: kube-proxy keeps the node itself from reaching them
// (KUBE-IPVS-OUT-FILTER), as the ranges would keep it out of an external
// load balancer.
func portNoNodeAccess(sp *lb.ServicePort, o Options) []string {
	if sp == nil {
		return nil
	}
	if ranges, nodeInRange := sourceRanges(sp, o); len(ranges) == 0 || nodeInRange {
		return nil
	}
	var out []string
	for _, ip := range sp.LoadBalancerIPs() {
		if ip.Is6() == o.IPv6 {
			out = append(out, fmt.Sprintf("%s,%s,%d", ip, strings.ToLower(string(sp.Name.Protocol)), sp.Port))
		}
	}
	return out
}

// sourceRanges are sp's loadBalancerSourceRanges of o's family, and
// whether one of them holds a node IP: then the node's own hairpin through
// an LB IP is admitted (KUBE-LOAD-BALANCER-SOURCE-IP), else the node is
// kept from the LB IPs (portNoNodeAccess).
func sourceRanges(sp *lb.ServicePort, o Options) (ranges []netip.Prefix, nodeInRange bool) {
	for _, r := range sp.SourceRanges() {
		if r.Addr().Is6() == o.IPv6 {
			ranges = append(ranges, r)
		}
	}
	for _, r := range ranges {
		for _, n := range o.NodeIPs {
			nodeInRange = nodeInRange || r.Contains(n)
		}
	}
	return ranges, nodeInRange
}

// RestoreSets renders `ipset restore` input that makes each set hold
// exactly its entries, atomically per set: a temporary set is filled and
// swapped in, then destroyed.
func RestoreSets(specs []SetSpec, entries map[string][]string, ipv6 bool) []byte {
	var b strings.Builder
	family := "inet"
	if ipv6 {
		family = "inet6"
	}
	for _, s := range specs {
		opts := " family " + family
		if s.Type == "bitmap:port" {
			opts = " range 0-65535"
		}
		tmp := "sluice-tmp-" + strings.TrimPrefix(s.Name, "KUBE-")
		if len(tmp) > 31 {
			tmp = tmp[:31]
		}
		fmt.Fprintf(&b, "create %s %s%s -exist\n", s.Name, s.Type, opts)
		fmt.Fprintf(&b, "create %s %s%s -exist\n", tmp, s.Type, opts)
		fmt.Fprintf(&b, "flush %s\n", tmp)
		for _, e := range entries[s.Name] {
			fmt.Fprintf(&b, "add %s %s\n", tmp, e)
		}
		fmt.Fprintf(&b, "swap %s %s\n", tmp, s.Name)
		fmt.Fprintf(&b, "destroy %s\n", tmp)
	}
	return []byte(b.String())
}

// ruleInputs is what IPVS mode's rules take from the state, as kube-proxy
// writes them: a rule that matches on a set is written only while the set
// holds entries, and the node is kept from reaching load-balancer IPs
// whose source ranges leave it out.
type ruleInputs struct {
	// filled reports whether a set (by its IPv4 name) holds entries.
	filled func(set string) bool
	// noNodeAccess are the "ip,proto,port" of load-balancer IPs with source
	// ranges that hold no node IP, sorted.
	noNodeAccess []string
}

// setComments are kube-proxy's comments of its sets, which the rules that
// match on them carry.
var setComments = map[string]string{
	SetLoopBack:          "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
	SetClusterIP:         "Kubernetes service cluster ip + port for masquerade purpose",
	SetExternalIP:        "Kubernetes service external ip + port for masquerade and filter purpose",
	SetExternalIPLocal:   "Kubernetes service external ip + port with externalTrafficPolicy=local",
	SetLoadBalancer:      "Kubernetes service lb portal",
	SetLoadBalancerLocal: "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
	SetLoadBalancerFW:    "Kubernetes service load balancer ip + port for load balancer with sourceRange",
	SetLBSourceIP:        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
	SetLBSourceCIDR:      "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
	SetNodePortTCP:       "Kubernetes nodeport TCP port for masquerade purpose",
	SetNodePortLocalTCP:  "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
	SetNodePortUDP:       "Kubernetes nodeport UDP port for masquerade purpose",
	SetNodePortLocalUDP:  "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
	SetNodePortSCTP:      "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
	SetNodePortLocalSCTP: "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
	SetHealthCheck:       "Kubernetes health check node port",
}

// setJumps are the rules that match on one set each, in kube-proxy's
// order (its ipsetWithIptablesChain: a Local set before its other set).
var setJumps = []struct{ set, table, chain, to, match, proto string }{
	{SetLoopBack, "nat", iptables.ChainPostrouting, "MASQUERADE", "dst,dst,src", ""},
	{SetLoadBalancer, "nat", iptables.ChainServices, ChainLoadBalancer, "dst,dst", ""},
	{SetLoadBalancerLocal, "nat", ChainLoadBalancer, "RETURN", "dst,dst", ""},
	{SetNodePortLocalTCP, "nat", ChainNodePort, "RETURN", "dst", "tcp"},
	{SetNodePortTCP, "nat", ChainNodePort, iptables.ChainMarkMasq, "dst", "tcp"},
	{SetNodePortLocalUDP, "nat", ChainNodePort, "RETURN", "dst", "udp"},
	{SetNodePortUDP, "nat", ChainNodePort, iptables.ChainMarkMasq, "dst", "udp"},
	{SetNodePortLocalSCTP, "nat", ChainNodePort, "RETURN", "dst,dst", "sctp"},
	{SetNodePortSCTP, "nat", ChainNodePort, iptables.ChainMarkMasq, "dst,dst", "sctp"},
	{SetLoadBalancerFW, "filter", iptables.ChainProxyFirewall, ChainSourceRanges, "dst,dst", ""},
	{SetLBSourceCIDR, "filter", ChainSourceRanges, "RETURN", "dst,dst,src", ""},
	{SetLBSourceIP, "filter", ChainSourceRanges, "RETURN", "dst,dst,src", ""},
}

// The chains IPVS mode writes in each table, kube-proxy's iptablesChains.
var (
	natChains    = []string{iptables.ChainServices, iptables.ChainPostrouting, ChainNodePort, ChainLoadBalancer, iptables.ChainMarkMasq}
	filterChains = []string{iptables.ChainForward, ChainNodePort, iptables.ChainProxyFirewall, ChainSourceRanges, ChainIPVSFilter, ChainIPVSOutFilter}
)

// renderRules renders IPVS mode's iptables-restore input for one family,
// rule for rule as kube-proxy v1.34's IPVS mode writes it: masquerade for
// traffic to cluster IPs that local (--detect-local-mode) does not match
// (or all, with --masquerade-all), to NodePorts and LB IPs unless their
// policy is Local, hairpin masquerade (KUBE-LOOP-BACK), external IPs
// accepted from off the node, the health check node ports, the source
// ranges, and the rejection of other ports on addresses bound to
// kube-ipvs0. Chains shared with iptables mode keep their names. With
// randomFully the SNAT rule takes --random-fully, when iptables has it.
func renderRules(o Options, masqueradeBit int, masqueradeAll bool, local localtraffic.Match, randomFully bool, in ruleInputs) []byte {
	set := func(n string) string { return SetName(n, o.IPv6) }
	filled := func(n string) bool { return in.filled != nil && in.filled(n) }
	mark := fmt.Sprintf("%#08x", 1<<masqueradeBit)
	c := func(s string) string { return "-m comment --comment \"" + s + "\"" }
	var nat, filter strings.Builder
	n := func(s string) { nat.WriteString(s + "\n") }
	f := func(s string) { filter.WriteString(s + "\n") }
	if o.IPv6 {
		n("-A KUBE-SERVICES -s ::1/128 -j RETURN")
	} else {
		n("-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN")
	}
	for _, j := range setJumps {
		if !filled(j.set) {
			continue
		}
		rule := "-A " + j.chain
		if j.proto != "" {
			rule += " -p " + j.proto
		}
		rule += " " + c(setComments[j.set]) + " -m set --match-set " + set(j.set) + " " + j.match + " -j " + j.to
		if j.table == "filter" {
			f(rule)
		} else {
			n(rule)
		}
	}
	if filled(SetClusterIP) {
		cip := "-A KUBE-SERVICES " + c(setComments[SetClusterIP]) + " -m set --match-set " + set(SetClusterIP)
		switch {
		case masqueradeAll:
			n(cip + " dst,dst -j KUBE-MARK-MASQ")
		case local.IsSet():
			n(cip + " dst,dst " + strings.Join(local.IPTables(true), " ") + " -j KUBE-MARK-MASQ")
		default:
			n(cip + " src,dst -j KUBE-MARK-MASQ")
		}
	}
	// Traffic to external IPs is accepted from off the node (not from a
	// bridge nor a local process), and where they are local addresses.
	external := func(match string) {
		n(match + " -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
		n(match + " -m addrtype --dst-type LOCAL -j ACCEPT")
	}
	if filled(SetExternalIP) {
		match := "-A KUBE-SERVICES " + c(setComments[SetExternalIP]) + " -m set --match-set " + set(SetExternalIP) + " dst,dst"
		n(match + " -j KUBE-MARK-MASQ")
		external(match)
	}
	if filled(SetExternalIPLocal) {
		external("-A KUBE-SERVICES " + c(setComments[SetExternalIPLocal]) + " -m set --match-set " + set(SetExternalIPLocal) + " dst,dst")
	}
	n("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j " + ChainNodePort)
	n("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ")
	f("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP")
	for _, e := range in.noNodeAccess {
		ip, rest, _ := strings.Cut(e, ",")
		proto, port, _ := strings.Cut(rest, ",")
		f("-A " + ChainIPVSOutFilter + " -s " + ip + " -m ipvs --vaddr " + ip + " --vproto " + proto + " --vport " + port + " -j DROP")
	}
	// What reaches a virtual server is accepted, whatever rules after
	// these would do with it.
	for _, s := range []string{SetClusterIP, SetLoadBalancer} {
		if filled(s) {
			n("-A KUBE-SERVICES -m set --match-set " + set(s) + " dst,dst -j ACCEPT")
		}
	}
	f("-A KUBE-FORWARD " + c("kubernetes forwarding rules") + " -m mark --mark " + mark + "/" + mark + " -j ACCEPT")
	f("-A KUBE-FORWARD " + c("kubernetes forwarding conntrack rule") + " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
	f("-A KUBE-NODE-PORT " + c(setComments[SetHealthCheck]) + " -m set --match-set " + set(SetHealthCheck) + " dst -j ACCEPT")
	for _, s := range []string{SetLoadBalancer, SetClusterIP, SetExternalIP, SetExternalIPLocal} {
		f("-A KUBE-IPVS-FILTER -m set --match-set " + set(s) + " dst,dst -j RETURN")
	}
	f("-A KUBE-IPVS-FILTER -m set --match-set " + set(SetHealthCheck) + " dst -j RETURN")
	f("-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set " + set(SetIPVSIPs) + " dst -j REJECT")
	n("-A KUBE-POSTROUTING -m mark ! --mark " + mark + "/" + mark + " -j RETURN")
	n("-A KUBE-POSTROUTING -j MARK --xor-mark " + mark)
	if randomFully {
		n("-A KUBE-POSTROUTING " + c("kubernetes service traffic requiring SNAT") + " -j MASQUERADE --random-fully")
	} else {
		n("-A KUBE-POSTROUTING " + c("kubernetes service traffic requiring SNAT") + " -j MASQUERADE")
	}
	n("-A KUBE-MARK-MASQ -j MARK --or-mark " + mark)

	var b strings.Builder
	b.WriteString("*filter\n")
	for _, ch := range filterChains {
		b.WriteString(":" + ch + " - [0:0]\n")
	}
	b.WriteString(filter.String() + "COMMIT\n*nat\n")
	for _, ch := range natChains {
		b.WriteString(":" + ch + " - [0:0]\n")
	}
	b.WriteString(nat.String() + "COMMIT\n")
	return []byte(b.String())
}

// RuleJumps hooks IPVS mode's chains into the built-in ones, in
// kube-proxy's order (its iptablesJumpChain). Each is inserted at the head
// of its chain in turn, as kube-proxy prepends them, so the last of a
// chain's comes first.
func RuleJumps() []iptables.Jump {
	j := func(table, chain, target string, comment string) iptables.Jump {
		return iptables.Jump{Table: table, Chain: chain, Args: []string{"-m", "comment", "--comment", comment, "-j", target}}
	}
	return []iptables.Jump{
		j("nat", "OUTPUT", iptables.ChainServices, "kubernetes service portals"),
		j("nat", "PREROUTING", iptables.ChainServices, "kubernetes service portals"),
		j("nat", "POSTROUTING", iptables.ChainPostrouting, "kubernetes postrouting rules"),
		j("filter", "FORWARD", iptables.ChainForward, "kubernetes forwarding rules"),
		j("filter", "INPUT", ChainNodePort, "kubernetes health check rules"),
		j("filter", "INPUT", iptables.ChainProxyFirewall, "kube-proxy firewall rules"),
		j("filter", "FORWARD", iptables.ChainProxyFirewall, "kube-proxy firewall rules"),
		j("filter", "INPUT", ChainIPVSFilter, "kubernetes ipvs access filter"),
		j("filter", "OUTPUT", ChainIPVSOutFilter, "kubernetes ipvs access filter"),
	}
}

// sharedJump reports whether j is also iptables mode's jump, the same
// rule, which iptables mode's clean-up removes.
func sharedJump(j iptables.Jump) bool {
	switch j.Args[len(j.Args)-1] {
	case iptables.ChainServices, iptables.ChainPostrouting, iptables.ChainForward:
		return true
	}
	return false
}

// legacyFirewallJump is the hook into KUBE-PROXY-FIREWALL that sluice's
// IPVS mode wrote before it wrote kube-proxy's (iptables mode's own, which
// a Sync removes in IPVS mode so that it is not left beside them).
var legacyFirewallJump = []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes load balancer firewall", "-j", iptables.ChainProxyFirewall}

// SetRunner applies `ipset restore` input and lists and destroys sets.
type SetRunner interface {
	Restore(data []byte) error
	List() ([]string, error)
	Destroy(name string) error
}

// Netfilter applies IPVS mode's ipsets and iptables rules for one family.
type Netfilter struct {
	Sets          SetRunner
	IPTables      iptables.Runner
	IPv6          bool
	MasqueradeBit int
	MasqueradeAll bool
	// Local is this family's --detect-local-mode match.
	Local       localtraffic.Match
	RandomFully bool // --random-fully on the SNAT rule

	applied setTable // for SyncChanged
	// legacyGone is set once a Sync has removed legacyFirewallJump.
	legacyGone bool
}

// setTable is what the syncs so far left in the sets, by service port,
// and what the rules were rendered from.
type setTable struct {
	id      uint64 // the snapshot applied; 0: the next sync writes everything
	nodeIPs []netip.Addr
	refs    map[setEntry]int // how many ports want each entry
	ports   map[lb.ServicePortName][]setEntry
	entries map[string]int // entries per set (by its name in the family)
	// noNode are each port's noNodeAccess entries (portNoNodeAccess).
	noNode map[lb.ServicePortName][]string
	// rules is the ruleInputs' state the rules were last written for
	// (rulesKey).
	rules string
}

// inputs is the ruleInputs of t's state.
func (t *setTable) inputs(ipv6 bool) ruleInputs {
	in := ruleInputs{filled: func(set string) bool { return t.entries[SetName(set, ipv6)] > 0 }}
	for _, es := range t.noNode {
		in.noNodeAccess = append(in.noNodeAccess, es...)
	}
	slices.Sort(in.noNodeAccess)
	in.noNodeAccess = slices.Compact(in.noNodeAccess)
	return in
}

// rulesKey names what rules in renders: the sets the rules match on that
// hold entries, and the load-balancer IPs the node may not reach.
func rulesKey(in ruleInputs) string {
	var b strings.Builder
	for _, s := range setTypes {
		if in.filled(s.Name) {
			b.WriteString(s.Name + " ")
		}
	}
	b.WriteString("| " + strings.Join(in.noNodeAccess, " "))
	return b.String()
}

// Sync applies the sets, then the rules that match on them, then the jumps.
func (n *Netfilter) Sync(snap *lb.Snapshot, o Options, bound []netip.Addr) error {
	o.IPv6 = n.IPv6
	n.applied = setTable{}
	specs, entries, byPort := sets(snap, o, bound)
	if err := n.Sets.Restore(RestoreSets(specs, entries, n.IPv6)); err != nil {
		return fmt.Errorf("ipsets: %w", err)
	}
	t := setTable{id: snap.ID, nodeIPs: slices.Clone(o.NodeIPs), refs: map[setEntry]int{}, ports: byPort,
		entries: map[string]int{}, noNode: map[lb.ServicePortName][]string{}}
	for set, es := range entries {
		t.entries[set] = len(es)
	}
	for _, sp := range snap.Sorted() {
		if es := portNoNodeAccess(sp, o); len(es) > 0 {
			t.noNode[sp.Name] = es
		}
	}
	in := t.inputs(n.IPv6)
	if err := n.IPTables.Restore(renderRules(o, n.MasqueradeBit, n.MasqueradeAll, n.Local, n.RandomFully, in)); err != nil {
		return fmt.Errorf("iptables rules: %w", err)
	}
	t.rules = rulesKey(in)
	if !n.legacyGone {
		if err := n.IPTables.DeleteRule("filter", "INPUT", legacyFirewallJump...); err != nil {
			return fmt.Errorf("remove the earlier hook into %s: %w", iptables.ChainProxyFirewall, err)
		}
		n.legacyGone = true
	}
	for _, j := range RuleJumps() {
		if err := n.IPTables.EnsureRule(j.Table, j.Chain, j.Args...); err != nil {
			return fmt.Errorf("hook %s into %s/%s: %w", j.Args[len(j.Args)-1], j.Table, j.Chain, err)
		}
	}
	for _, es := range byPort {
		for _, e := range es {
			t.refs[e]++
		}
	}
	n.applied = t
	return nil
}

// SyncChanged brings the sets to snap. When snap says which ports changed
// since the snapshot the last sync applied, that sync succeeded with the
// same node IPs, and bc is a change (not a full list), it writes only the
// entries those ports and bc add and delete, in one ipset restore (none
// when there are none), and the rules again only when what they depend on
// changed (a set they match on filled or emptied, a load-balancer IP the
// node may not reach); otherwise it is Sync with bound(). It reports
// whether it was Sync.
func (n *Netfilter) SyncChanged(snap *lb.Snapshot, o Options, bc BindChange, bound func() []netip.Addr) (full bool, err error) {
	o.IPv6 = n.IPv6
	t := &n.applied
	names, ok := snap.DeltaSince(t.id)
	if !ok || t.id == 0 || bc.Full || !slices.Equal(t.nodeIPs, o.NodeIPs) {
		return true, n.Sync(snap, o, bound())
	}
	var b strings.Builder
	line := func(op, set, e string) { b.WriteString(op + " " + set + " " + e + " -exist\n") }
	for _, name := range names {
		sp := snap.Ports.Get(name)
		old, es := t.ports[name], portEntries(sp, o)
		for _, e := range old {
			if t.refs[e]--; t.refs[e] == 0 {
				delete(t.refs, e)
				t.entries[e.set]--
				if !slices.Contains(es, e) {
					line("del", e.set, e.entry)
				}
			}
		}
		for _, e := range es {
			if t.refs[e]++; t.refs[e] == 1 {
				t.entries[e.set]++
				if !slices.Contains(old, e) {
					line("add", e.set, e.entry)
				}
			}
		}
		if len(es) > 0 {
			t.ports[name] = es
		} else {
			delete(t.ports, name)
		}
		if nn := portNoNodeAccess(sp, o); len(nn) > 0 {
			t.noNode[name] = nn
		} else {
			delete(t.noNode, name)
		}
	}
	ips := SetName(SetIPVSIPs, n.IPv6)
	for _, a := range bc.Del {
		if a.Is6() == n.IPv6 {
			line("del", ips, a.String())
			t.entries[ips]--
		}
	}
	for _, a := range bc.Add {
		if a.Is6() == n.IPv6 {
			line("add", ips, a.String())
			t.entries[ips]++
		}
	}
	in := t.inputs(n.IPv6)
	key := rulesKey(in)
	if b.Len() == 0 && key == t.rules {
		t.id = snap.ID
		return false, nil
	}
	t.id = 0 // until the restores succeed
	if b.Len() > 0 {
		if err := n.Sets.Restore([]byte(b.String())); err != nil {
			return false, fmt.Errorf("ipsets: %w", err)
		}
	}
	if key != t.rules {
		if err := n.IPTables.Restore(renderRules(o, n.MasqueradeBit, n.MasqueradeAll, n.Local, n.RandomFully, in)); err != nil {
			return false, fmt.Errorf("iptables rules: %w", err)
		}
		t.rules = key
	}
	t.id = snap.ID
	return false, nil
}

// CleanupNetfilter removes what only IPVS mode installs in iptables (its
// own chains and their jumps), empties the chains it shares with iptables
// mode (KUBE-SERVICES, KUBE-POSTROUTING: iptables mode's clean-up deletes
// them), and then destroys its sets, which nothing references any more.
// When IPVS mode's own chains are absent, no rule is touched.
func CleanupNetfilter(r iptables.Runner, sets SetRunner, ipv6 bool) error {
	var errs []string
	chains := map[string][]string{}
	for _, t := range []string{"nat", "filter"} {
		cs, err := r.Chains(t)
		if err != nil {
			errs = append(errs, err.Error())
		}
		chains[t] = cs
	}
	ipvsOnly := map[string][]string{"nat": {ChainNodePort, ChainLoadBalancer}, "filter": {ChainNodePort, ChainIPVSFilter, ChainSourceRanges, ChainIPVSOutFilter}}
	installed := false
	for t, cs := range ipvsOnly {
		for _, c := range cs {
			installed = installed || slices.Contains(chains[t], c)
		}
	}
	if installed {
		for _, j := range RuleJumps() {
			// Its own jumps; iptables mode's clean-up removes the ones
			// that are also iptables mode's.
			tg := j.Args[len(j.Args)-1]
			if !sharedJump(j) && slices.Contains(chains[j.Table], tg) {
				if err := r.DeleteRule(j.Table, j.Chain, j.Args...); err != nil {
					errs = append(errs, err.Error())
				}
			}
		}
		var flush strings.Builder
		flush.WriteString("*nat\n")
		for _, c := range []string{iptables.ChainServices, iptables.ChainPostrouting} {
			if slices.Contains(chains["nat"], c) {
				flush.WriteString(":" + c + " - [0:0]\n")
			}
		}
		flush.WriteString("COMMIT\n")
		if slices.Contains(chains["filter"], iptables.ChainProxyFirewall) {
			flush.WriteString("*filter\n:" + iptables.ChainProxyFirewall + " - [0:0]\nCOMMIT\n")
		}
		if err := r.Restore([]byte(flush.String())); err != nil {
			errs = append(errs, err.Error())
		}
		for _, t := range []string{"nat", "filter"} {
			for _, c := range ipvsOnly[t] {
				if slices.Contains(chains[t], c) {
					if err := r.DeleteChain(t, c); err != nil {
						errs = append(errs, err.Error())
					}
				}
			}
		}
	}
	if sets != nil {
		have, err := sets.List()
		if err != nil {
			errs = append(errs, err.Error())
		}
		for _, s := range setTypes {
			name := SetName(s.Name, ipv6)
			if slices.Contains(have, name) {
				if err := sets.Destroy(name); err != nil {
					errs = append(errs, err.Error())
				}
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("IPVS netfilter cleanup: %s", strings.Join(errs, "; "))
	}
	return nil
}
