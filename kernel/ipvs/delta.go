package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-proxy/sluice/lb"
)

// appliedTable is the IPVS state the syncs so far have left, by service
// port, so that a sync told which ports changed (issue 16) touches only
// their virtual servers: no listing of every virtual server and of every
// one's real servers, which at 10,000 Services is some 10,000 netlink
// dumps per sync.
type appliedTable struct {
	id      uint64       // the snapshot applied; 0: the next sync compares everything
	nodeIPs []netip.Addr // Options.NodeIPs as applied

	servers  map[Key]*VirtualServer
	renders  map[Key]int // how many ports render each virtual server (more than one: the later in name order has it)
	ports    map[lb.ServicePortName]portRender
	bindRefs map[netip.Addr]int // how many ports want each address bound
}

// portRender is what one service port renders: its virtual servers and
// the addresses it wants bound (each once).
type portRender struct {
	servers []*VirtualServer
	bind    []netip.Addr
}

func newAppliedTable() appliedTable {
	return appliedTable{servers: map[Key]*VirtualServer{}, renders: map[Key]int{}, ports: map[lb.ServicePortName]portRender{}, bindRefs: map[netip.Addr]int{}}
}

func (t *appliedTable) reset() { *t = appliedTable{} }

func renderedPort(sp *lb.ServicePort, o Options) portRender {
	var r portRender
	if sp == nil {
		return r
	}
	renderPort(sp, o, func(vs *VirtualServer) { r.servers = append(r.servers, vs) }, func(a netip.Addr) {
		if !slices.Contains(r.bind, a) {
			r.bind = append(r.bind, a)
		}
	})
	return r
}

// setPort records what name renders now (nothing: gone), replacing what
// it rendered before, and returns the addresses whose binding this turned
// on (add) or off (del).
func (t *appliedTable) setPort(name lb.ServicePortName, r portRender) (add, del []netip.Addr) {
	old, had := t.ports[name]
	for _, vs := range old.servers {
		if t.servers[vs.Key] == vs {
			delete(t.servers, vs.Key)
		}
		if t.renders[vs.Key]--; t.renders[vs.Key] == 0 {
			delete(t.renders, vs.Key)
		}
	}
	for _, a := range old.bind {
		if t.bindRefs[a]--; t.bindRefs[a] == 0 {
			delete(t.bindRefs, a)
			if !slices.Contains(r.bind, a) {
				del = append(del, a)
			}
		}
	}
	for _, vs := range r.servers {
		t.servers[vs.Key] = vs
		t.renders[vs.Key]++
	}
	for _, a := range r.bind {
		if t.bindRefs[a]++; t.bindRefs[a] == 1 && !slices.Contains(old.bind, a) {
			add = append(add, a)
		}
	}
	switch {
	case len(r.servers) > 0 || len(r.bind) > 0:
		t.ports[name] = r
	case had:
		delete(t.ports, name)
	}
	return add, del
}

// BindChange is how a sync changed the addresses kube-ipvs0 must hold:
// after a full sync, All of them (Full); else those to add and delete.
type BindChange struct {
	Full     bool
	All      []netip.Addr
	Add, Del []netip.Addr
}

// errCompareAll makes SyncChanged compare everything.
var errCompareAll = errors.New("compare everything")

// SyncChanged brings the table to snap. When snap says which ports
// changed since the snapshot the last sync applied, and that sync
// succeeded with the same node IPs, it touches only their virtual servers
// and lists only the real servers of those whose real servers changed;
// otherwise, and when a changed port shares a virtual server with another
// port, it is Sync. Invalidate makes the next one a Sync.
func (p *Proxier) SyncChanged(snap *lb.Snapshot) (BindChange, error) {
	if bc, err := p.syncChanged(snap); !errors.Is(err, errCompareAll) {
		return bc, err
	}
	bind, err := p.Sync(snap)
	return BindChange{Full: true, All: bind}, err
}

// Invalidate makes the next SyncChanged compare everything: something the
// rendering depends on beside the snapshot and the node IPs changed (the
// host's own addresses, for IsLocal).
func (p *Proxier) Invalidate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.table.id = 0
}

func (p *Proxier) syncChanged(snap *lb.Snapshot) (BindChange, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &p.table
	names, ok := snap.DeltaSince(t.id)
	if !ok || t.id == 0 || !slices.Equal(t.nodeIPs, p.Options.NodeIPs) {
		return BindChange{}, errCompareAll
	}
	type change struct {
		name lb.ServicePortName
		old  portRender
		new  portRender
	}
	changes := make([]change, 0, len(names))
	claimed := map[Key]bool{}
	for _, name := range names {
		c := change{name: name, old: t.ports[name], new: renderedPort(snap.Ports.Get(name), p.Options)}
		// A virtual server this port had that another port has, or one it
		// would take from another: which wins is the full order's call.
		for _, vs := range c.old.servers {
			if t.servers[vs.Key] != vs || t.renders[vs.Key] > 1 {
				return BindChange{}, errCompareAll
			}
		}
		for _, vs := range c.new.servers {
			if cur := t.servers[vs.Key]; claimed[vs.Key] || cur != nil && cur.Name != name {
				return BindChange{}, errCompareAll
			}
			claimed[vs.Key] = true
		}
		changes = append(changes, c)
	}
	t.id = 0 // until this sync succeeds
	var errs []error
	for _, c := range changes {
		for _, vs := range c.new.servers {
			if err := p.applyServer(t.servers[vs.Key], vs); err != nil {
				errs = append(errs, fmt.Errorf("%s (%s): %w", vs.Name, vs.Key, err))
			}
		}
	}
	for _, c := range changes {
		for _, vs := range c.old.servers {
			if claimed[vs.Key] || p.excluded(vs.Addr) {
				continue
			}
			if err := p.Kernel.DeleteService(vs.Key); err != nil {
				errs = append(errs, fmt.Errorf("delete virtual server %s of %s: %w", vs.Key, c.name, err))
			}
			delete(p.draining, vs.Key)
		}
	}
	var bc BindChange
	for _, c := range changes {
		add, del := t.setPort(c.name, c.new)
		bc.Add, bc.Del = append(bc.Add, add...), append(bc.Del, del...)
	}
	// An address one port gave up and another took stays.
	bc.Del = slices.DeleteFunc(bc.Del, func(a netip.Addr) bool { return t.bindRefs[a] > 0 })
	bc.Add = slices.DeleteFunc(bc.Add, func(a netip.Addr) bool { return slices.Contains(bc.Del, a) })
	if len(errs) == 0 {
		t.id = snap.ID
	}
	return bc, errors.Join(errs...)
}

// applyServer brings one virtual server from cur (nil: absent) to vs.
func (p *Proxier) applyServer(cur, vs *VirtualServer) error {
	switch {
	case cur == nil:
		if err := p.Kernel.AddService(vs.Service); err != nil {
			return fmt.Errorf("add virtual server: %w", err)
		}
	case cur.Service != vs.Service:
		if err := p.Kernel.UpdateService(vs.Service); err != nil {
			return fmt.Errorf("update virtual server: %w", err)
		}
	}
	if cur != nil && slices.Equal(cur.Reals, vs.Reals) {
		return nil
	}
	return p.syncReals(vs)
}
