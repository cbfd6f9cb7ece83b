//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/nftables"
	"github.com/sluice-proxy/sluice/lb"
)

// nftablesPlane is nftables mode: kube-proxy's kube-proxy table in the ip
// and ip6 families, rewritten in one transaction per family per sync; a
// failed sync is retried every --nftables-sync-period (the table stays as
// the last good transaction left it).
type nftablesPlane struct {
	proxiers []*nftables.Proxier
	cfg      *config.Config
	local    *localAddrs
	metrics  *admin.Metrics
	log      *slog.Logger
	stop     chan struct{}
	done     chan struct{}

	latestState
	failed    bool
	loopback  loopbackWarner
	noLocal   noLocalTally
	conntrack conntrackReconciler // under latestState's mu, as the syncs are
	backoff   syncBackoff

	cidrMu       sync.Mutex
	serviceCIDRs []netip.Prefix
}

// SetServiceCIDRs takes the cluster's ServiceCIDRs (the API source watches
// them) and syncs again if they changed: traffic to an unallocated address
// in them is dropped, as kube-proxy does.
func (p *nftablesPlane) SetServiceCIDRs(cidrs []netip.Prefix) {
	p.cidrMu.Lock()
	same := slices.Equal(p.serviceCIDRs, cidrs)
	p.serviceCIDRs = cidrs
	p.cidrMu.Unlock()
	if same {
		return
	}
	p.log.Info("nftables mode: ServiceCIDRs", "cidrs", cidrs)
	if err := p.reapplyNewest(p.applyLocked); err != nil {
		p.log.Warn("nftables mode: sync after a ServiceCIDR change failed; retried", "err", err)
	}
}

// errNFTablesUnavailable is why nftables mode cannot run here (no nft, a
// kernel without nf_tables): the mode falls back to iptables.
var errNFTablesUnavailable = errors.New("nftables unavailable")

func newNFTablesPlane(cfg *config.Config, local *localAddrs, metrics *admin.Metrics, log *slog.Logger) (*nftablesPlane, error) {
	p := &nftablesPlane{cfg: cfg, local: local, metrics: metrics, log: log, stop: make(chan struct{}), done: make(chan struct{}),
		backoff:  syncBackoff{max: resyncEvery(cfg.KubeProxy.NFTables.SyncPeriod.Duration)},
		loopback: loopbackWarner{mode: "nftables", log: log}}
	var families []string
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, err := newRenewingNFT(func() (knftables.Interface, error) { return knftables.New(fam, nftables.Table) })
		if err != nil {
			if fam == knftables.IPv4Family {
				return nil, fmt.Errorf("%w: %v", errNFTablesUnavailable, err)
			}
			log.Warn("nftables mode: IPv6 rules disabled", "err", err)
			continue
		}
		p.proxiers = append(p.proxiers, &nftables.Proxier{NFT: nft, Options: nftablesOptions(cfg, fam == knftables.IPv6Family, local.node)})
		families = append(families, familyName(fam == knftables.IPv6Family))
	}
	metrics.SetFamilies(families...)
	metrics.NFTablesFamilies(families...)
	log.Info("nftables mode", "families", len(p.proxiers), "table", nftables.Table)
	go p.loop(cfg.KubeProxy.NFTables.SyncPeriod.Duration)
	return p, nil
}

func nftablesOptions(cfg *config.Config, v6 bool, node nodeFacts) nftables.Options {
	nt := cfg.KubeProxy.NFTables
	o := nftables.Options{IPv6: v6, MasqueradeBit: 14, MasqueradeAll: nt.MasqueradeAll}
	if b := nt.MasqueradeBit; b != nil {
		o.MasqueradeBit = int(*b)
	}
	o.Local = localMatch(cfg, v6, node.podCIDRs)
	return o
}

func (p *nftablesPlane) perFamilySyncs() {}

func (p *nftablesPlane) Apply(snap *lb.Snapshot) error { return p.applyNewest(snap, p.applyLocked) }

