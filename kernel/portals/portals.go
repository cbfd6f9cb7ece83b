// Package portals owns userspace VIP capture: how traffic sent to a
// ClusterIP, or to an external or load-balancer IP that is not an address
// of this host, reaches the userspace proxy's listener for that service
// port. Four methods exist:
//
//   - nftables: the same redirects in a table of sluice's own,
//     sluice-portals (ip and ip6), through knftables and nft;
//   - iptables: REDIRECT (or DNAT) rules in KUBE-PORTALS-CONTAINER (hooked
//     from nat PREROUTING) and KUBE-PORTALS-HOST (from nat OUTPUT) send
//     VIP:port to the port's proxy port, like legacy kube-proxy's portals;
//   - bind: the VIPs become addresses of a dummy interface (or of lo where
//     the kernel has no dummy link type) through netlink, and the listeners
//     bind VIP:port directly, with no netfilter at all;
//   - none: nothing is captured.
//
// Rules and addresses are rendered from a list of Portals as a pure
// function, then applied through small interfaces with stateful fakes.
package portals

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/lb"
)

// The capture methods.
const (
	MethodAuto     = "auto"
	MethodIPTables = "iptables"
	// MethodNFTables captures through an nftables table of sluice's own
	// (Linux): a node with nftables and no iptables binaries is served too.
	MethodNFTables = "nftables"
	MethodBind     = "bind"
	MethodNone     = "none"
)

// NFTablesTable is the nftables method's table, in the ip and ip6
// families: base chains prerouting and output (nat, dstnat priority), the
// same portals as the iptables method's KUBE-PORTALS-CONTAINER and -HOST.
const NFTablesTable = "sluice-portals"

// The chains of the iptables method, as legacy kube-proxy named them.
const (
	ChainContainer = "KUBE-PORTALS-CONTAINER"
	ChainHost      = "KUBE-PORTALS-HOST"
)

// Portal is one captured service address: traffic to IP:Port over
// Protocol goes to To, a proxy port listener. An unspecified To address
// means "this host, whichever address the packet came in on" (REDIRECT).
type Portal struct {
	Service  string // ns/name:port, for the rule comment
	Protocol lb.Protocol
	IP       netip.Addr
	Port     uint16
	To       netip.AddrPort
	// SourceRanges, when set, captures only clients inside them
	// (loadBalancerSourceRanges); others are not redirected.
	SourceRanges []netip.Prefix
}

// Dest is where a portal captures: its protocol, address and port, as a
// comparable key. The sets that hold one per portal (the nftables
// method's applied elements, the capture's collision counts) keep it in
// 20 bytes with no pointer, where a protocol string and a netip.AddrPort
// were 48 bytes and two (issue 16's memory budget).
type Dest struct {
	ip    [16]byte // As16
	port  uint16
	proto uint8 // index in destProtocols; 0: none of them
	is4   bool
}

// destProtocols are the protocols a Dest tells apart (the sources admit no
// others), at their codes.
var destProtocols = [...]lb.Protocol{1: lb.TCP, 2: lb.UDP, 3: lb.SCTP}

// DestOf is where p captures.
func DestOf(p Portal) Dest { return destOf(p.Protocol, netip.AddrPortFrom(p.IP, p.Port)) }

func destOf(proto lb.Protocol, vip netip.AddrPort) Dest {
	d := Dest{ip: vip.Addr().As16(), port: vip.Port(), is4: vip.Addr().Is4()}
	if i := slices.Index(destProtocols[:], proto); i > 0 {
		d.proto = uint8(i)
	}
	return d
}

// Protocol is d's protocol ("" for one other than TCP, UDP and SCTP).
func (d Dest) Protocol() lb.Protocol { return destProtocols[d.proto] }

// AddrPort is d's address and port.
func (d Dest) AddrPort() netip.AddrPort {
	a := netip.AddrFrom16(d.ip)
	if d.is4 {
		a = a.Unmap()
	}
	return netip.AddrPortFrom(a, d.port)
}

func (p Portal) String() string {
	return fmt.Sprintf("%s %s %s -> %s", p.Service, p.Protocol, netip.AddrPortFrom(p.IP, p.Port), p.To)
}

