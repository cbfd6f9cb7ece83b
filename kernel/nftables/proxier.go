//go:build linux

package nftables

import (
	"context"
	"fmt"
	"slices"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/sluice-proxy/sluice/lb"
)

// Proxier keeps one family's kube-proxy table in step with the snapshots
// it is given: each Sync is one transaction that rewrites the table's
// chains, refills its maps and sets, deletes the affinity sets no longer
// used and flushes the per-service chains no longer used. Those chains are
// deleted by a later sync, at least StaleChainDelay after, in a
// transaction of their own (after that sync's; kube-proxy's comes before):
// before Linux 6.2 a chain a map element pointed to stays referenced for
// a while after the element is deleted, so deleting both in one
// transaction can fail it (EBUSY), and with it the sync.
type Proxier struct {
	NFT     knftables.Interface
	Options Options
	// FullSyncPeriod is how often a sync is a full one anyway (kube-proxy:
	// hourly); default one hour.
	FullSyncPeriod time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// FullSyncBatch is how many service ports' chains a full sync writes
	// per transaction before its last one (see fresh and rewritePorts); 0:
	// DefaultFullSyncBatch; negative: one transaction, always.
	FullSyncBatch int

	// What the table holds of the per-service objects, as a full sync
	// listed it or made it from the applied ports (nil: neither yet).
	// Kept only while that sync runs.
	chains, sets map[string]bool
	// applied is each port's bundle as last applied (nil: the next sync
	// is full), with the options it was rendered with.
	applied map[lb.ServicePortName]*portBundle
	// from is the ServicePort each applied bundle was rendered from: a
	// snapshot shares unchanged ports with the one before (they are never
	// mutated), so the same pointer needs no rendering to compare.
	from map[lb.ServicePortName]*lb.ServicePort
	// snapID is the snapshot last applied (0: unnamed or none), and
	// clusterIPRefs how many of its ports have each cluster IP: a partial
	// sync from a snapshot's delta over it touches only the changed ports.
	snapID        uint64
	clusterIPRefs map[string]int
	// deltas counts the partial syncs done from a delta (for tests).
	deltas   int
	optsKey  string
	lastFull time.Time
	// unbatched makes the next full sync one transaction: the last one in
	// batches failed.
	unbatched bool
	// kept is applied as it was when a sync failed (nil: none failed since
	// the last full sync): the affinity sets it declared may still be in
	// the table with those timeouts, which the next full sync must replace
	// when they changed, as it does from applied.
	kept map[lb.ServicePortName]*portBundle
	// stale are the per-service chains flushed because nothing uses them
	// any more, each with the start of the sync that flushed it: a sync at
	// least StaleChainDelay later deletes them.
	stale map[string]time.Time
}

// StaleChainDelay is how long a flushed chain waits before a sync deletes
// it (kube-proxy's one second).
const StaleChainDelay = time.Second

// StaleChains says whether flushed chains wait for a later sync to delete
// them.
func (p *Proxier) StaleChains() bool { return len(p.stale) > 0 }

// markStale records chains as flushed by the sync that started at start.
func (p *Proxier) markStale(chains []string, start time.Time) {
	if len(chains) == 0 {
		return
	}
	if p.stale == nil {
		p.stale = map[string]time.Time{}
	}
	for _, c := range chains {
		p.stale[c] = start
	}
}

// deleteStale deletes, in a transaction of its own, the flushed chains
// that have waited StaleChainDelay by now. A failure (a chain still
// referenced) is reported and makes the next sync full, whose listing
// finds the chains again and flushes and marks them anew, as kube-proxy's.
func (p *Proxier) deleteStale(ctx context.Context, now time.Time) (int, error) {
	tx := p.NFT.NewTransaction()
	n := 0
	for c, since := range p.stale {
		if now.Sub(since) >= StaleChainDelay {
			tx.Delete(&knftables.Chain{Name: c})
			delete(p.stale, c)
			n++
		}
	}
	if n == 0 {
		return 0, nil
	}
	if err := p.NFT.Run(ctx, tx); err != nil {
		p.forget()
		p.snapID = 0
		return 0, fmt.Errorf("nftables transaction (%s, deleting %d stale chains): %w", p.familyName(), n, err)
	}
	return n, nil
}