func (p *nftablesPlane) applyLocked(snap *lb.Snapshot) error {
	if d := p.backoff.wait(); d > 0 {
		return fmt.Errorf("nftables mode: %w", errBackingOff{p.backoff.failures, d})
	}
	p.loopback.check(snap)
	p.noLocal.update(snap)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a hung nft, not a slow one
	defer cancel()
	nodeIPs := p.local.list()
	var errs []error
	p.cidrMu.Lock()
	cidrs := p.serviceCIDRs
	p.cidrMu.Unlock()
	for _, px := range p.proxiers {
		px.Options.NodePortAddresses = nodePortAddrsFor(p.cfg.KubeProxy.NodePortAddresses, nodeIPs, px.Options.IPv6)
		px.Options.NodeIPs = nodeIPs
		px.Options.ServiceCIDRs = cidrs
		start := time.Now()
		st, err := px.SyncStats(ctx, snap)
		if st.StaleDeleted > 0 {
			p.log.Info("Deleting stale nftables chains", "family", familyName(px.Options.IPv6), "numChains", st.StaleDeleted)
		}
		if st.CleanupErr != nil {
			// As kube-proxy: the chains are found and flushed again by
			// the sync, which went on full, and deleted by a later one.
			p.metrics.NFTablesCleanupFailed(familyName(px.Options.IPv6))
			p.log.Error("Unable to delete stale chains; will retry later", "family", familyName(px.Options.IPv6), "err", st.CleanupErr)
		}
		if err != nil {
			p.metrics.NFTablesSyncFailed(familyName(px.Options.IPv6))
			errs = append(errs, &familyError{familyName(px.Options.IPv6), err})
			continue
		}
		familySynced(p.metrics, &p.noLocal, px.Options.IPv6, st.Full, time.Since(start))
		p.conntrack.reconcile(snap, px.Options.IPv6, p.local, p.metrics, p.log)
	}
	p.failed = len(errs) > 0
	p.backoff.done(p.failed)
	return errors.Join(errs...)
}

func (p *nftablesPlane) loop(every time.Duration) {
	defer close(p.done)
	why := func() (string, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.failed {
			return "the last sync failed", false
		}
		// Flushed chains are deleted by a sync after them: the periodic
		// one, as kube-proxy's, when no change brings one.
		for _, px := range p.proxiers {
			if px.StaleChains() {
				return "stale chains to delete", true
			}
		}
		return "", false
	}
	backoff := func() time.Duration {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.backoff.wait()
	}
	resyncLoop(every, p.stop, "nftables", p.log, why, func() error { return p.reapplyNewest(p.applyLocked) }, backoff)
}

// Close stops the resync loop; the table stays (as kube-proxy's does)
// until --cleanup.
func (p *nftablesPlane) Close() {
	close(p.stop)
	<-p.done
}

func (p *nftablesPlane) Dump() any {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	if p.last != nil {
		n = p.last.Ports.Len()
	}
	return map[string]any{"mode": "nftables", "families": len(p.proxiers), "servicePorts": n, "lastSyncFailed": p.failed}
}

func (p *nftablesPlane) Tick() {}

// nftablesLeftover names the families that hold a kube-proxy table.
func nftablesLeftover() []string {
	var out []string
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, err := knftables.New(fam, nftables.Table)
		if err != nil {
			continue
		}
		if _, err := nft.List(context.Background(), "sets"); err == nil {
			out = append(out, string(fam))
		}
	}
	return out
}

// cleanupNFTables deletes the kube-proxy table in both families, where
// nftables is there at all.
func cleanupNFTables(log *slog.Logger) error {
	var errs []error
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, err := knftables.New(fam, nftables.Table)
		if err != nil {
			continue // no nftables: nothing of ours
		}
		if err := nftables.Cleanup(context.Background(), nft); err != nil {
			errs = append(errs, fmt.Errorf("nftables %s: %w", fam, err))
			continue
		}
		log.Info("cleanup: nftables table removed", "family", fam, "table", nftables.Table)
	}
	return errors.Join(errs...)
}
