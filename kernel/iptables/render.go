// Package iptables owns sluice's iptables mode: kube-proxy's chain layout
// rendered from an lb.Snapshot as a pure function (Render), applied with one
// iptables-restore --noflush per sync through the small Runner interface,
// with a stateful Fake that parses restore input, refuses what the kernel
// refuses and traces packets through the rules. --cleanup removes every
// chain and jump rule it installs.
package iptables

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/kernel/localtraffic"
	"github.com/sluice-proxy/sluice/lb"
)

// Options are the settings one family's rules depend on.
type Options struct {
	IPv6 bool
	// MasqueradeBit is --iptables-masquerade-bit (0-31); kube-proxy's default is 14.
	MasqueradeBit int
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// Local tells pod traffic apart (--detect-local-mode): traffic to a
	// cluster IP from elsewhere is masqueraded, and pod traffic to an
	// external IP of a Service with a Local external policy takes the
	// cluster path. Unset means no local detector: neither rule.
	Local localtraffic.Match
	// LocalhostNodePorts lets NodePorts answer on 127.0.0.0/8 (IPv4 only).
	LocalhostNodePorts bool
	// NodePortAddresses are the addresses NodePorts answer on; nil means
	// every local address.
	NodePortAddresses []netip.Addr
	// NodeIPs are the node's addresses: an LB IP is allowed through
	// KUBE-FW-* as a source when a source range contains one of them.
	NodeIPs []netip.Addr
	// RandomFully adds --random-fully to MASQUERADE.
	RandomFully bool
	// TCPBeLiberal is net.netfilter.nf_conntrack_tcp_be_liberal set: the
	// ctstate INVALID drop is left out then, as kube-proxy leaves it.
	TCPBeLiberal bool
	// InvalidDropCounter names the nfacct counter the INVALID drop counts
	// into (kube-proxy's ct_state_invalid_dropped_pkts), when the kernel
	// has it.
	InvalidDropCounter string
	// LocalhostNodePortCounter names the nfacct counter that packets to a
	// NodePort on 127.0.0.0/8 count into (kube-proxy's
	// localhost_nps_accepted_pkts), when the kernel has it: each NodePort
	// then has a rule for 127.0.0.0/8 before its own, as kube-proxy's.
	LocalhostNodePortCounter string
	// ExistingNATChains are the nat table's chains now (from iptables-save):
	// unused per-service ones are deleted in the same restore.
	ExistingNATChains []string

	// largeCluster is set by the render when the snapshot has more than
	// LargeClusterEndpoints endpoints.
	largeCluster bool
}

// LargeClusterEndpoints is kube-proxy's largeClusterEndpointsThreshold:
// above it the KUBE-SVC-* and KUBE-SEP-* rules carry no comment, which
// makes the ruleset (and its restore) about a third smaller.
const LargeClusterEndpoints = 1000

// Mark is the masquerade mark as kube-proxy prints it ("0x00004000").
func (o Options) Mark() string { return fmt.Sprintf("%#08x", 1<<o.MasqueradeBit) }

// Jump is a rule in a built-in chain that hooks one of ours.
type Jump struct {
	Table, Chain string // e.g. nat, PREROUTING
	Args         []string
}

// Jumps lists the rules that hook our chains into the built-in ones,
// inserted at the top of each, as kube-proxy inserts them.
func Jumps(o Options) []Jump {
	c := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	ctNew := []string{"-m", "conntrack", "--ctstate", "NEW"}
	j := func(table, chain string, target string, args ...[]string) Jump {
		var all []string
		for _, a := range args {
			all = append(all, a...)
		}
		return Jump{Table: table, Chain: chain, Args: append(all, "-j", target)}
	}
	out := []Jump{
		j("filter", "INPUT", ChainExternalServices, ctNew, c("kubernetes externally-visible service portals")),
		j("filter", "FORWARD", ChainExternalServices, ctNew, c("kubernetes externally-visible service portals")),
		j("filter", "INPUT", ChainNodePorts, c("kubernetes health check service ports")),
		j("filter", "FORWARD", ChainServices, ctNew, c("kubernetes service portals")),
		j("filter", "OUTPUT", ChainServices, ctNew, c("kubernetes service portals")),
		j("filter", "FORWARD", ChainForward, c("kubernetes forwarding rules")),
		j("filter", "INPUT", ChainProxyFirewall, ctNew, c("kubernetes load balancer firewall")),
		j("filter", "OUTPUT", ChainProxyFirewall, ctNew, c("kubernetes load balancer firewall")),
		j("filter", "FORWARD", ChainProxyFirewall, ctNew, c("kubernetes load balancer firewall")),
		j("nat", "OUTPUT", ChainServices, c("kubernetes service portals")),
		j("nat", "PREROUTING", ChainServices, c("kubernetes service portals")),
		j("nat", "POSTROUTING", ChainPostrouting, c("kubernetes postrouting rules")),
		// Last, so first in INPUT and OUTPUT, in both families, whether
		// or not the chain holds the localnet drop (kube-proxy v1.34.2, seen
		// by TestIPTablesParityWithKubeProxy).
		j("filter", "INPUT", ChainFirewall),
		j("filter", "OUTPUT", ChainFirewall),
	}
	return out
}

