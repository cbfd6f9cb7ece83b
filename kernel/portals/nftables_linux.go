package portals

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// The nftables method's chains.
const (
	nftChainPrerouting = "prerouting"
	nftChainOutput     = "output"
)

// The nftables method's maps: a redirected portal is an element
// "VIP . port : proxy port" of its protocol's map, looked up by one rule
// per protocol in each chain, so a packet costs one lookup however many
// portals there are, and a change of some portals adds and deletes only
// their elements. (One rule per portal made a new connection to the last
// of 10,000 walk them all, about 0.25 ms, and each update rewrote them
// all through nft, about 0.8 s.)
var nftPortalMaps = []nftPortalMap{{lb.TCP, "tcp-portals"}, {lb.UDP, "udp-portals"}, {lb.SCTP, "sctp-portals"}}

type nftPortalMap struct {
	proto lb.Protocol
	name  string
}

// nftRendered is what the table holds for a list of portals: the map
// elements of the redirected ones, and the rules of the others (DNAT to
// an address, or only for clients in source ranges), one per portal,
// sorted.
type nftRendered struct {
	elements map[nftKey]uint16
	rules    []nftRule
}

// nftKey is a map element's key: the portal's Dest, compact since the
// applied elements are held for every portal
// (BenchmarkNFTablesHeldBytesPerPortal).
type nftKey = Dest

// nftKeyOf is p's element's key; false when its protocol has no map.
func nftKeyOf(p Portal) (nftKey, bool) {
	k := DestOf(p)
	return k, nftMapFor(k.Protocol()) != ""
}

// nftMapFor is the map of proto's portals ("" for none).
func nftMapFor(proto lb.Protocol) string {
	for _, m := range nftPortalMaps {
		if m.proto == proto {
			return m.name
		}
	}
	return ""
}

type nftRule struct{ rule, comment string }

func renderNFT(ps []Portal, ipv6 bool) nftRendered {
	ip := "ip"
	if ipv6 {
		ip = "ip6"
	}
	r := nftRendered{elements: make(map[nftKey]uint16, len(ps))}
	var own []Portal // the portals with rules of their own
	for _, p := range ps {
		if p.IP.Is6() != ipv6 {
			continue
		}
		redirect := !p.To.Addr().IsValid() || p.To.Addr().IsUnspecified()
		if k, ok := nftKeyOf(p); redirect && len(p.SourceRanges) == 0 && ok {
			r.elements[k] = p.To.Port()
			continue
		}
		own = append(own, p)
	}
	for _, p := range sortedPortals(own) {
		redirect := !p.To.Addr().IsValid() || p.To.Addr().IsUnspecified()
		match := []string{ip, "daddr", p.IP.String(), strings.ToLower(string(p.Protocol)), "dport", strconv.Itoa(int(p.Port))}
		target := []string{"dnat to", p.To.String()}
		if redirect {
			target = []string{"redirect to", ":" + strconv.Itoa(int(p.To.Port()))}
		}
		var sources []string
		for _, r := range p.SourceRanges {
			if r.Addr().Is6() == ipv6 {
				sources = append(sources, r.String())
			}
		}
		if len(p.SourceRanges) > 0 {
			if len(sources) == 0 {
				continue // no client of this family may reach it
			}
			match = append([]string{ip, "saddr", "{", strings.Join(sources, ", "), "}"}, match...)
		}
		r.rules = append(r.rules, nftRule{knftables.Concat(match, target), p.Service})
	}
	return r
}

// RenderNFTables adds to tx what makes the table hold exactly the portals
// of one family, whatever it held before: the table (added, so a first
// sync creates it), flushed, its chains and maps, the maps' elements, and
// in each chain the rules of the portals that are not map elements, then
// the maps' lookups. Equal inputs make equal transactions.
func RenderNFTables(tx *knftables.Transaction, ps []Portal, ipv6 bool) {
	writeNFT(tx, renderNFT(ps, ipv6), ipv6)
}

func writeNFT(tx *knftables.Transaction, r nftRendered, ipv6 bool) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("sluice: userspace VIP capture")})
	tx.Flush(&knftables.Table{})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{nftChainPrerouting, knftables.PreroutingHook}, {nftChainOutput, knftables.OutputHook}} {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.NATType), Hook: knftables.PtrTo(c.hook),
			Priority: knftables.PtrTo(knftables.DNATPriority)})
	}
	addr := "ipv4_addr"
	if ipv6 {
		addr = "ipv6_addr"
	}
	for _, m := range nftPortalMaps {
		tx.Add(&knftables.Map{Name: m.name, Type: addr + " . inet_service : inet_service"})
		tx.Flush(&knftables.Map{Name: m.name})
	}
	keys := slices.SortedFunc(maps.Keys(r.elements), compareNFTKeys)
	for _, k := range keys {
		tx.Add(nftElement(k, r.elements[k]))
	}
	writeNFTRules(tx, r.rules, ipv6)
}

// writeNFTRules writes both chains' rules: the portals' own, then the
// maps' lookups.
func writeNFTRules(tx *knftables.Transaction, rules []nftRule, ipv6 bool) {
	ip := "ip"
	if ipv6 {
		ip = "ip6"
	}
	for _, c := range []string{nftChainPrerouting, nftChainOutput} {
		for _, r := range rules {
			tx.Add(&knftables.Rule{Chain: c, Rule: r.rule, Comment: knftables.PtrTo(r.comment)})
		}
		for _, m := range nftPortalMaps {
			proto := strings.ToLower(string(m.proto))
			tx.Add(&knftables.Rule{Chain: c, Rule: knftables.Concat("meta l4proto", proto, "redirect to :"+ip, "daddr .", proto, "dport map", "@"+m.name)})
		}
	}
}