// sortedPortals is ps sorted by String, each made once (a sort that made
// them per comparison took 1.7 s of CPU for 10 sorts of 10,000 portals).
func sortedPortals(ps []Portal) []Portal {
	type keyed struct {
		key string
		p   Portal
	}
	ks := make([]keyed, len(ps))
	for i, p := range ps {
		ks[i] = keyed{p.String(), p}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	out := make([]Portal, len(ps))
	for i, k := range ks {
		out[i] = k.p
	}
	return out
}

// Jumps are the rules that hook the portal chains into nat PREROUTING and
// OUTPUT, inserted at the top as legacy kube-proxy inserted them.
func Jumps() []iptables.Jump {
	c := []string{"-m", "comment", "--comment", "handle ClusterIPs; NOTE: this must be before the NodePort rules"}
	return []iptables.Jump{
		{Table: "nat", Chain: "PREROUTING", Args: append(slices.Clone(c), "-j", ChainContainer)},
		{Table: "nat", Chain: "OUTPUT", Args: append(slices.Clone(c), "-j", ChainHost)},
	}
}

// RenderIPTables renders the nat table's portal chains for one family as
// iptables-restore input. Both chains are declared, so a restore with
// --noflush replaces their contents whole; portals of the other family are
// left out. Rules are sorted, so equal inputs render equal bytes.
func RenderIPTables(ps []Portal, ipv6 bool) []byte {
	var b strings.Builder
	b.WriteString("*nat\n")
	b.WriteString(":" + ChainContainer + " - [0:0]\n")
	b.WriteString(":" + ChainHost + " - [0:0]\n")
	sorted := sortedPortals(ps)
	bits := "/32"
	if ipv6 {
		bits = "/128"
	}
	for _, p := range sorted {
		if p.IP.Is6() != ipv6 {
			continue
		}
		proto := strings.ToLower(string(p.Protocol))
		match := fmt.Sprintf("-m comment --comment %s -p %s -m %s --dport %d -d %s%s", strconv.Quote(p.Service), proto, proto, p.Port, p.IP, bits)
		var target string
		if !p.To.Addr().IsValid() || p.To.Addr().IsUnspecified() {
			target = fmt.Sprintf("-j REDIRECT --to-ports %d", p.To.Port())
		} else {
			target = "-j DNAT --to-destination " + p.To.String()
		}
		sources := []string{""}
		if len(p.SourceRanges) > 0 {
			sources = nil
			for _, r := range p.SourceRanges {
				if r.Addr().Is6() == ipv6 {
					sources = append(sources, " -s "+r.String())
				}
			}
		}
		for _, src := range sources {
			b.WriteString("-A " + ChainContainer + " " + match + src + " " + target + "\n")
			b.WriteString("-A " + ChainHost + " " + match + src + " " + target + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String())
}

// IPTables applies portals for one family through an iptables.Runner: one
// iptables-restore per Sync, then the jump rules are ensured.
type IPTables struct {
	Runner iptables.Runner
	IPv6   bool
}

// Sync makes the portal chains hold exactly ps (of this family).
func (c *IPTables) Sync(ps []Portal) error {
	if err := c.Runner.Restore(RenderIPTables(ps, c.IPv6)); err != nil {
		return fmt.Errorf("apply portal rules: %w", err)
	}
	for _, j := range Jumps() {
		if err := c.Runner.EnsureRule(j.Table, j.Chain, j.Args...); err != nil {
			return fmt.Errorf("hook %s into nat %s: %w", j.Args[len(j.Args)-1], j.Chain, err)
		}
	}
	return nil
}

// CleanupIPTables removes the portal chains and their jump rules, and
// nothing else. It is idempotent.
func CleanupIPTables(r iptables.Runner) error {
	chains, err := r.Chains("nat")
	if err != nil {
		return fmt.Errorf("remove portal rules: %w", err)
	}
	if !slices.Contains(chains, ChainContainer) && !slices.Contains(chains, ChainHost) {
		return nil // never installed (or already removed): touch nothing
	}
	var errs []string
	for _, j := range Jumps() {
		if err := r.DeleteRule(j.Table, j.Chain, j.Args...); err != nil {
			errs = append(errs, err.Error())
		}
	}
	for _, ch := range []string{ChainContainer, ChainHost} {
		if err := r.DeleteChain("nat", ch); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove portal rules: %s", strings.Join(errs, "; "))
	}
	return nil
}