// withoutExisting is o for comparing renderings: the chains that exist
// only decide what is deleted.
func (o Options) withoutExisting() Options {
	o.ExistingNATChains = nil
	return o
}

func (o Options) localhostFirewall() bool { return !o.IPv6 && o.LocalhostNodePorts }

// CanaryTables are the tables that hold a KUBE-PROXY-CANARY chain: when a
// firewall reload flushes them, the chain is gone and a full sync follows.
// The first is the one read every time (Proxier.CanaryGone).
var CanaryTables = []string{"mangle", "nat", "filter"}

type writer struct{ b bytes.Buffer }

func (w *writer) line(parts ...string) {
	for i, p := range parts {
		if i > 0 {
			w.b.WriteByte(' ')
		}
		w.b.WriteString(p)
	}
	w.b.WriteByte('\n')
}

func quote(s string) string { return strconv.Quote(s) }

// rule starts the line "-A chain"; add and the others below append to it,
// each word after a space, and end ends it.
func (w *writer) rule(chain string) {
	w.b.WriteString("-A ")
	w.b.WriteString(chain)
}

func (w *writer) add(words ...string) {
	for _, s := range words {
		w.b.WriteByte(' ')
		w.b.WriteString(s)
	}
}

func (w *writer) end() { w.b.WriteByte('\n') }

// declare writes a chain's declaration line, ":chain - [0:0]".
func (w *writer) declare(chain string) {
	w.b.WriteByte(':')
	w.b.WriteString(chain)
	w.b.WriteString(" - [0:0]\n")
}

func (w *writer) addr(a netip.Addr) {
	w.b.WriteByte(' ')
	w.b.Write(a.AppendTo(w.b.AvailableBuffer()))
}

func (w *writer) addrPort(a netip.AddrPort) {
	w.b.WriteByte(' ')
	w.b.Write(a.AppendTo(w.b.AvailableBuffer()))
}

func (w *writer) prefix(p netip.Prefix) {
	w.b.WriteByte(' ')
	w.b.Write(p.AppendTo(w.b.AvailableBuffer()))
}

// local appends m's match ("-s CIDR", "-i NAME" or "-i PREFIX+"), negated
// with "!", without the allocation of m.IPTables.
func (w *writer) local(m localtraffic.Match, negate bool) {
	if negate {
		w.b.WriteString(" !")
	}
	switch {
	case m.CIDR.IsValid():
		w.b.WriteString(" -s")
		w.prefix(m.CIDR)
	case m.Prefix:
		w.b.WriteString(" -i ")
		w.b.WriteString(m.Interface)
		w.b.WriteByte('+')
	default:
		w.b.WriteString(" -i ")
		w.b.WriteString(m.Interface)
	}
}

// dest appends "-d addr --dport port".
func (w *writer) dest(a netip.Addr, port string) {
	w.b.WriteString(" -d")
	w.addr(a)
	w.add("--dport", port)
}

// toService writes a whole rule for traffic to one of a service's
// addresses: "-A chain", the comment, the protocol match, "-d ip --dport
// port" and "-j target".
func (w *writer) toService(chain string, match []string, ip netip.Addr, port, target string, comment ...string) {
	w.rule(chain)
	w.comment(comment...)
	w.add(match...)
	w.dest(ip, port)
	w.add("-j", target)
	w.end()
}

// probability appends kube-proxy's "%0.10f" of 1/n.
func (w *writer) probability(n int) {
	w.b.WriteByte(' ')
	w.b.Write(strconv.AppendFloat(w.b.AvailableBuffer(), 1.0/float64(n), 'f', 10, 64))
}

// comment appends "-m comment --comment" and the parts as one string,
// quoted as strconv.Quote quotes it (the parts are copied as they are
// when no byte of them needs escaping).
func (w *writer) comment(parts ...string) {
	w.b.WriteString(" -m comment --comment ")
	for _, p := range parts {
		if !quotesAsIs(p) {
			w.b.WriteString(strconv.Quote(strings.Join(parts, "")))
			return
		}
	}
	w.b.WriteByte('"')
	for _, p := range parts {
		w.b.WriteString(p)
	}
	w.b.WriteByte('"')
}