// forget drops what is known of the table after a failed transaction, so
// that the next sync lists it and is full; what was applied is kept for
// that sync's affinity set comparisons.
func (p *Proxier) forget() {
	if p.applied != nil {
		p.kept = p.applied
	}
	p.chains, p.sets, p.applied = nil, nil, nil
}

// prior is what the table was last known to hold of each port, for
// replacing affinity sets whose timeout changed.
func (p *Proxier) prior() map[lb.ServicePortName]*portBundle {
	if p.applied != nil {
		return p.applied
	}
	return p.kept
}

// SyncStats says what a sync did.
type SyncStats struct {
	Full    bool
	Changed int // service ports rewritten (every one on a full sync)
	// StaleDeleted is how many stale chains were deleted after the sync;
	// CleanupErr is why they could not be (kube-proxy's nftables cleanup
	// failure): the sync stands, and the next one is full.
	StaleDeleted int
	CleanupErr   error
}

// Sync makes the table match snap: fully on the first sync, after a
// failure, after an options change and hourly; otherwise partially, as
// kube-proxy's nftables mode: only the service ports whose chains, sets or
// map elements changed are rewritten, and only their elements are
// deleted and added.
func (p *Proxier) Sync(ctx context.Context, snap *lb.Snapshot) error {
	_, err := p.SyncStats(ctx, snap)
	return err
}

// SyncStats is Sync, saying whether it was full and how much it wrote.
func (p *Proxier) SyncStats(ctx context.Context, snap *lb.Snapshot) (SyncStats, error) {
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	period := p.FullSyncPeriod
	if period <= 0 {
		period = time.Hour
	}
	start := now()
	var st SyncStats
	var err error
	key := fmt.Sprint(p.Options)
	if p.applied != nil && key == p.optsKey && start.Sub(p.lastFull) < period {
		st, err = p.partial(ctx, snap, start)
	} else {
		// The table holds what was applied when nothing failed since and
		// the options are those it was applied with (the hourly full
		// sync): its objects are known without listing it.
		err = p.full(ctx, snap, p.applied != nil && key == p.optsKey, start)
		if err == nil {
			p.optsKey, p.lastFull = key, start
		}
		st = SyncStats{Full: true, Changed: len(p.applied)}
	}
	if err != nil {
		return st, err
	}
	// After the sync's own transaction, not before as kube-proxy does: the
	// state takes effect one nft run sooner (at 1,000 Services a run is
	// some 100 ms, most of it nft reading the table).
	st.StaleDeleted, st.CleanupErr = p.deleteStale(ctx, start)
	return st, nil
}

