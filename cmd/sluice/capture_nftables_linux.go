package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// nftablesCapture keeps the sluice-portals table for each family nft
// serves. Every --iptables-sync-period it checks that the chains are still
// there and puts them back after a `nft flush ruleset` (a firewall
// reload), as the iptables capture does.
type nftablesCapture struct {
	fams  []*portals.NFTables
	local *localAddrs
	log   *slog.Logger
	stop  chan struct{}
	done  chan struct{}

	mu   sync.Mutex
	last []portals.Portal
}

func newNFTablesCapture(local *localAddrs, log *slog.Logger) (*nftablesCapture, error) {
	c := &nftablesCapture{local: local, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, err := knftables.New(fam, portals.NFTablesTable)
		if err != nil {
			if fam == knftables.IPv4Family {
				return nil, err
			}
			log.Warn("userspace VIP capture: no IPv6 portals through nftables", "err", err)
			continue
		}
		c.fams = append(c.fams, &portals.NFTables{NFT: nft, IPv6: fam == knftables.IPv6Family})
	}
	// The capture a previous run made through iptables would redirect too.
	for _, fam := range probeFamilies("") {
		if fam.err == nil {
			if err := portals.CleanupIPTables(fam.runner); err != nil {
				log.Warn("userspace VIP capture: cannot remove the iptables portals of an earlier run", "err", err)
			}
		}
	}
	return c, nil
}

func (c *nftablesCapture) families() string {
	if len(c.fams) == 2 {
		return "IPv4 and IPv6"
	}
	return "IPv4"
}

func (c *nftablesCapture) watch(every time.Duration) {
	defer close(c.done)
	if every <= 0 {
		every = 30 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		gone := false
		for _, f := range c.fams {
			ok, err := f.Present(context.Background())
			gone = gone || err != nil || !ok
		}
		if !gone {
			continue
		}
		c.log.Warn("VIP capture: the " + portals.NFTablesTable + " table is gone (ruleset flushed); resyncing")
		if err := c.resync(); err != nil {
			c.log.Error("VIP capture resync failed", "err", err)
		} else {
			c.log.Info("VIP capture: portals resynced")
		}
	}
}

func (c *nftablesCapture) close() {
	close(c.stop)
	<-c.done
}

func (c *nftablesCapture) before(*lb.Snapshot) error { return nil }

func (c *nftablesCapture) after(snap *lb.Snapshot, fes func() []listeners.Frontend) error {
	ps := portalsFor(snap, fes(), c.local.has)
	c.mu.Lock()
	c.last = ps
	c.mu.Unlock()
	return c.resync()
}

func (c *nftablesCapture) resync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, f := range c.fams {
		if err := f.Sync(ctx, c.last); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
