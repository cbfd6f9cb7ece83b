package iptables

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// Proxier programs one family's iptables from snapshots. The first sync,
// the first after a failure or Invalidate, one after an options change,
// and one every FullSyncPeriod are full: every chain is rewritten and the
// nat table is listed to find stale chains. The others are partial: only
// service ports whose own chains changed are rewritten (RenderPartial),
// and stale chains are known from the previous sync. A partial sync is one
// iptables-restore per family, as kube-proxy's. A full sync first reads
// the nat, filter and mangle tables (iptables-save), then writes in its
// restore the jumps from the built-in chains and the canaries that are
// missing (hookPlan; kube-proxy runs a command for each, present or not),
// and on the nft backend writes large tables in batches first (prewrite).
// It is not safe for concurrent use; the caller's sync loop owns it.
type Proxier struct {
	Runner  Runner
	Options Options
	Log     *slog.Logger
	// FullSyncPeriod bounds how long partial syncs go on; default an hour,
	// as kube-proxy's.
	FullSyncPeriod time.Duration
	Now            func() time.Time // default time.Now
	// FullSyncBatch is how many service ports' own chains a full sync
	// writes per restore before the restore of the top-level chains (see
	// prewrite). 0: DefaultFullSyncBatch when the Runner says its backend is
	// nft (Backend), else one restore; negative: one restore, always.
	FullSyncBatch int

	applied Bodies  // nil: the next sync is full
	top     TopSums // the top-level chains as last applied (valid with applied)
	// cache also says which per-service chains the last sync left: each
	// port's own (a set of every chain's name, kept between syncs, was
	// about 700 bytes per port at 10 endpoints: issue 16's memory budget).
	cache    portCache
	delta    deltaState
	optsKey  string
	lastFull time.Time
	// unbatched makes the next full sync one restore: the last one in
	// batches failed.
	unbatched bool
	// canaryChecks counts CanaryGone's calls.
	canaryChecks int
}

// SyncStats says what one sync did.
type SyncStats struct {
	Full  bool
	Bytes int
	// FilterRules and NATRules are the rules the sync wrote in each table
	// (a full sync in batches: all its restores); NATRulesTotal adds
	// those of the unchanged chains a partial sync left as they were
	// (kube-proxy's sync_proxy_rules_iptables_last and _total).
	FilterRules, NATRules, NATRulesTotal int
}

// Invalidate makes the next sync full (after the tables were flushed).
func (p *Proxier) Invalidate() { p.applied = nil }

func (p *Proxier) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Sync makes the kernel's rules match snap.
func (p *Proxier) Sync(snap *lb.Snapshot) error {
	_, err := p.SyncStats(snap)
	return err
}