// partial writes only what changed since the last sync. When snap says
// it is the snapshot applied last with some ports changed, only those are
// rendered and compared (issue 16: O(changed) per update); otherwise every
// port is, its pointer first.
func (p *Proxier) partial(ctx context.Context, snap *lb.Snapshot, start time.Time) (SyncStats, error) {
	tx := p.NFT.NewTransaction()
	type change struct {
		name     lb.ServicePortName
		old, new *portBundle // old whole (see whole)
	}
	var changes []change
	// unknown: a changed port's applied bundle could not be made whole.
	unknown := false
	// consider compares a port with what was applied of it, recording its
	// bundle in next.
	next := p.applied
	consider := func(name lb.ServicePortName, sp *lb.ServicePort) {
		old := p.applied[name]
		if sp == nil {
			if old != nil {
				if old = p.whole(name, old); old == nil {
					unknown = true
				}
				changes = append(changes, change{name, old, nil})
				delete(next, name)
			}
			return
		}
		if old != nil && p.from[name] == sp {
			next[name] = old // the very same port: the same bundle
			return
		}
		b := renderPort(sp, p.Options)
		if b != nil {
			next[name] = b
		} else {
			delete(next, name)
		}
		switch {
		case b == nil && old == nil:
		case b != nil && old != nil && b.fp == old.fp:
			next[name] = old
		default:
			if old != nil {
				if old = p.whole(name, old); old == nil {
					unknown = true
				}
			}
			changes = append(changes, change{name, old, b})
		}
	}
	var from map[lb.ServicePortName]*lb.ServicePort
	var cips map[string]int
	var addIPs, delIPs []string
	if names, ok := p.delta(snap); ok {
		// In place: a failed transaction makes the next sync full, which
		// rebuilds them.
		from, cips = p.from, p.clusterIPRefs
		touched := map[string]bool{} // cluster IPs, with whether they were in the set
		refs := func(sp *lb.ServicePort, d int) {
			if sp == nil {
				return
			}
			for _, a := range sp.ClusterIPs {
				if p.Options.family(a) {
					s := a.String()
					if _, ok := touched[s]; !ok {
						touched[s] = cips[s] > 0
					}
					if cips[s] += d; cips[s] == 0 {
						delete(cips, s)
					}
				}
			}
		}
		for _, name := range names {
			sp, was := snap.Ports.Get(name), p.from[name]
			if sp == was {
				continue
			}
			refs(was, -1)
			refs(sp, +1)
			consider(name, sp)
			if sp == nil {
				delete(from, name)
			} else {
				from[name] = sp
			}
		}
		for s, was := range touched {
			switch is := cips[s] > 0; {
			case is && !was:
				addIPs = append(addIPs, s)
			case was && !is:
				delIPs = append(delIPs, s)
			}
		}
		p.deltas++
	} else {
		next = make(map[lb.ServicePortName]*portBundle, snap.Ports.Len())
		from = make(map[lb.ServicePortName]*lb.ServicePort, snap.Ports.Len())
		for _, sp := range snap.Sorted() {
			from[sp.Name] = sp
			consider(sp.Name, sp)
		}
		for name := range p.applied {
			if snap.Ports.Get(name) == nil {
				consider(name, nil)
			}
		}
		cips = clusterIPRefs(snap, p.Options)
		for a := range cips {
			if p.clusterIPRefs[a] == 0 {
				addIPs = append(addIPs, a)
			}
		}
		for a := range p.clusterIPRefs {
			if cips[a] == 0 {
				delIPs = append(delIPs, a)
			}
		}
	}
	if unknown {
		// Not what was applied (it cannot happen unless the rendering of
		// an unchanged port changed): the whole table is listed and
		// written instead.
		p.forget()
		p.snapID = 0
		err := p.full(ctx, snap, false, start)
		return SyncStats{Full: true, Changed: len(p.applied)}, err
	}
	if len(changes) == 0 && len(addIPs) == 0 && len(delIPs) == 0 {
		p.from, p.clusterIPRefs, p.snapID = from, cips, snap.ID
		return SyncStats{}, nil
	}
	for _, a := range addIPs {
		tx.Add(&knftables.Element{Set: setClusterIPs, Key: []string{a}})
	}
	for _, a := range delIPs {
		tx.Delete(&knftables.Element{Set: setClusterIPs, Key: []string{a}})
	}
	// 1. New and changed chains and sets, so that elements can point at them.
	for _, c := range changes {
		p.replaceChangedSets(tx, c.old, c.new)
		if c.new != nil {
			c.new.writeObjects(tx)
		}
	}
	// 2. Elements: the stale ones go, then the new ones come.
	for _, c := range changes {
		if c.old != nil {
			c.new.deleteElements(tx, c.old)
		}
	}
	for _, c := range changes {
		if c.new != nil {
			c.new.addElements(tx, c.old)
		}
	}
	// 3. Sets no longer used: deleted; chains: flushed, for a later sync
	// to delete.
	var staleChains []string
	for _, c := range changes {
		if c.old == nil {
			continue
		}
		using := map[string]bool{}
		if c.new != nil {
			for _, ch := range c.new.chains {
				using[ch] = true
			}
			for _, st := range c.new.sets {
				using[st.Name] = true
			}
		}
		for _, ch := range c.old.chains {
			if !using[ch] {
				staleChains = append(staleChains, ch)
				tx.Flush(&knftables.Chain{Name: ch})
			}
		}
		for _, st := range c.old.sets {
			if !using[st.Name] {
				tx.Delete(&knftables.Set{Name: st.Name})
			}
		}
	}
	if err := p.NFT.Run(ctx, tx); err != nil {
		p.forget() // a full sync next
		p.snapID = 0
		return SyncStats{}, fmt.Errorf("nftables transaction (%s, partial): %w", p.familyName(), err)
	}
	for _, c := range changes {
		if c.new != nil {
			for _, ch := range c.new.chains {
				delete(p.stale, ch) // in use again
			}
			next[c.name] = c.new.slim()
		}
	}
	p.markStale(staleChains, start)
	p.applied, p.clusterIPRefs, p.from, p.snapID = next, cips, from, snap.ID
	return SyncStats{Changed: len(changes)}, nil
}

