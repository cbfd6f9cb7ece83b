package portals

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// The nftables method's chains.
const (
	nftChainPrerouting = "prerouting"
	nftChainOutput     = "output"
)

// RenderNFTables adds to tx what makes the table hold exactly the portals
// of one family: the table (added, so a first sync creates it), flushed,
// its chains, and one rule per portal in each chain, sorted, so equal
// inputs make equal transactions.
func RenderNFTables(tx *knftables.Transaction, ps []Portal, ipv6 bool) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("sluice: userspace VIP capture")})
	tx.Flush(&knftables.Table{})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{nftChainPrerouting, knftables.PreroutingHook}, {nftChainOutput, knftables.OutputHook}} {
		tx.Add(&knftables.Chain{Name: c.name, Type: knftables.PtrTo(knftables.NATType), Hook: knftables.PtrTo(c.hook),
			Priority: knftables.PtrTo(knftables.DNATPriority)})
	}
	ip := "ip"
	if ipv6 {
		ip = "ip6"
	}
	sorted := slices.Clone(ps)
	slices.SortFunc(sorted, func(a, b Portal) int { return strings.Compare(a.String(), b.String()) })
	for _, p := range sorted {
		if p.IP.Is6() != ipv6 {
			continue
		}
		match := []string{ip, "daddr", p.IP.String(), strings.ToLower(string(p.Protocol)), "dport", strconv.Itoa(int(p.Port))}
		var target []string
		switch {
		case !p.To.Addr().IsValid() || p.To.Addr().IsUnspecified():
			target = []string{"redirect to", ":" + strconv.Itoa(int(p.To.Port()))}
		default:
			target = []string{"dnat to", p.To.String()}
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
		for _, c := range []string{nftChainPrerouting, nftChainOutput} {
			tx.Add(&knftables.Rule{Chain: c, Rule: knftables.Concat(match, target), Comment: knftables.PtrTo(p.Service)})
		}
	}
}

// NFTables applies portals for one family: one transaction per Sync.
type NFTables struct {
	NFT  knftables.Interface // for NFTablesTable in this family
	IPv6 bool
}

// Sync makes the table hold exactly ps (of this family).
func (c *NFTables) Sync(ctx context.Context, ps []Portal) error {
	tx := c.NFT.NewTransaction()
	RenderNFTables(tx, ps, c.IPv6)
	if err := c.NFT.Run(ctx, tx); err != nil {
		return fmt.Errorf("apply portal rules (nftables): %w", err)
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