// SyncStats is Sync, also saying whether it was full and how big.
func (p *Proxier) SyncStats(snap *lb.Snapshot) (SyncStats, error) {
	o := p.Options
	o.ExistingNATChains = nil
	key := fmt.Sprint(o)
	period := p.FullSyncPeriod
	if period <= 0 {
		period = time.Hour
	}
	now := p.now()
	full := p.applied == nil || key != p.optsKey || now.Sub(p.lastFull) >= period
	prev := p.applied
	var hooks hookPlan
	if full {
		tables, err := p.readTables()
		if err != nil {
			p.applied = nil
			return SyncStats{Full: true}, err
		}
		o.ExistingNATChains = tables["nat"].chains
		hooks = planHooks(o, tables)
		prev = nil
	}
	batchRules := 0
	if full {
		if err := p.ensureRules(hooks.ensure); err != nil {
			p.applied = nil
			return SyncStats{Full: true}, err
		}
		if batch := p.fullSyncBatch(); batch > 0 && !p.unbatched {
			pre, rules, err := p.prewrite(snap, o, batch)
			if err != nil {
				p.applied, p.unbatched = nil, true
				return SyncStats{Full: true}, err
			}
			prev, batchRules = pre, rules
		}
	}
	var lastTop *TopSums
	if !full {
		lastTop = &p.top
	}
	var r rendered
	delta := false
	if !full {
		r, delta = p.renderDelta(snap, o, lastTop)
	}
	if !delta {
		// A partial sync deletes the chains the last one left that are no
		// longer used.
		r = renderPartial(snap, o, prev, &p.cache, !full, lastTop, hooks)
	}
	data, bodies := r.data, r.bodies
	st := SyncStats{Full: full, Bytes: len(data)}
	_, st.NATRules = RuleCounts(data)
	// The filter table is written whole or, unchanged, not at all; either
	// way it holds its rendered rules, which is what kube-proxy, writing it
	// every time, reports as written.
	st.FilterRules = r.filterRules
	st.NATRulesTotal = st.NATRules + r.skippedNAT
	st.NATRules += batchRules // the batches' rules are the ones the render skipped
	if err := p.Runner.Restore(data); err != nil {
		p.applied = nil
		p.unbatched = full && prev != nil // it followed batches
		return st, fmt.Errorf("apply rules: %w", err)
	}
	if full {
		p.unbatched = false
	}
	if p.Log != nil {
		p.Log.Debug("iptables rules applied", "ipv6", o.IPv6, "full", full, "bytes", len(data))
	}
	p.applied, p.optsKey, p.top = bodies, key, r.top
	if full {
		p.lastFull = now
	}
	p.delta.snap, p.delta.order, p.delta.endpoints, p.delta.bodyRulesAll = snap, r.sorted, r.endpoints, r.bodyRulesAll
	return st, nil
}

// DefaultFullSyncBatch is FullSyncBatch's default on the nft backend.
const DefaultFullSyncBatch = 100

// Backend is what a Runner may say of its backend.
type Backend interface {
	// Legacy reports whether it drives the legacy (x_tables) backend.
	Legacy() bool
}

func (p *Proxier) fullSyncBatch() int {
	if p.FullSyncBatch != 0 {
		return p.FullSyncBatch
	}
	if b, ok := p.Runner.(Backend); ok && !b.Legacy() {
		return DefaultFullSyncBatch
	}
	return 0
}

// prewrite is the first part of a full sync in batches: every service
// port's own chains (KUBE-SVC-, KUBE-SVL-, KUBE-EXT-, KUBE-FW-, KUBE-SEP-)
// in restores of batch ports each (ServiceChainBatches), a port's chains
// always in one restore. It returns their fingerprints, so that the sync's
// own restore leaves them out and writes only the top-level chains
// (KUBE-SERVICES, KUBE-NODEPORTS, the filter chains), pointing at them, and
// deletes the stale ones. It is for speed on the nft backend, where
// iptables-nft-restore's time grows with the square of the rules in one
// restore: at 2,000 services x 10 endpoints one restore took 41-54 s here,
// these batches 3 s (issue 18); on legacy each restore reads and writes
// the whole table, so one restore is best there.
//
// What traffic sees: on a table without service chains (a node's first
// sync) nothing points at the new chains until the last restore, so the
// change is one step, as with one restore. On a table that holds them (a
// restart, the hourly resync) each restore replaces whole services' chains
// in place, so for a moment some services have their new rules and others
// their old ones, each service consistent, as between two partial syncs;
// chains no longer wanted go only in the last restore, after nothing
// points at them. (kube-proxy writes it all in one restore, which at 5,000
// services on iptables-nft took over seven minutes here.) A failed batch
// fails the sync, and the next full sync is one restore, as kube-proxy's.
// It also says how many rules of the ports' own chains the batches wrote.
func (p *Proxier) prewrite(snap *lb.Snapshot, o Options, batch int) (Bodies, int, error) {
	restores, bodies := ServiceChainBatches(snap, o, batch)
	if len(restores) < 2 {
		return nil, 0, nil // one restore either way
	}
	rules := -1 // the first restore's KUBE-MARK-MASQ rule, which the sync's restore writes again
	for i, data := range restores {
		if err := p.Runner.Restore(data); err != nil {
			return nil, 0, fmt.Errorf("apply rules (full sync, service chains, restore %d of %d): %w", i+1, len(restores), err)
		}
		rules += rulesIn(data)
	}
	return bodies, rules, nil
}