// replaceChangedSets deletes the affinity sets whose definition (its
// timeout) changed, after flushing the chains that refer to them, so that
// they are made anew: the kernel updates a redeclared set's timeout, but
// not every kernel, nor knftables' fake, does. The pins go with them.
//
// After a failed sync (old from kept) the table was listed again: only the
// chains and sets it holds are flushed and deleted (deleting one it does
// not hold would fail the transaction).
func (p *Proxier) replaceChangedSets(tx *knftables.Transaction, old, new *portBundle) {
	if old == nil || new == nil || len(old.sets) == 0 {
		return
	}
	was := map[string]*knftables.Set{}
	for _, st := range old.sets {
		was[st.Name] = st
	}
	var changed []string
	for _, st := range new.sets {
		if o, ok := was[st.Name]; ok && (o.Type != st.Type || *o.Timeout != *st.Timeout) {
			changed = append(changed, st.Name)
		}
	}
	held := func(m map[string]bool, name string) bool { return p.applied != nil || m[name] }
	changed = slices.DeleteFunc(changed, func(n string) bool { return !held(p.sets, n) })
	if len(changed) == 0 {
		return
	}
	for _, c := range old.chains {
		if held(p.chains, c) {
			tx.Flush(&knftables.Chain{Name: c})
		}
	}
	for _, n := range changed {
		tx.Delete(&knftables.Set{Name: n})
	}
}

// legacyBaseChains are base chains of kube-proxy's earlier nftables
// layout (before v1.34), which a table left by it or by an earlier sluice
// may hold: still hooked, they would go on filtering.
var legacyBaseChains = map[string]bool{"filter-prerouting": true, "filter-output-post-dnat": true}

// full rewrites the whole table. known says that the table holds what
// was applied: its per-service chains and sets are then those of the
// applied ports, made again from them, rather than listed. A listing
// names every object by dumping the whole table as JSON, rules included:
// at 10,000 Services x 10 endpoints 82 MB, which knftables took 20 s and
// 1.2 GB of allocations to read here.
func (p *Proxier) full(ctx context.Context, snap *lb.Snapshot, known bool, start time.Time) error {
	if p.chains == nil && known {
		p.chains, p.sets = p.appliedObjects()
	}
	if p.chains == nil {
		chains, sets, err := p.list(ctx)
		if err != nil {
			return err
		}
		p.chains, p.sets = chains, sets
		for c := range p.stale {
			if !chains[c] {
				delete(p.stale, c) // gone behind sluice's back
			}
		}
	}
	var written map[lb.ServicePortName]*portBundle
	if batch := p.fullSyncBatch(); batch > 0 && snap.Ports.Len() > batch && !p.unbatched {
		if len(p.chains) == 0 && len(p.sets) == 0 {
			return p.fresh(ctx, snap, batch)
		}
		w, err := p.rewritePorts(ctx, snap, batch)
		if err != nil {
			return err
		}
		written = w
	}
	tx := p.NFT.NewTransaction()
	if prior := p.prior(); prior != nil {
		for _, sp := range snap.Sorted() {
			if old := prior[sp.Name]; old != nil && len(old.sets) > 0 && written[sp.Name] == nil {
				p.replaceChangedSets(tx, old, renderPort(sp, p.Options))
			}
		}
	}
	d := render(snap, p.Options, tx, phaseWhole, written)
	// The earlier layout's base chains go at once (no map element points
	// to them); per-service chains no longer used are flushed, for a later
	// sync to delete.
	var stale []string
	for c := range p.chains {
		switch {
		case legacyBaseChains[c]:
			tx.Flush(&knftables.Chain{Name: c})
			tx.Delete(&knftables.Chain{Name: c})
		case isServiceObject(c) && !d.Chains[c]:
			stale = append(stale, c)
			tx.Flush(&knftables.Chain{Name: c})
		}
	}
	for s := range p.sets {
		if isServiceObject(s) && !d.Sets[s] {
			tx.Delete(&knftables.Set{Name: s})
		}
	}
	if err := p.NFT.Run(ctx, tx); err != nil {
		p.forget()    // list again: the table is as it was
		p.stale = nil // what the listing finds unused is flushed again
		p.unbatched = written != nil
		return fmt.Errorf("nftables transaction (%s): %w", p.familyName(), err)
	}
	for c := range p.stale {
		if d.Chains[c] {
			delete(p.stale, c) // in use again
		}
	}
	p.markStale(stale, start)
	p.record(snap, d)
	p.unbatched = false
	return nil
}

