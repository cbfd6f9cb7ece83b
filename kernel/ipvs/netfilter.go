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
	var ranges []netip.Prefix
	for _, r := range sp.SourceRanges() {
		if fam(r.Addr()) {
			ranges = append(ranges, r)
		}
	}
	nodeInRange := false
	for _, r := range ranges {
		for _, n := range o.NodeIPs {
			nodeInRange = nodeInRange || r.Contains(n)
		}
	}
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
	if sp.NodePort != 0 && hasFamily {
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
	if sp.HealthCheckNodePort != 0 && hasFamily {
		add(SetHealthCheck, fmt.Sprint(sp.HealthCheckNodePort))
	}
	for _, ep := range sp.Endpoints {
		if ep.Local && fam(ep.Addr.Addr()) {
			add(SetLoopBack, fmt.Sprintf("%s,%s:%d,%s", ep.Addr.Addr(), proto, ep.Addr.Port(), ep.Addr.Addr()))
		}
	}
	return out
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

// RenderRules renders IPVS mode's iptables-restore input for one family:
// masquerade for traffic to cluster IPs that local (--detect-local-mode)
// does not match (or all, with --masquerade-all), to NodePorts and LB IPs unless their policy
// is Local, hairpin masquerade (KUBE-LOOP-BACK), the health check node
// ports, and the rejection of other ports on addresses bound to
// kube-ipvs0. Chains shared with iptables mode keep their names.
func RenderRules(o Options, masqueradeBit int, masqueradeAll bool, local localtraffic.Match) []byte {
	return renderRules(o, masqueradeBit, masqueradeAll, local, false)
}

// renderRules is RenderRules, with --random-fully on the SNAT rule when
// iptables has it (as kube-proxy's IPVS mode).
func renderRules(o Options, masqueradeBit int, masqueradeAll bool, local localtraffic.Match, randomFully bool) []byte {
	set := func(n string) string { return SetName(n, o.IPv6) }
	mark := fmt.Sprintf("%#08x", 1<<masqueradeBit)
	c := func(s string) string { return "-m comment --comment \"" + s + "\"" }
	var b strings.Builder
	l := func(s string) { b.WriteString(s + "\n") }
	l("*nat")
	for _, ch := range []string{iptables.ChainServices, iptables.ChainPostrouting, ChainNodePort, ChainLoadBalancer, iptables.ChainMarkMasq} {
		l(":" + ch + " - [0:0]")
	}
	if !o.IPv6 {
		l("-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN")
	}
	l("-A KUBE-POSTROUTING " + c("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose") + " -m set --match-set " + set(SetLoopBack) + " dst,dst,src -j MASQUERADE")
	l("-A KUBE-POSTROUTING -m mark ! --mark " + mark + "/" + mark + " -j RETURN")
	l("-A KUBE-POSTROUTING -j MARK --xor-mark " + mark)
	if randomFully {
		l("-A KUBE-POSTROUTING " + c("kubernetes service traffic requiring SNAT") + " -j MASQUERADE --random-fully")
	} else {
		l("-A KUBE-POSTROUTING " + c("kubernetes service traffic requiring SNAT") + " -j MASQUERADE")
	}
	l("-A KUBE-MARK-MASQ -j MARK --or-mark " + mark)
	l("-A KUBE-SERVICES " + c("Kubernetes service lb portal") + " -m set --match-set " + set(SetLoadBalancer) + " dst,dst -j " + ChainLoadBalancer)
	l("-A KUBE-LOAD-BALANCER -m set --match-set " + set(SetLoadBalancerLocal) + " dst,dst -j RETURN")
	l("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ")
	cip := c("Kubernetes service cluster ip + port for masquerade purpose") + " -m set --match-set " + set(SetClusterIP)
	switch {
	case masqueradeAll:
		l("-A KUBE-SERVICES " + cip + " dst,dst -j KUBE-MARK-MASQ")
	case local.IsSet():
		l("-A KUBE-SERVICES " + strings.Join(local.IPTables(true), " ") + " " + cip + " dst,dst -j KUBE-MARK-MASQ")
	default:
		l("-A KUBE-SERVICES " + cip + " src,dst -j KUBE-MARK-MASQ")
	}
	l("-A KUBE-SERVICES " + c("Kubernetes service external ip + port for masquerade and filter purpose") + " -m set --match-set " + set(SetExternalIP) + " dst,dst -j KUBE-MARK-MASQ")
	l("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j " + ChainNodePort)
	for _, p := range []struct{ proto, local, all string }{{"tcp", SetNodePortLocalTCP, SetNodePortTCP}, {"udp", SetNodePortLocalUDP, SetNodePortUDP}} {
		l("-A KUBE-NODE-PORT -p " + p.proto + " -m set --match-set " + set(p.local) + " dst -j RETURN")
		l("-A KUBE-NODE-PORT -p " + p.proto + " " + c("Kubernetes nodeport "+strings.ToUpper(p.proto)+" port for masquerade purpose") + " -m set --match-set " + set(p.all) + " dst -j KUBE-MARK-MASQ")
	}
	l("-A KUBE-NODE-PORT -p sctp -m set --match-set " + set(SetNodePortLocalSCTP) + " dst,dst -j RETURN")
	l("-A KUBE-NODE-PORT -p sctp " + c("Kubernetes nodeport SCTP port for masquerade purpose") + " -m set --match-set " + set(SetNodePortSCTP) + " dst,dst -j KUBE-MARK-MASQ")
	l("COMMIT")
	l("*filter")
	for _, ch := range []string{iptables.ChainForward, ChainNodePort, ChainIPVSFilter, iptables.ChainProxyFirewall, ChainSourceRanges} {
		l(":" + ch + " - [0:0]")
	}
	l("-A KUBE-PROXY-FIREWALL " + c("Kubernetes service load balancer ip + port for load balancer with sourceRange") + " -m set --match-set " + set(SetLoadBalancerFW) + " dst,dst -j " + ChainSourceRanges)
	l("-A KUBE-SOURCE-RANGES-FIREWALL -m set --match-set " + set(SetLBSourceCIDR) + " dst,dst,src -j RETURN")
	l("-A KUBE-SOURCE-RANGES-FIREWALL -m set --match-set " + set(SetLBSourceIP) + " dst,dst,src -j RETURN")
	l("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP")
	l("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP")
	l("-A KUBE-FORWARD " + c("kubernetes forwarding rules") + " -m mark --mark " + mark + "/" + mark + " -j ACCEPT")
	l("-A KUBE-FORWARD " + c("kubernetes forwarding conntrack rule") + " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
	l("-A KUBE-NODE-PORT " + c("Kubernetes health check node port") + " -m set --match-set " + set(SetHealthCheck) + " dst -j ACCEPT")
	for _, s := range []string{SetLoadBalancer, SetClusterIP, SetExternalIP, SetExternalIPLocal} {
		l("-A KUBE-IPVS-FILTER -m set --match-set " + set(s) + " dst,dst -j RETURN")
	}
	l("-A KUBE-IPVS-FILTER -m set --match-set " + set(SetHealthCheck) + " dst -j RETURN")
	l("-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set " + set(SetIPVSIPs) + " dst -j REJECT")
	l("COMMIT")
	return []byte(b.String())
}

// RuleJumps hooks IPVS mode's chains into the built-in ones.
func RuleJumps() []iptables.Jump {
	cm := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	j := func(table, chain, target string, comment string) iptables.Jump {
		return iptables.Jump{Table: table, Chain: chain, Args: append(cm(comment), "-j", target)}
	}
	return []iptables.Jump{
		j("nat", "PREROUTING", iptables.ChainServices, "kubernetes service portals"),
		j("nat", "OUTPUT", iptables.ChainServices, "kubernetes service portals"),
		j("nat", "POSTROUTING", iptables.ChainPostrouting, "kubernetes postrouting rules"),
		j("filter", "FORWARD", iptables.ChainForward, "kubernetes forwarding rules"),
		j("filter", "INPUT", ChainNodePort, "kubernetes health check rules"),
		j("filter", "INPUT", ChainIPVSFilter, "kubernetes ipvs access filter"),
		{Table: "filter", Chain: "INPUT", Args: append([]string{"-m", "conntrack", "--ctstate", "NEW"}, append(cm("kubernetes load balancer firewall"), "-j", iptables.ChainProxyFirewall)...)},
	}
}

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
}

// setTable is what the syncs so far left in the sets, by service port.
type setTable struct {
	id      uint64 // the snapshot applied; 0: the next sync writes everything
	nodeIPs []netip.Addr
	refs    map[setEntry]int // how many ports want each entry
	ports   map[lb.ServicePortName][]setEntry
}

// Sync applies the sets, then the rules that match on them, then the jumps.
func (n *Netfilter) Sync(snap *lb.Snapshot, o Options, bound []netip.Addr) error {
	o.IPv6 = n.IPv6
	n.applied = setTable{}
	specs, entries, byPort := sets(snap, o, bound)
	if err := n.Sets.Restore(RestoreSets(specs, entries, n.IPv6)); err != nil {
		return fmt.Errorf("ipsets: %w", err)
	}
	if err := n.IPTables.Restore(renderRules(o, n.MasqueradeBit, n.MasqueradeAll, n.Local, n.RandomFully)); err != nil {
		return fmt.Errorf("iptables rules: %w", err)
	}
	for _, j := range RuleJumps() {
		if err := n.IPTables.EnsureRule(j.Table, j.Chain, j.Args...); err != nil {
			return fmt.Errorf("hook %s into %s/%s: %w", j.Args[len(j.Args)-1], j.Table, j.Chain, err)
		}
	}
	t := setTable{id: snap.ID, nodeIPs: slices.Clone(o.NodeIPs), refs: map[setEntry]int{}, ports: byPort}
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
// when there are none), and leaves the rules, which do not depend on
// the snapshot, to the full syncs; otherwise it is Sync with bound(). It
// reports whether it was Sync.
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
		old, es := t.ports[name], portEntries(snap.Ports.Get(name), o)
		for _, e := range old {
			if t.refs[e]--; t.refs[e] == 0 {
				delete(t.refs, e)
				if !slices.Contains(es, e) {
					line("del", e.set, e.entry)
				}
			}
		}
		for _, e := range es {
			if t.refs[e]++; t.refs[e] == 1 && !slices.Contains(old, e) {
				line("add", e.set, e.entry)
			}
		}
		if len(es) > 0 {
			t.ports[name] = es
		} else {
			delete(t.ports, name)
		}
	}
	ips := SetName(SetIPVSIPs, n.IPv6)
	for _, a := range bc.Del {
		if a.Is6() == n.IPv6 {
			line("del", ips, a.String())
		}
	}
	for _, a := range bc.Add {
		if a.Is6() == n.IPv6 {
			line("add", ips, a.String())
		}
	}
	if b.Len() == 0 {
		t.id = snap.ID
		return false, nil
	}
	t.id = 0 // until the restore succeeds
	if err := n.Sets.Restore([]byte(b.String())); err != nil {
		return false, fmt.Errorf("ipsets: %w", err)
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
	ipvsOnly := map[string][]string{"nat": {ChainNodePort, ChainLoadBalancer}, "filter": {ChainNodePort, ChainIPVSFilter, ChainSourceRanges}}
	installed := false
	for t, cs := range ipvsOnly {
		for _, c := range cs {
			installed = installed || slices.Contains(chains[t], c)
		}
	}
	if installed {
		for _, j := range RuleJumps() {
			tg := j.Args[len(j.Args)-1]
			if slices.Contains(ipvsOnly[j.Table], tg) && slices.Contains(chains[j.Table], tg) {
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