// CanaryGone reports whether the tables were flushed, by their
// KUBE-PROXY-CANARY chains; the next sync is then full, and reads and
// rewrites every table. As kube-proxy's canary monitor does, it reads the
// first of CanaryTables (mangle, a table of a few rules) each time; the
// nat and filter tables it reads only every canaryEveryTable-th time: on
// the legacy backend a save of nat at 5k Services costs about a second of
// CPU, which every period (30 s) was most of an idle node's iptables
// work. A flush of nat or filter alone, which kube-proxy does not see
// until its hourly full sync, is seen within that many periods.
// It is called from one goroutine.
func (p *Proxier) CanaryGone() bool {
	tables := CanaryTables[:1]
	if p.canaryChecks++; p.canaryChecks%canaryEveryTable == 0 {
		tables = CanaryTables
	}
	for _, t := range tables {
		chains, err := p.Runner.Chains(t)
		if err != nil || !slices.Contains(chains, ChainCanary) {
			p.Invalidate()
			return true
		}
	}
	return false
}

// canaryEveryTable: CanaryGone reads every canary table one time in this
// many, the first one every time.
const canaryEveryTable = 10

// Cleanup removes every jump rule and chain the iptables mode installs,
// in every table, KUBE-FIREWALL included, and nothing else. It is
// idempotent. It is for tables sluice alone uses (tests, the sync bench);
// on a node, CleanupLeftovers.
func Cleanup(r Runner, o Options) error { return cleanup(r, o, false) }

// CleanupLeftovers is Cleanup as kube-proxy's CleanupLeftovers does it,
// for --cleanup and when another mode starts: KUBE-FIREWALL and its jumps
// from INPUT and OUTPUT stay, since kubelet makes and owns that chain too
// (its martian-packet drop for route_localnet, CVE-2020-8558), and does not
// put it back when it is deleted.
func CleanupLeftovers(r Runner, o Options) error { return cleanup(r, o, true) }

func cleanup(r Runner, o Options, keepKubelets bool) error {
	var errs []error
	o.LocalhostNodePorts = true // remove the KUBE-FIREWALL hooks too, if any
	have := map[string][]string{}
	for _, table := range []string{"filter", "nat", "mangle"} {
		chains, err := r.Chains(table)
		if err != nil {
			errs = append(errs, err)
		}
		have[table] = chains
	}
	for _, j := range Jumps(o) {
		// A jump to a chain that does not exist cannot exist either; not
		// asking keeps an unused legacy table from being loaded.
		if !slices.Contains(have[j.Table], target(j.Args)) || keepKubelets && target(j.Args) == ChainFirewall {
			continue
		}
		if err := r.DeleteRule(j.Table, j.Chain, j.Args...); err != nil {
			errs = append(errs, err)
		}
	}
	ours := map[string][]string{
		"nat":    {ChainServices, ChainNodePorts, ChainPostrouting, ChainMarkMasq, ChainCanary},
		"filter": {ChainServices, ChainExternalServices, ChainForward, ChainNodePorts, ChainProxyFirewall, ChainCanary, ChainFirewall},
		"mangle": {ChainCanary},
	}
	for _, table := range []string{"filter", "nat", "mangle"} {
		existing := have[table]
		var del []string
		for _, c := range existing {
			if keepKubelets && c == ChainFirewall {
				continue
			}
			if slices.Contains(ours[table], c) || (table == "nat" && IsServiceChain(c)) {
				del = append(del, c)
			}
		}
		if len(del) == 0 {
			continue
		}
		var b strings.Builder
		b.WriteString("*" + table + "\n")
		for _, c := range del {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		for _, c := range del {
			b.WriteString("-X " + c + "\n")
		}
		b.WriteString("COMMIT\n")
		if err := r.Restore([]byte(b.String())); err != nil {
			errs = append(errs, fmt.Errorf("remove %s chains: %w", table, err))
		}
	}
	return errors.Join(errs...)
}