// rewritePorts is the first part of a full sync in batches over a table
// that holds chains (a restart, the hourly resync, a resync after a
// failure): every port's chains and sets, rewritten in place in
// transactions of batch ports each, a port's always in one. The sync's own
// transaction then refills the maps, rewrites the static chains and deletes
// what is no longer used, nothing of which a batch touches. Between
// batches some services have their new chains and some their old ones,
// each consistent, as between partial syncs; kube-proxy writes it all in one
// transaction, in which the kernel binds every service chain's anonymous
// vmap set by walking the whole transaction (O(N²): 60 s at 10,000
// services here, issue 13).
func (p *Proxier) rewritePorts(ctx context.Context, snap *lb.Snapshot, batch int) (map[lb.ServicePortName]*portBundle, error) {
	o := p.Options.withDefaults()
	prior := p.prior() // the batches' failures forget applied
	written := map[lb.ServicePortName]*portBundle{}
	var tx *knftables.Transaction
	n := 0
	run := func() error {
		err := p.NFT.Run(ctx, tx)
		tx, n = nil, 0
		if err != nil {
			p.forget()
			p.unbatched = true // the next full sync is one transaction
			return fmt.Errorf("nftables transaction (%s, full sync, service chains): %w", p.familyName(), err)
		}
		return nil
	}
	for _, sp := range snap.Sorted() {
		b := renderPort(sp, o)
		if b == nil {
			continue
		}
		if tx == nil {
			tx = p.NFT.NewTransaction()
			// What the ports' rules refer to (add: no change if it is there).
			tx.Add(&knftables.Chain{Name: chainMarkForMasq})
			tx.Add(&knftables.Chain{Name: chainReject, Comment: knftables.PtrTo(rejectChainComment)})
		}
		if old := prior[sp.Name]; old != nil && len(old.sets) > 0 {
			p.replaceChangedSets(tx, old, b)
		}
		b.writeObjects(tx)
		written[sp.Name] = b
		if n++; n == batch {
			if err := run(); err != nil {
				return nil, err
			}
		}
	}
	if tx != nil {
		if err := run(); err != nil {
			return nil, err
		}
	}
	return written, nil
}

// whole is name's applied bundle b with its chains and elements: b
// itself when it was kept whole, else b rendered again from the port it
// was rendered from (p.from, with the same options: a partial sync runs
// only while they are unchanged); nil when that rendering is not b.
func (p *Proxier) whole(name lb.ServicePortName, b *portBundle) *portBundle {
	if !b.slimmed {
		return b
	}
	sp := p.from[name]
	if sp == nil {
		return nil
	}
	w := renderPort(sp, p.Options.withDefaults())
	if w == nil || w.fp != b.fp {
		return nil
	}
	w.rules = nil
	return w
}

// record records d, rendered from snap, as what the table holds.
func (p *Proxier) record(snap *lb.Snapshot, d Desired) {
	// The table's chains and sets are not kept: the next full sync lists
	// them (a set of every name was some 360 bytes per port at 10
	// endpoints, issue 16's memory budget), and a partial one knows a
	// changed port's from its bundle.
	p.chains, p.sets, p.applied, p.kept = nil, nil, d.Ports, nil
	for name, b := range p.applied {
		p.applied[name] = b.slim()
	}
	p.clusterIPRefs, p.snapID = clusterIPRefs(snap, p.Options), snap.ID
	p.from = make(map[lb.ServicePortName]*lb.ServicePort, snap.Ports.Len())
	for name, sp := range snap.Ports.All() {
		p.from[name] = sp
	}
}

