package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/kernel/portals"
)

// nftablesPortals is the sluice-portals table of one family.
type nftablesPortals struct{ *portals.NFTables }

func (f nftablesPortals) sync(ps []portals.Portal) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return f.Sync(ctx, ps)
}

func (f nftablesPortals) change(del, add []portals.Portal) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return f.Change(ctx, del, add)
}

func (f nftablesPortals) present() bool {
	ok, err := f.Present(context.Background())
	if err != nil || !ok {
		f.Invalidate() // the resync that follows writes the table whole
		return false
	}
	return true
}

// newNFTablesCapture keeps the sluice-portals table for each family nft
// serves (a `nft flush ruleset` is repaired as a flush of the iptables
// portals is).
func newNFTablesCapture(local *localAddrs, log *slog.Logger) (*portalCapture, error) {
	var fams []portalFamily
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, err := newRenewingNFT(func() (knftables.Interface, error) { return knftables.New(fam, portals.NFTablesTable) })
		if err != nil {
			if fam == knftables.IPv4Family {
				return nil, err
			}
			log.Warn("userspace VIP capture: no IPv6 portals through nftables", "err", err)
			continue
		}
		fams = append(fams, nftablesPortals{&portals.NFTables{NFT: nft, IPv6: fam == knftables.IPv6Family}})
	}
	// The capture a previous run made through iptables would redirect too.
	for _, fam := range probeFamilies("") {
		if fam.err == nil {
			if err := portals.CleanupIPTables(fam.runner); err != nil {
				log.Warn("userspace VIP capture: cannot remove the iptables portals of an earlier run", "err", err)
			}
		}
	}
	return newPortalCapture(fams, local, log), nil
}

// cleanupNFTablesCapture removes the sluice-portals table in both
// families (--cleanup); nft missing is nothing to clean.
func cleanupNFTablesCapture() error {
	var errs []error
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, err := knftables.New(fam, portals.NFTablesTable)
		if err != nil {
			continue
		}
		errs = append(errs, portals.CleanupNFTables(context.Background(), nft))
	}
	return errors.Join(errs...)
}