func nftElement(k nftKey, port uint16) *knftables.Element {
	vip := k.AddrPort()
	return &knftables.Element{Map: nftMapFor(k.Protocol()), Key: []string{vip.Addr().String(), strconv.Itoa(int(vip.Port()))}, Value: []string{strconv.Itoa(int(port))}}
}

func compareNFTKeys(a, b nftKey) int {
	if c := strings.Compare(string(a.Protocol()), string(b.Protocol())); c != 0 {
		return c
	}
	return a.AddrPort().Compare(b.AddrPort())
}

// NFTables applies portals for one family: one transaction per Sync
// that changes anything. It remembers what it applied, so a Sync writes
// only the map elements that changed (and the few per-portal rules when
// they did); the first Sync, the one after a failure and the one after
// Invalidate write the table whole.
type NFTables struct {
	NFT  knftables.Interface // for NFTablesTable in this family
	IPv6 bool

	applied *nftRendered
	// writes counts the transactions run, and whole those that wrote
	// the table whole (for tests).
	writes, whole int
}

// Invalidate makes the next Sync write the table whole (it was flushed
// or deleted behind sluice's back).
func (c *NFTables) Invalidate() { c.applied = nil }

// Sync makes the table hold exactly ps (of this family).
func (c *NFTables) Sync(ctx context.Context, ps []Portal) error {
	want := renderNFT(ps, c.IPv6)
	tx := c.NFT.NewTransaction()
	whole := c.applied == nil
	if whole {
		writeNFT(tx, want, c.IPv6)
	} else {
		// Only the changed elements are sorted (so equal changes make
		// equal transactions), not every one.
		old := c.applied
		var gone, come []nftKey
		for k, port := range old.elements {
			if p, ok := want.elements[k]; !ok || p != port {
				gone = append(gone, k)
			}
		}
		for k, port := range want.elements {
			if p, ok := old.elements[k]; !ok || p != port {
				come = append(come, k)
			}
		}
		slices.SortFunc(gone, compareNFTKeys)
		slices.SortFunc(come, compareNFTKeys)
		for _, k := range gone {
			tx.Delete(nftElement(k, old.elements[k]))
		}
		for _, k := range come {
			tx.Add(nftElement(k, want.elements[k]))
		}
		if !slices.Equal(old.rules, want.rules) {
			for _, ch := range []string{nftChainPrerouting, nftChainOutput} {
				tx.Flush(&knftables.Chain{Name: ch})
			}
			writeNFTRules(tx, want.rules, c.IPv6)
		}
		if tx.NumOperations() == 0 {
			return nil
		}
	}
	c.writes++
	if whole {
		c.whole++
	}
	if err := c.NFT.Run(ctx, tx); err != nil {
		c.applied = nil
		return fmt.Errorf("apply portal rules (nftables): %w", err)
	}
	c.applied = &want
	return nil
}

// Change applies a change of some portals: those in del go and those in
// add come (a destination in both takes add's target), as element
// deletions and additions in one transaction, nothing when it changes
// nothing; the other family's portals are ignored. It needs an applied
// table and portals that are map elements: otherwise (a first sync, one
// after a failure or Invalidate, a portal with source ranges or a DNAT)
// it changes nothing and returns ErrWholeNeeded, for Sync.
func (c *NFTables) Change(ctx context.Context, del, add []Portal) error {
	if c.applied == nil {
		return ErrWholeNeeded
	}
	next := map[nftKey]int{} // the destinations changed: their port after, or -1
	for i, ps := range [][]Portal{del, add} {
		for _, p := range ps {
			if p.IP.Is6() != c.IPv6 {
				continue
			}
			redirect := !p.To.Addr().IsValid() || p.To.Addr().IsUnspecified()
			k, ok := nftKeyOf(p)
			if !redirect || len(p.SourceRanges) > 0 || !ok {
				return ErrWholeNeeded
			}
			if i == 0 {
				if _, set := next[k]; !set {
					next[k] = -1
				}
			} else {
				next[k] = int(p.To.Port())
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(next), compareNFTKeys)
	tx := c.NFT.NewTransaction()
	for _, k := range keys {
		old, had := c.applied.elements[k]
		switch port := next[k]; {
		case had && port == int(old):
			continue
		case had:
			tx.Delete(nftElement(k, old))
		}
		if port := next[k]; port >= 0 {
			tx.Add(nftElement(k, uint16(port)))
		}
	}
	if tx.NumOperations() == 0 {
		return nil
	}
	c.writes++
	if err := c.NFT.Run(ctx, tx); err != nil {
		c.applied = nil
		return fmt.Errorf("apply portal rules (nftables): %w", err)
	}
	for _, k := range keys {
		if port := next[k]; port >= 0 {
			c.applied.elements[k] = uint16(port)
		} else {
			delete(c.applied.elements, k)
		}
	}
	return nil
}

// Present says whether both chains are there (a `nft flush ruleset`, as a
// firewall reload does, removes them).
func (c *NFTables) Present(ctx context.Context) (bool, error) {
	chains, err := c.NFT.List(ctx, "chains")
	if knftables.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.Contains(chains, nftChainPrerouting) && slices.Contains(chains, nftChainOutput), nil
}

// CleanupNFTables deletes the table, and nothing else; no table is no
// error.
func CleanupNFTables(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("remove portal table: %w", err)
	}
	return nil
}