// DefaultFullSyncBatch is Proxier.FullSyncBatch's default.
const DefaultFullSyncBatch = 1000

func (p *Proxier) fullSyncBatch() int {
	if p.FullSyncBatch == 0 {
		return DefaultFullSyncBatch
	}
	return p.FullSyncBatch
}

// fresh is a full sync onto a table that holds no chain, so that nothing
// in it is hooked: everything but the base chains goes in first, in
// transactions of batch service ports each, and a last transaction adds
// the base chains, which make it all live at once. A packet sees the table
// change in one step, as with one transaction, but the first sync of a
// large node is several times faster: the kernel binds each rule's
// anonymous set (every service chain's numgen vmap) by walking the whole
// transaction, so one transaction of N services costs O(N²) there (issue
// 13: 181 s at 10,000 services here, 32 s in batches of 1,000). A table
// that holds chains goes through rewritePorts instead: its chains may be
// live. On a failure the next sync lists the table and rewrites it whole,
// in one transaction.
func (p *Proxier) fresh(ctx context.Context, snap *lb.Snapshot, batch int) error {
	run := func(tx *knftables.Transaction, what string) error {
		if err := p.NFT.Run(ctx, tx); err != nil {
			p.forget()
			p.unbatched = true // the next full sync is one transaction
			return fmt.Errorf("nftables transaction (%s, first sync onto an empty table, %s): %w", p.familyName(), what, err)
		}
		return nil
	}
	tx := p.NFT.NewTransaction()
	d := render(snap, p.Options, tx, phaseUnhooked, nil)
	o := p.Options.withDefaults()
	n := 0
	pending := true // tx holds what is not in the table yet (first, the static part)
	for _, sp := range snap.Sorted() {
		b := renderPort(sp, o)
		if b == nil {
			continue
		}
		b.writeObjects(tx)
		b.addElements(tx, nil)
		d.take(sp.Name, b)
		pending = true
		if n++; n == batch {
			if err := run(tx, "service chains and map elements"); err != nil {
				return err
			}
			tx, n, pending = p.NFT.NewTransaction(), 0, false
		}
	}
	if pending {
		if err := run(tx, "service chains and map elements"); err != nil {
			return err
		}
	}
	tx = p.NFT.NewTransaction()
	render(snap, p.Options, tx, phaseHooks, nil)
	if err := run(tx, "base chains"); err != nil {
		return err
	}
	p.record(snap, d)
	p.unbatched = false
	return nil
}

func (p *Proxier) familyName() string {
	if p.Options.IPv6 {
		return "ip6"
	}
	return "ip"
}

// appliedObjects are the per-service chains and sets of the applied
// ports, each port made whole; nil when one cannot be (then the table is
// listed).
func (p *Proxier) appliedObjects() (chains, sets map[string]bool) {
	chains, sets = map[string]bool{}, map[string]bool{}
	for name, b := range p.applied {
		w := p.whole(name, b)
		if w == nil {
			return nil, nil
		}
		for _, c := range w.chains {
			chains[c] = true
		}
		for _, st := range w.sets {
			sets[st.Name] = true
		}
	}
	return chains, sets
}

// list reads the table's chains and sets (none when it does not exist),
// in one listing: nft lists a whole table to name one kind of object in
// it, rules included.
func (p *Proxier) list(ctx context.Context) (chains, sets map[string]bool, err error) {
	chains, sets = map[string]bool{}, map[string]bool{}
	all, err := p.NFT.ListAll(ctx)
	if err != nil && !knftables.IsNotFound(err) {
		return nil, nil, fmt.Errorf("list %s %s: %w", p.familyName(), Table, err)
	}
	for _, c := range all["chain"] {
		chains[c] = true
	}
	for _, s := range all["set"] {
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

// delta returns the ports snap says changed since the snapshot applied
// last, sorted, and true; false when it does not say so.
func (p *Proxier) delta(snap *lb.Snapshot) ([]lb.ServicePortName, bool) {
	if p.snapID == 0 || p.from == nil || p.clusterIPRefs == nil {
		return nil, false
	}
	names, ok := snap.DeltaSince(p.snapID)
	if !ok {
		return nil, false
	}
	return names, true
}
