//go:build linux

package nftables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// Proxier keeps one family's kube-proxy table in step with the snapshots
// it is given: each Sync is one transaction that rewrites the table's
// chains, refills its maps and sets, and deletes the per-service chains
// and affinity sets no longer used (flushed first, so nothing refers to
// them when they go).
type Proxier struct {
	NFT     knftables.Interface
	Options Options

	// What the table holds of the per-service objects after the last
	// successful sync; nil: unknown (listed before the next sync).
	chains, sets map[string]bool
}

// Sync makes the table match snap.
func (p *Proxier) Sync(ctx context.Context, snap *lb.Snapshot) error {
	if p.chains == nil {
		chains, sets, err := p.list(ctx)
		if err != nil {
			return err
		}
		p.chains, p.sets = chains, sets
	}
	tx := p.NFT.NewTransaction()
	d := Render(snap, p.Options, tx)
	var stale []string
	for c := range p.chains {
		if isServiceObject(c) && !d.Chains[c] {
			stale = append(stale, c)
			tx.Flush(&knftables.Chain{Name: c})
		}
	}
	for _, c := range stale {
		tx.Delete(&knftables.Chain{Name: c})
	}
	for s := range p.sets {
		if isServiceObject(s) && !d.Sets[s] {
			tx.Delete(&knftables.Set{Name: s})
		}
	}
	if err := p.NFT.Run(ctx, tx); err != nil {
		p.chains, p.sets = nil, nil // list again: the table is as it was
		return fmt.Errorf("nftables transaction (%s): %w", p.familyName(), err)
	}
	p.chains, p.sets = d.Chains, d.Sets
	return nil
}

func (p *Proxier) familyName() string {
	if p.Options.IPv6 {
		return "ip6"
	}
	return "ip"
}

// list reads the table's chains and sets (none when it does not exist).
func (p *Proxier) list(ctx context.Context) (chains, sets map[string]bool, err error) {
	chains, sets = map[string]bool{}, map[string]bool{}
	cs, err := p.NFT.List(ctx, "chains")
	if err != nil && !knftables.IsNotFound(err) {
		return nil, nil, fmt.Errorf("list %s %s chains: %w", p.familyName(), Table, err)
	}
	for _, c := range cs {
		chains[c] = true
	}
	ss, err := p.NFT.List(ctx, "sets")
	if err != nil && !knftables.IsNotFound(err) {
		return nil, nil, fmt.Errorf("list %s %s sets: %w", p.familyName(), Table, err)
	}
	for _, s := range ss {
		sets[s] = true
	}
	return chains, sets, nil
}

// Cleanup deletes the family's kube-proxy table, as kube-proxy's
// --cleanup does; a missing table is not an error.
func Cleanup(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	tx.Destroy(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		// nft before 1.0.8 has no "destroy": fall back to delete.
		tx = nft.NewTransaction()
		tx.Delete(&knftables.Table{})
		if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
			return err
		}
	}
	return nil
}