// quotesAsIs reports whether strconv.Quote leaves every byte of s as it
// is: printable ASCII other than the quote and the backslash.
func quotesAsIs(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func (o Options) family(a netip.Addr) bool { return a.Is6() == o.IPv6 }

// filter is the addresses of o's family: addrs itself when all of them
// are (the caller only reads it), else a copy of those that are.
func (o Options) filter(addrs []netip.Addr) []netip.Addr {
	if !slices.ContainsFunc(addrs, func(a netip.Addr) bool { return !o.family(a) }) {
		return addrs
	}
	var out []netip.Addr
	for _, a := range addrs {
		if o.family(a) {
			out = append(out, a)
		}
	}
	return out
}

// filterEPs is filter for endpoints.
func (o Options) filterEPs(eps []netip.AddrPort) []netip.AddrPort {
	if !slices.ContainsFunc(eps, func(e netip.AddrPort) bool { return !o.family(e.Addr()) }) {
		return eps
	}
	var out []netip.AddrPort
	for _, e := range eps {
		if o.family(e.Addr()) {
			out = append(out, e)
		}
	}
	return out
}

// Render returns the iptables-restore input for one family: the filter and
// nat tables' chains, every rule of every service port in snap, and the
// deletion of per-service chains no longer used. It is a pure function:
// the same snapshot and options give the same bytes.
func Render(snap *lb.Snapshot, o Options) []byte {
	data, _, _ := RenderPartial(snap, o, nil)
	return data
}

// Bodies are fingerprints of each service port's own chains (KUBE-SVC-,
// KUBE-SVL-, KUBE-EXT-, KUBE-SEP-), as last applied.
type Bodies map[lb.ServicePortName]uint64

// RenderPartial is Render for a partial sync: a service port whose chains
// render to the same fingerprint as in applied is left out (its chains are
// neither declared nor rewritten, so iptables-restore --noflush keeps
// them), while the top-level chains (KUBE-SERVICES, KUBE-NODEPORTS,
// KUBE-EXTERNAL-SERVICES, ...) are rewritten whole (the proxier's own
// partial syncs leave them out too when unchanged: TopSums). A nil applied
// renders everything: a full sync. It returns the fingerprints to pass to
// the next sync once this one is applied, and the per-service chains that
// exist once it is.
func RenderPartial(snap *lb.Snapshot, o Options, applied Bodies) ([]byte, Bodies, []string) {
	r := renderPartial(snap, o, applied, nil, false, nil, hookPlan{})
	chains := make([]string, 0, len(r.active))
	for c := range r.active {
		chains = append(chains, c)
	}
	return r.data, r.bodies, chains
}

// rendered is one render's output: the restore input, the fingerprints
// and chains as RenderPartial returns them, and the rules of the nat
// chains it left out because they are unchanged (kube-proxy's
// skippedNatRules, for sync_proxy_rules_iptables_total).
type rendered struct {
	data   []byte
	bodies Bodies
	// active are the per-service chains that exist once it is applied.
	active     map[string]bool
	skippedNAT int
	// top fingerprints the top-level chains as rendered, for the next
	// partial sync; filterRules are the filter table's rules, written or
	// not.
	top         TopSums
	filterRules int
	// sorted, endpoints and bodyRulesAll are the ports in name order,
	// their endpoints and their own chains' rules, for a delta next.
	sorted       []*lb.ServicePort
	endpoints    int
	bodyRulesAll int
}

// TopSums fingerprint the top-level chains of a render: the filter
// table's (all of them are top-level) and the nat table's (KUBE-SERVICES,
// KUBE-NODEPORTS, KUBE-POSTROUTING, KUBE-MARK-MASQ). A partial sync whose
// top-level chains render as last applied leaves them out of the restore:
// an endpoint change touches only its service's own chains, and at 10k
// services on iptables-nft rewriting 20k unchanged top-level rules was
// most of a partial sync (kube-proxy rewrites them every time).
type TopSums struct{ Filter, NAT uint64 }

// rulesIn counts the lines of b that are rules ("-A ...").
func rulesIn(b []byte) int {
	n := bytes.Count(b, []byte("\n-A "))
	if bytes.HasPrefix(b, []byte("-A ")) {
		n++
	}
	return n
}

// RuleCounts are the "-A" rules in a restore input's filter and nat
// tables.
func RuleCounts(data []byte) (filter, nat int) {
	if bytes.HasPrefix(data, []byte("*nat\n")) {
		return 0, rulesIn(data) // a partial sync that left the filter table out
	}
	i := bytes.Index(data, []byte("\n*nat\n"))
	if i < 0 {
		return rulesIn(data), 0
	}
	return rulesIn(data[:i]), rulesIn(data[i:])
}

// portRender is one service port's rendering: its lines in the top-level
// chains, its chains and the fingerprint of their bodies.
type portRender struct {
	filter, nat []byte
	// chains are the port's own chains' names, space-separated (read with
	// strings.FieldsSeq): a []string of them, each name its own
	// allocation, was some 270 of the 1,142 bytes the proxier held per
	// port at 10 endpoints (issue 16's memory budget).
	chains    string
	sum       uint64
	bodyRules int // the rules in its own chains
}

// portCache keeps each service port's rendering by pointer: a snapshot
// shares the (immutable) ServicePorts that did not change with the one
// before, so a partial sync need not render them again to find them
// unchanged (bench sync, 1k services: most of a partial sync's 40 ms of
// rendering). Valid for one set of options.
type portCache struct {
	key   string
	ports map[*lb.ServicePort]portRender
	hits  int // ports taken from the cache, ever (for tests)
}

// renderPartial is RenderPartial with the proxier's port cache and, for a
// partial sync (known), the per-service chains the last one left, which
// are those of the ports in the cache: those not active any more are
// deleted, as o.ExistingNATChains' are on a full sync. Only the ports not
// carried over as they were are looked at: at 10k services a partial
// sync once listed 110k chain names to find the few stale ones.
//
// It also leaves out the top-level chains of a table whose fingerprint is
// as in lastTop (nil: none is left out), and writes hooks' lines where
// they go (the fingerprints leave them out).
func renderPartial(snap *lb.Snapshot, o Options, applied Bodies, cache *portCache, known bool, lastTop *TopSums, hooks hookPlan) rendered {
	mark := o.Mark()
	o, endpoints := o.forSnapshot(snap)
	pr := renderPorts(snap, o, mark, endpoints, applied, cache, known)
	r := assemble(pr, o, mark, lastTop, hooks)
	r.sorted, r.endpoints, r.bodyRulesAll = pr.sorted, endpoints, pr.bodyRulesAll
	return r
}

// portsRendered is the per-port half of a render: every port's lines in
// the top-level chains (in name order), the own chains it writes and
// their declarations, the chains that exist once it is applied and the
// stale ones it deletes.
type portsRendered struct {
	filterRules, natRules, natChains, bodyRules writer
	active                                      map[string]bool
	bodies                                      Bodies
	stale                                       []string
	// skipped are the rules of the own chains left out as unchanged;
	// bodyRulesAll those of every port's own chains, written or not.
	skipped, bodyRulesAll int
	// sorted are the snapshot's ports in name order (a full walk only).
	sorted []*lb.ServicePort
}

// renderPorts renders every port of snap, or takes it from cache when it
// is the very port rendered and applied before.
func renderPorts(snap *lb.Snapshot, o Options, mark string, endpoints int, applied Bodies, cache *portCache, known bool) *portsRendered {
	pr := &portsRendered{
		// Sized for every port's chains: an SVC, EXT and SEP per
		// endpoint, as most ports have (a map grown from empty to 120k
		// names was a tenth of a 10k-Service full render). It lives for
		// the render only.
		active: make(map[string]bool, max(len(o.ExistingNATChains), endpoints+2*snap.Ports.Len())),
		bodies: make(Bodies, snap.Ports.Len()),
	}
	active := pr.active
	scratch := newPortScratch()
	var portChains, declared []string
	chain := func(name string) {
		if !active[name] {
			active[name] = true
			portChains = append(portChains, name)
		}
	}
	if applied == nil {
		// A full sync writes every port's chains; a partial one only the
		// changed ports' (reserving for all of them cost 40 MB per
		// partial sync at 10k, the most of what one allocated).
		pr.bodyRules.b.Grow(snap.Ports.Len() * 4096)
	}
	pr.natRules.b.Grow(snap.Ports.Len() * 256)
	pr.natChains.b.Grow(snap.Ports.Len() * 512)
	var cached, last map[*lb.ServicePort]portRender
	if cache != nil {
		last = cache.ports
		key := o.cacheKey()
		if cache.key == key {
			cached = cache.ports
		}
		cache.key, cache.ports = key, make(map[*lb.ServicePort]portRender, snap.Ports.Len())
	}
	pr.sorted = snap.Sorted()
	for _, sp := range pr.sorted {
		if c, ok := cached[sp]; ok {
			if prev, ok := applied[sp.Name]; ok && prev == c.sum {
				// The same port as last time, applied as rendered.
				pr.filterRules.b.Write(c.filter)
				pr.natRules.b.Write(c.nat)
				for ch := range strings.FieldsSeq(c.chains) {
					active[ch] = true
				}
				if len(c.chains) > 0 {
					pr.bodies[sp.Name] = c.sum
				}
				pr.skipped += c.bodyRules
				pr.bodyRulesAll += c.bodyRules
				cache.ports[sp] = c
				cache.hits++
				continue
			}
		}
		portChains = portChains[:0]
		c, written := pr.renderPort(sp, o, mark, applied, &portChains, chain, scratch, cache != nil)
		if cache != nil {
			cache.ports[sp] = c
		}
		if written {
			declared = append(declared, portChains...)
		}
	}
	pr.declare(declared)
	for _, c := range o.ExistingNATChains {
		if IsServiceChain(c) && !active[c] {
			pr.stale = append(pr.stale, c)
		}
	}
	if known {
		for sp, c := range last {
			if now, ok := cache.ports[sp]; ok && now.chains == c.chains {
				continue // carried over, or rendered with the same chains
			}
			for ch := range strings.FieldsSeq(c.chains) {
				if !active[ch] {
					pr.stale = append(pr.stale, ch)
				}
			}
		}
	}
	return pr
}

// renderPort renders one port into pr: its lines in the top-level chains,
// and its own chains unless they are as applied (then only counted as
// skipped). It returns the port's rendering (its lines copied only when
// keep is set, for a cache) and whether its own chains were written;
// their names are left in *portChains.
func (pr *portsRendered) renderPort(sp *lb.ServicePort, o Options, mark string, applied Bodies, portChains *[]string, chain func(string), scratch *portScratch, keep bool) (portRender, bool) {
	// The port's own chains are written where they go, and taken back
	// out when unchanged.
	f0, n0, b0 := pr.filterRules.b.Len(), pr.natRules.b.Len(), pr.bodyRules.b.Len()
	renderPort(sp, o, mark, &pr.filterRules, &pr.natRules, &pr.bodyRules, chain, scratch)
	body := pr.bodyRules.b.Bytes()[b0:]
	sum := bodySum(*portChains, body)
	nBody := rulesIn(body)
	c := portRender{sum: sum, bodyRules: nBody}
	if keep {
		c.filter, c.nat = bytes.Clone(pr.filterRules.b.Bytes()[f0:]), bytes.Clone(pr.natRules.b.Bytes()[n0:])
		c.chains = strings.Join(*portChains, " ")
	}
	pr.bodyRulesAll += nBody
	if len(*portChains) == 0 {
		return c, false
	}
	prev, ok := applied[sp.Name] // before the line below: applied may be pr.bodies
	pr.bodies[sp.Name] = sum
	if ok && prev == sum {
		pr.skipped += nBody
		pr.bodyRules.b.Truncate(b0)
		return c, false // unchanged: the kernel has these chains as they are
	}
	return c, true
}

// declare writes the declarations of the own chains written.
func (pr *portsRendered) declare(chains []string) {
	// Declared in order of name: iptables-legacy-restore creates chains
	// in a list it keeps sorted, and fed them in the (hashed, so random)
	// order of the ports it took 15-20 % longer for the same rules (5k
	// Services x 10 endpoints, 60k chains: 4.5-4.8 s against 3.7-4.0 s).
	slices.Sort(chains)
	for _, c := range chains {
		pr.natChains.declare(c)
	}
}

// cacheKey is what a port's rendering depends on besides the port.
func (o Options) cacheKey() string { return fmt.Sprint(o.withoutExisting(), o.largeCluster) }

// assemble is the other half of a render: the tables' top-level chains
// around the ports' lines, and the restore input of them all.
func assemble(pr *portsRendered, o Options, mark string, lastTop *TopSums, hooks hookPlan) rendered {
	natRules, skipped := &pr.natRules, pr.skipped
	// The NodePort dispatch is the last rule of KUBE-SERVICES.
	npComment := []string{"-m", "comment", "--comment", quote("kubernetes service nodeports; NOTE: this must be the last rule in this chain")}
	if o.NodePortAddresses == nil {
		args := append([]string{"-A", ChainServices}, npComment...)
		args = append(args, "-m", "addrtype", "--dst-type", "LOCAL")
		if o.IPv6 {
			args = append(args, "!", "-d", "::1/128")
		} else if !o.LocalhostNodePorts {
			args = append(args, "!", "-d", "127.0.0.0/8")
		}
		natRules.line(append(args, "-j", ChainNodePorts)...)
	} else {
		for _, a := range o.filter(o.NodePortAddresses) {
			if a.IsLoopback() && (o.IPv6 || !o.LocalhostNodePorts) {
				continue
			}
			args := append([]string{"-A", ChainServices}, npComment...)
			natRules.line(append(args, "-d", a.String(), "-j", ChainNodePorts)...)
		}
	}

	var filter writer
	filter.line("*filter")
	for _, c := range []string{ChainServices, ChainExternalServices, ChainForward, ChainNodePorts, ChainProxyFirewall} {
		filter.declare(c)
	}
	filter.declare(ChainFirewall)
	if o.localhostFirewall() {
		filter.line("-A", ChainFirewall, "-m", "comment", "--comment", quote("block incoming localnet connections"),
			"-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8", "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP")
	}
	if !o.TCPBeLiberal {
		if o.InvalidDropCounter != "" {
			filter.line("-A", ChainForward, "-m", "conntrack", "--ctstate", "INVALID", "-m", "nfacct", "--nfacct-name", o.InvalidDropCounter, "-j", "DROP")
		} else {
			filter.line("-A", ChainForward, "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
		}
	}
	filter.line("-A", ChainForward, "-m", "comment", "--comment", quote("kubernetes forwarding rules"), "-m", "mark", "--mark", mark+"/"+mark, "-j", "ACCEPT")
	filter.line("-A", ChainForward, "-m", "comment", "--comment", quote("kubernetes forwarding conntrack rule"), "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	filter.b.Write(pr.filterRules.b.Bytes())
	filter.line("COMMIT")

	// The nat table's top-level chains: their rules, fingerprinted.
	var natTop writer
	natTop.line("-A", ChainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	natTop.line("-A", ChainPostrouting, "-j", "MARK", "--xor-mark", mark)
	masq := []string{"-A", ChainPostrouting, "-m", "comment", "--comment", quote("kubernetes service traffic requiring SNAT"), "-j", "MASQUERADE"}
	if o.RandomFully {
		masq = append(masq, "--random-fully")
	}
	natTop.line(masq...)
	natTop.line("-A", ChainMarkMasq, "-j", "MARK", "--or-mark", mark)
	natTop.b.Write(natRules.b.Bytes())
	top := TopSums{Filter: topSum(filter.b.Bytes()), NAT: topSum(natTop.b.Bytes())}
	writeFilter := lastTop == nil || lastTop.Filter != top.Filter
	writeNATTop := lastTop == nil || lastTop.NAT != top.NAT
	if !writeNATTop {
		skipped += rulesIn(natTop.b.Bytes())
	}

	var out writer
	out.b.Grow(filter.b.Len() + natTop.b.Len() + pr.natChains.b.Len() + pr.bodyRules.b.Len() + 4096)
	if writeFilter {
		f := filter.b.Bytes()
		head, commit := len("*filter\n"), len("COMMIT\n")
		out.b.Write(f[:head])
		hooks.declare(&out.b, "filter")
		out.b.Write(f[head : len(f)-commit])
		hooks.insert(&out.b, "filter")
		out.b.Write(f[len(f)-commit:])
	} else {
		hooks.block(&out.b, "filter")
	}
	out.line("*nat")
	hooks.declare(&out.b, "nat")
	if writeNATTop {
		for _, c := range []string{ChainServices, ChainNodePorts, ChainPostrouting, ChainMarkMasq} {
			out.declare(c)
		}
	}
	out.b.Write(pr.natChains.b.Bytes())
	stale := pr.stale
	slices.Sort(stale)
	for _, c := range stale {
		out.declare(c) // flushed first, so nothing it holds blocks the delete
	}
	if writeNATTop {
		out.b.Write(natTop.b.Bytes())
	}
	out.b.Write(pr.bodyRules.b.Bytes())
	for _, c := range stale {
		out.line("-X", c)
	}
	hooks.insert(&out.b, "nat")
	out.line("COMMIT")
	hooks.block(&out.b, "mangle")
	return rendered{data: out.b.Bytes(), bodies: pr.bodies, active: pr.active, skippedNAT: skipped, top: top, filterRules: rulesIn(filter.b.Bytes())}
}

// fingerprintSeed seeds the fingerprints below. They are compared only
// within the process (with what it last applied), so a seed drawn at start
// serves; it also keeps them from being aimed at, which FNV's were not.
// Set once, never written again.
var fingerprintSeed = maphash.MakeSeed()

// topSum is the fingerprint of a top-level chain's rules. (It was FNV-1a,
// byte by byte: 8 % of a 10k-Service full render with bodySum.)
func topSum(b []byte) uint64 { return maphash.Bytes(fingerprintSeed, b) }

// forSnapshot is o with what depends on the whole snapshot set: large
// cluster mode, as kube-proxy's (more than LargeClusterEndpoints
// endpoints in all).
func (o Options) forSnapshot(snap *lb.Snapshot) (Options, int) {
	total := 0
	for _, sp := range snap.Ports.All() {
		total += len(sp.Endpoints)
	}
	o.largeCluster = total > LargeClusterEndpoints
	return o, total
}

// bodySum is the fingerprint of a port's own chains and their rules (0
// when it has none), which a partial sync compares with Bodies.
func bodySum(chains []string, body []byte) uint64 {
	if len(chains) == 0 {
		return 0
	}
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	for _, c := range chains {
		h.WriteString(c)
		h.WriteByte(0)
	}
	h.Write(body)
	return h.Sum64()
}

// ServiceChainBatches renders every port's own chains (KUBE-SVC-,
// KUBE-SVL-, KUBE-EXT-, KUBE-FW-, KUBE-SEP-) as nat restores of at most
// batch ports each, and their fingerprints: passed as Bodies to the sync's
// own render, they leave those chains out of it. The first restore also
// writes KUBE-MARK-MASQ, which the chains jump to, as the full render does.
func ServiceChainBatches(snap *lb.Snapshot, o Options, batch int) ([][]byte, Bodies) {
	o, _ = o.forSnapshot(snap)
	mark := o.Mark()
	scratch := newPortScratch()
	var restores [][]byte
	bodies := make(Bodies, snap.Ports.Len())
	var discard, body, decls, rules writer
	var chains []string
	chain := func(name string) {
		if !slices.Contains(chains, name) {
			chains = append(chains, name)
		}
	}
	n := 0
	flush := func() {
		if n > 0 {
			var out bytes.Buffer
			out.Grow(decls.b.Len() + rules.b.Len() + 256)
			out.WriteString("*nat\n")
			if len(restores) == 0 {
				out.WriteString(":" + ChainMarkMasq + " - [0:0]\n")
			}
			out.Write(decls.b.Bytes())
			if len(restores) == 0 {
				out.WriteString("-A " + ChainMarkMasq + " -j MARK --or-mark " + mark + "\n")
			}
			out.Write(rules.b.Bytes())
			out.WriteString("COMMIT\n")
			restores = append(restores, out.Bytes())
		}
		decls.b.Reset()
		rules.b.Reset()
		n = 0
	}
	for _, sp := range snap.Sorted() {
		chains = chains[:0]
		body.b.Reset()
		discard.b.Reset()
		renderPort(sp, o, mark, &discard, &discard, &body, chain, scratch)
		if len(chains) == 0 {
			continue
		}
		for _, c := range chains {
			decls.declare(c)
		}
		rules.b.Write(body.b.Bytes())
		bodies[sp.Name] = bodySum(chains, body.b.Bytes())
		if n++; n == batch {
			flush()
		}
	}
	flush()
	return restores, bodies
}

// portScratch is what renderPort reuses from one port to the next: the
// port's name as hashed into its chain names, and its endpoints' KUBE-SEP-
// names. One per render; a render is single-threaded.
type portScratch struct {
	hashed []byte
	seps   map[netip.AddrPort]string
	done   map[netip.AddrPort]bool
}

func newPortScratch() *portScratch {
	return &portScratch{seps: map[netip.AddrPort]string{}, done: map[netip.AddrPort]bool{}}
}

// renderPort writes a service port's rules in the top-level chains to
// filterRules and natRules, and the rules of its own chains (named through
// chain) to body.
//
// Lines are written a word at a time (writer.rule, add, comment, ...):
// building each rule as a []string, its comments with strconv.Quote and
// string concatenation, and its names with fmt was most of a 10k-Service
// full render's 2.7M allocations.
func renderPort(sp *lb.ServicePort, o Options, mark string, filterRules, natRules, body *writer, chain func(string), sc *portScratch) {
	cips := o.filter(sp.ClusterIPs)
	if len(cips) == 0 {
		return // kube-proxy skips a service without a cluster IP of this family
	}
	name := sp.Name
	s := name.String()
	proto := strings.ToLower(string(name.Protocol))
	port := strconv.Itoa(int(sp.Port))
	match := [4]string{"-m", proto, "-p", proto}
	eips, lbips := o.filter(sp.ExternalIPs()), o.filter(sp.LoadBalancerIPs())
	externallyAccessible := sp.NodePort != 0 || len(eips) > 0 || len(lbips) > 0

	cluster, local := o.filterEPs(sp.Select(false)), o.filterEPs(sp.Select(true))
	hasEndpoints := len(cluster) > 0
	usesCluster := len(cluster) > 0 && (!sp.InternalLocal || externallyAccessible)
	usesLocal := len(local) > 0 && (sp.InternalLocal || sp.ExternalLocal)

	sc.hashed = appendPortProto(sc.hashed[:0], name)
	var hash [16]byte
	appendHash16(hash[:0], sc.hashed)
	svc, svl, ext, fw := prefixSVC+string(hash[:]), prefixSVL+string(hash[:]), prefixEXT+string(hash[:]), prefixFW+string(hash[:])
	internalChain, hasInternal := svc, len(cluster) > 0
	if sp.InternalLocal {
		internalChain, hasInternal = svl, len(local) > 0
	}
	externalChain, hasExternal := svc, len(cluster) > 0
	if sp.ExternalLocal {
		externalChain, hasExternal = svl, len(local) > 0
	}
	usesExt := hasEndpoints && externallyAccessible

	// refuse is the target and the comment's ending of a rule for a
	// service with no endpoints to send to.
	refuse := func() (string, string) {
		if !hasEndpoints {
			return "REJECT", " has no endpoints"
		}
		return "DROP", " has no local endpoints"
	}

	for _, cip := range cips {
		if hasInternal {
			natRules.toService(ChainServices, match[:], cip, port, internalChain, s, " cluster IP")
		} else {
			target, c := refuse()
			filterRules.toService(ChainServices, match[:], cip, port, target, s, c)
		}
	}
	var ranges []netip.Prefix
	for _, r := range sp.SourceRanges() {
		if r.Addr().Is6() == o.IPv6 {
			ranges = append(ranges, r)
		}
	}
	usesFW := hasEndpoints && len(lbips) > 0 && len(ranges) > 0
	for _, set := range [2]struct {
		ips  []netip.Addr
		what string
	}{{eips, "external IP"}, {lbips, "loadbalancer IP"}} {
		for _, ip := range set.ips {
			if usesExt {
				to := ext
				if usesFW && set.what == "loadbalancer IP" {
					to = fw
					filterRules.toService(ChainProxyFirewall, match[:], ip, port, "DROP", s, " traffic not accepted by ", fw)
				}
				natRules.toService(ChainServices, match[:], ip, port, to, s, " ", set.what)
			}
			if !hasExternal {
				target, c := refuse()
				filterRules.toService(ChainExternalServices, match[:], ip, port, target, s, c)
			}
		}
	}
	if sp.HealthCheckNodePort != 0 {
		filterRules.rule(ChainNodePorts)
		filterRules.comment(s, " health check node port")
		filterRules.add("-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(sp.HealthCheckNodePort)), "-j", "ACCEPT")
		filterRules.end()
	}
	if sp.NodePort != 0 {
		np := strconv.Itoa(int(sp.NodePort))
		if usesExt {
			if o.LocalhostNodePortCounter != "" && o.LocalhostNodePorts && !o.IPv6 {
				natRules.rule(ChainNodePorts)
				natRules.add("-m", "comment", "--comment", s)
				natRules.add(match[:]...)
				natRules.add("-d", "127.0.0.0/8", "--dport", np, "-m", "nfacct", "--nfacct-name", o.LocalhostNodePortCounter, "-j", ext)
				natRules.end()
			}
			natRules.rule(ChainNodePorts)
			natRules.add("-m", "comment", "--comment", s)
			natRules.add(match[:]...)
			natRules.add("--dport", np, "-j", ext)
			natRules.end()
		}
		if !hasExternal {
			target, c := refuse()
			filterRules.rule(ChainExternalServices)
			filterRules.comment(s, c)
			filterRules.add("-m", "addrtype", "--dst-type", "LOCAL")
			filterRules.add(match[:]...)
			filterRules.add("--dport", np, "-j", target)
			filterRules.end()
		}
	}

	clear(sc.seps)
	sepOf := func(ep netip.AddrPort) string {
		n, ok := sc.seps[ep]
		if !ok {
			n = endpointChain(sc.hashed, ep)
			sc.seps[ep] = n
		}
		return n
	}
	// epComment writes a per-endpoint rule's comment, which large
	// clusters leave out, as kube-proxy's appendServiceCommentLocked does.
	epComment := func(w *writer, ep netip.AddrPort) {
		if !o.largeCluster {
			w.comment(s, " -> ", ep.String())
		}
	}
	endpointRules := func(c string, eps []netip.AddrPort) {
		chain(c)
		if c == internalChain && hasInternal && (o.MasqueradeAll || o.Local.IsSet()) {
			for _, cip := range cips {
				body.rule(c)
				body.comment(s, " cluster IP")
				body.add(match[:]...)
				body.dest(cip, port)
				if !o.MasqueradeAll {
					body.local(o.Local, true)
				}
				body.add("-j", ChainMarkMasq)
				body.end()
			}
		}
		if sp.Affinity.ClientIP {
			secs := strconv.Itoa(int(sp.Affinity.Timeout.Seconds()))
			for _, ep := range eps {
				sep := sepOf(ep)
				body.rule(c)
				epComment(body, ep)
				body.add("-m", "recent", "--name", sep, "--rcheck", "--seconds", secs, "--reap", "-j", sep)
				body.end()
			}
		}
		for i, ep := range eps {
			sep := sepOf(ep)
			body.rule(c)
			epComment(body, ep)
			if i < len(eps)-1 {
				body.add("-m", "statistic", "--mode", "random", "--probability")
				body.probability(len(eps) - i)
			}
			body.add("-j", sep)
			body.end()
		}
	}
	if usesCluster {
		endpointRules(svc, cluster)
	}
	if usesLocal {
		endpointRules(svl, local)
	}
	if usesExt {
		chain(ext)
		if !sp.ExternalLocal {
			body.rule(ext)
			body.comment("masquerade traffic for ", s, " external destinations")
			body.add("-j", ChainMarkMasq)
			body.end()
		} else {
			if o.Local.IsSet() && usesCluster {
				body.rule(ext)
				body.comment("pod traffic for ", s, " external destinations")
				body.local(o.Local, false)
				body.add("-j", svc)
				body.end()
			}
			body.rule(ext)
			body.comment("masquerade LOCAL traffic for ", s, " external destinations")
			body.add("-m", "addrtype", "--src-type", "LOCAL", "-j", ChainMarkMasq)
			body.end()
			if usesCluster {
				body.rule(ext)
				body.comment("route LOCAL traffic for ", s, " external destinations")
				body.add("-m", "addrtype", "--src-type", "LOCAL", "-j", svc)
				body.end()
			}
		}
		if hasExternal {
			body.line("-A", ext, "-j", externalChain)
		}
	}
	if usesExt && usesFW {
		chain(fw)
		// allow writes a rule that lets a source (written by from) on to
		// the external chain.
		allow := func(from func()) {
			body.rule(fw)
			body.comment(s, " loadbalancer IP")
			body.add("-s")
			from()
			body.add("-j", ext)
			body.end()
		}
		for _, r := range ranges {
			allow(func() { body.prefix(r) })
		}
		// Traffic the node itself hairpins to the LB IP comes from the LB
		// IP when the node is inside an allowed range.
		nodeAllowed := false
		for _, r := range ranges {
			for _, n := range o.NodeIPs {
				nodeAllowed = nodeAllowed || r.Contains(n)
			}
		}
		if nodeAllowed {
			for _, ip := range lbips {
				allow(func() { body.addr(ip) })
			}
		}
		body.rule(fw)
		body.comment("other traffic to ", s, " will be dropped by KUBE-PROXY-FIREWALL")
		body.end()
	}
	// One KUBE-SEP chain per endpoint, shared by SVC and SVL.
	clear(sc.done)
	sepChain := func(ep netip.AddrPort) {
		if sc.done[ep] {
			return
		}
		sc.done[ep] = true
		sep := sepOf(ep)
		chain(sep)
		body.rule(sep)
		if !o.largeCluster {
			body.add("-m", "comment", "--comment", s)
		}
		body.add("-s")
		body.addr(ep.Addr())
		body.add("-j", ChainMarkMasq)
		body.end()
		body.rule(sep)
		if !o.largeCluster {
			body.add("-m", "comment", "--comment", s)
		}
		if sp.Affinity.ClientIP {
			body.add("-m", "recent", "--name", sep, "--set")
		}
		body.add(match[:]...)
		body.add("-j", "DNAT", "--to-destination")
		body.addrPort(ep)
		body.end()
	}
	if usesCluster {
		for _, ep := range cluster {
			sepChain(ep)
		}
	}
	if usesLocal {
		for _, ep := range local {
			sepChain(ep)
		}
	}
}
