package iptables

import (
	"slices"
	"strings"

	"github.com/sluice-proxy/sluice/lb"
)

// deltaState is what a partial sync from a snapshot's delta starts from:
// the snapshot last applied, its ports in name order, its endpoints and
// its ports' own-chain rules. Valid while Proxier.applied is.
type deltaState struct {
	snap         *lb.Snapshot
	order        []*lb.ServicePort
	endpoints    int
	bodyRulesAll int
	// deltas counts the syncs rendered from a delta (for tests).
	deltas int
}

// renderDelta is a partial sync's render when snap says it is the
// snapshot applied last with the ports it names changed (issue 16: O(changed)
// per update). Only those ports are rendered and looked up; every other
// port's lines in the top-level chains come from the cache, in the order
// kept, and its chains are neither listed nor compared. It writes what
// renderPartial would write for the same sync, and changes the proxier's
// bodies, cache and order in place (a failed restore makes the next sync
// full, which rebuilds them). False, having changed nothing,
// when snap does not say so, or when the change turns large-cluster mode
// on or off (every port renders differently then).
func (p *Proxier) renderDelta(snap *lb.Snapshot, o Options, lastTop *TopSums) (rendered, bool) {
	d := &p.delta
	if d.snap == nil || p.applied == nil || p.cache.ports == nil {
		return rendered{}, false
	}
	names, ok := snap.DeltaSince(d.snap.ID)
	if !ok {
		return rendered{}, false
	}
	endpoints := d.endpoints
	for _, n := range names {
		old, sp := d.snap.Ports.Get(n), snap.Ports.Get(n)
		if old != nil {
			if _, ok := p.cache.ports[old]; !ok {
				return rendered{}, false
			}
			endpoints -= len(old.Endpoints)
		}
		if sp != nil {
			endpoints += len(sp.Endpoints)
		}
	}
	mark := o.Mark()
	o.largeCluster = endpoints > LargeClusterEndpoints
	if o.cacheKey() != p.cache.key {
		return rendered{}, false
	}

	// The ports' own chains are distinct by name (each is named from its
	// port, and a KUBE-SEP from its endpoint too), so a changed port's
	// chains are its own: only those the old ports had and the new ones
	// have not are stale.
	pr := &portsRendered{bodies: p.applied, bodyRulesAll: d.bodyRulesAll}
	scratch := newPortScratch()
	var portChains, declared, gone []string
	chain := func(name string) { portChains = append(portChains, name) }
	made := map[string]bool{}
	byName := func(sp *lb.ServicePort, n lb.ServicePortName) int { return sp.Name.Compare(n) }
	written := 0
	for _, n := range names {
		old, sp := d.snap.Ports.Get(n), snap.Ports.Get(n)
		if old == sp {
			continue // named, but the very port applied
		}
		i, found := slices.BinarySearchFunc(d.order, n, byName)
		if old != nil {
			c := p.cache.ports[old]
			delete(p.cache.ports, old)
			for ch := range strings.FieldsSeq(c.chains) {
				gone = append(gone, ch)
			}
			pr.bodyRulesAll -= c.bodyRules
		}
		switch {
		case sp == nil && found:
			d.order = slices.Delete(d.order, i, i+1)
		case sp != nil && found:
			d.order[i] = sp
		case sp != nil:
			d.order = slices.Insert(d.order, i, sp)
		}
		if sp == nil {
			delete(pr.bodies, n)
			continue
		}
		portChains = portChains[:0]
		c, w := pr.renderPort(sp, o, mark, pr.bodies, &portChains, chain, scratch, true)
		p.cache.ports[sp] = c
		for ch := range strings.FieldsSeq(c.chains) {
			made[ch] = true
		}
		if len(c.chains) == 0 {
			delete(pr.bodies, n)
		}
		if w {
			declared = append(declared, portChains...)
			written += c.bodyRules
		}
	}
	pr.declare(declared)
	for _, ch := range gone {
		if !made[ch] {
			pr.stale = append(pr.stale, ch)
		}
	}
	pr.skipped = pr.bodyRulesAll - written
	// Every port's lines in the top-level chains, in name order: what the
	// changed ones wrote above was in the order of the change.
	pr.filterRules.b.Reset()
	pr.natRules.b.Reset()
	pr.natRules.b.Grow(len(d.order) * 256)
	for _, sp := range d.order {
		c := p.cache.ports[sp]
		pr.filterRules.b.Write(c.filter)
		pr.natRules.b.Write(c.nat)
	}
	r := assemble(pr, o, mark, lastTop, hookPlan{})
	r.sorted, r.endpoints, r.bodyRulesAll = d.order, endpoints, pr.bodyRulesAll
	d.deltas++
	return r, true
}
