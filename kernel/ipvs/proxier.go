package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/sluice-proxy/sluice/lb"
)

// Proxier reconciles one family's IPVS table with snapshots. Every
// virtual server of the family that the sync did not produce is deleted,
// except those inside ExcludeCIDRs (--ipvs-exclude-cidrs). A removed real
// server of a TCP virtual server that still has connections gets weight 0
// and is deleted by Drain once they are gone (graceful termination); one
// of UDP or SCTP is deleted at once, as kube-proxy does.
type Proxier struct {
	Kernel       Kernel
	Options      Options
	ExcludeCIDRs []netip.Prefix

	mu       sync.Mutex
	draining map[Key]map[netip.AddrPort]bool
	synced   bool
	table    appliedTable // what the syncs so far left, for SyncChanged
}

// Sync makes the table match snap and returns the addresses kube-ipvs0
// must hold.
func (p *Proxier) Sync(snap *lb.Snapshot) ([]netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining == nil {
		p.draining = map[Key]map[netip.AddrPort]bool{}
	}
	d, table := render(snap, p.Options)
	p.table.reset() // until this sync succeeds, the next one compares everything
	current, err := p.Kernel.Services()
	if err != nil {
		return nil, fmt.Errorf("list virtual servers: %w", err)
	}
	have := map[Key]Service{}
	for _, s := range current {
		have[s.Key] = s
	}
	var errs []error
	keys := make([]Key, 0, len(d.Servers))
	for k := range d.Servers {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int { return compareKeys(a, b) })
	for _, k := range keys {
		vs := d.Servers[k]
		if cur, ok := have[k]; !ok {
			if err := p.Kernel.AddService(vs.Service); err != nil {
				errs = append(errs, fmt.Errorf("%s (%s): add virtual server: %w", vs.Name, k, err))
				continue
			}
		} else if cur != vs.Service {
			if err := p.Kernel.UpdateService(vs.Service); err != nil {
				errs = append(errs, fmt.Errorf("%s (%s): update virtual server: %w", vs.Name, k, err))
				continue
			}
		}
		if err := p.syncReals(vs); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", vs.Name, k, err))
		}
	}
	for _, s := range current {
		if _, want := d.Servers[s.Key]; want || s.Addr.Is6() != p.Options.IPv6 || p.excluded(s.Addr) {
			continue
		}
		if err := p.Kernel.DeleteService(s.Key); err != nil {
			errs = append(errs, fmt.Errorf("delete stale virtual server %s: %w", s.Key, err))
		}
		delete(p.draining, s.Key)
	}
	p.synced = true
	if len(errs) == 0 {
		table.id, table.nodeIPs = snap.ID, slices.Clone(p.Options.NodeIPs)
		p.table = table
	}
	return d.Bind, errors.Join(errs...)
}

func compareKeys(a, b Key) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Port != b.Port {
		return int(a.Port) - int(b.Port)
	}
	switch {
	case a.Proto < b.Proto:
		return -1
	case a.Proto > b.Proto:
		return 1
	}
	return 0
}

func (p *Proxier) excluded(a netip.Addr) bool {
	for _, c := range p.ExcludeCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

func (p *Proxier) syncReals(vs *VirtualServer) error {
	cur, err := p.Kernel.Reals(vs.Key)
	if err != nil {
		return fmt.Errorf("list real servers: %w", err)
	}
	want := map[netip.AddrPort]bool{}
	for _, r := range vs.Reals {
		want[r] = true
	}
	var errs []error
	have := map[netip.AddrPort]Real{}
	for _, r := range cur {
		have[r.Addr] = r
	}
	for _, a := range vs.Reals {
		r, ok := have[a]
		switch {
		case !ok:
			if err := p.Kernel.AddReal(vs.Key, Real{Addr: a, Weight: 1}); err != nil {
				errs = append(errs, fmt.Errorf("add real server %s: %w", a, err))
			}
		case r.Weight != 1:
			// Back from graceful termination, or reset on the first sync.
			if err := p.Kernel.UpdateReal(vs.Key, Real{Addr: a, Weight: 1}); err != nil {
				errs = append(errs, fmt.Errorf("restore real server %s: %w", a, err))
			}
		}
		if q := p.draining[vs.Key]; q != nil {
			delete(q, a)
		}
	}
	for _, r := range cur {
		if want[r.Addr] || p.draining[vs.Key][r.Addr] {
			continue // wanted, or already quiesced: Drain deletes it
		}
		if vs.Proto == lb.TCP && r.Active+r.Inactive > 0 {
			if r.Weight != 0 {
				if err := p.Kernel.UpdateReal(vs.Key, Real{Addr: r.Addr, Weight: 0}); err != nil {
					errs = append(errs, fmt.Errorf("quiesce real server %s: %w", r.Addr, err))
					continue
				}
			}
			if p.draining[vs.Key] == nil {
				p.draining[vs.Key] = map[netip.AddrPort]bool{}
			}
			p.draining[vs.Key][r.Addr] = true
			continue
		}
		if err := p.Kernel.DeleteReal(vs.Key, r.Addr); err != nil {
			errs = append(errs, fmt.Errorf("delete real server %s: %w", r.Addr, err))
		}
	}
	return errors.Join(errs...)
}

// Draining lists the real servers waiting for their connections to end.
func (p *Proxier) Draining() map[Key][]netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[Key][]netip.AddrPort{}
	for k, q := range p.draining {
		for a := range q {
			out[k] = append(out[k], a)
		}
		slices.SortFunc(out[k], netip.AddrPort.Compare)
	}
	return out
}

// Drain deletes the quiesced real servers whose connections have ended
// (kube-proxy checks every minute); it returns how many it deleted.
func (p *Proxier) Drain() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	var errs []error
	for k, q := range p.draining {
		cur, err := p.Kernel.Reals(k)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: list real servers: %w", k, err))
			continue
		}
		byAddr := map[netip.AddrPort]Real{}
		for _, r := range cur {
			byAddr[r.Addr] = r
		}
		for a := range q {
			r, ok := byAddr[a]
			if !ok {
				delete(q, a)
				continue
			}
			if r.Active+r.Inactive > 0 {
				continue
			}
			if err := p.Kernel.DeleteReal(k, a); err != nil {
				errs = append(errs, fmt.Errorf("%s: delete drained real server %s: %w", k, a, err))
				continue
			}
			delete(q, a)
			n++
		}
		if len(q) == 0 {
			delete(p.draining, k)
		}
	}
	return n, errors.Join(errs...)
}

// Cleanup deletes every virtual server of the table outside exclude
// (--ipvs-exclude-cidrs), as kube-proxy's cleanup flushes IPVS.
func Cleanup(k Kernel, exclude []netip.Prefix) error {
	svcs, err := k.Services()
	if err != nil {
		return err
	}
	p := &Proxier{ExcludeCIDRs: exclude}
	var errs []error
	for _, s := range svcs {
		if p.excluded(s.Addr) {
			continue
		}
		if err := k.DeleteService(s.Key); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", s.Key, err))
		}
	}
	return errors.Join(errs...)
}
