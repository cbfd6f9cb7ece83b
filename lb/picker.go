package lb

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/affinity"
)

func errorf(format string, a ...any) error { return fmt.Errorf(format, a...) }

// ErrNoEndpoints means a service port has no usable endpoint.
var ErrNoEndpoints = errors.New("no endpoints")

// EjectionPolicy is passive ejection: after Failures consecutive connect
// failures an endpoint is skipped for Backoff, doubling on each failed probe
// up to MaxBackoff. Failures <= 0 turns ejection off.
type EjectionPolicy struct {
	Failures   int
	Backoff    time.Duration
	MaxBackoff time.Duration
	// OnEject, when set, hears of each ejection: the picker's service port
	// (NewPortPicker's), the endpoint and how long it is skipped. It is
	// called on the data path, under the picker's lock: it must not block.
	// One policy, callbacks included, serves every picker of a server: the
	// port comes as an argument, not in a closure per port.
	OnEject func(port ServicePortName, ep netip.AddrPort, skipped time.Duration)
	// OnReturn, when set, hears of an ejected endpoint that took a
	// connection again (a probe succeeded). The same rules as OnEject.
	OnReturn func(port ServicePortName, ep netip.AddrPort)
}

// DefaultEjectionPolicy ejects after 2 consecutive failures for 5s, up to 1m.
func DefaultEjectionPolicy() EjectionPolicy {
	return EjectionPolicy{Failures: 2, Backoff: 5 * time.Second, MaxBackoff: time.Minute}
}

type health struct {
	consecutive  int
	backoff      time.Duration
	ejectedUntil time.Time
}

// endpointSet is the endpoints a picker chooses from: the usable ones
// of a service port, read-only. It shares the port's own list when every
// endpoint of it is usable (SetUsable), as they mostly are: a copy of the
// addresses was 320 bytes per port of 10 endpoints (issue 16's budget).
type endpointSet struct {
	eps   []Endpoint
	index map[EndpointAddr]int // only above indexFrom endpoints
}

// indexFrom is the endpoint count from which a set keeps a map from
// address to position; below it a scan of the addresses is as fast and
// holds no map (a 10-endpoint map was 1.5 KiB per service port, 15 MB of
// the live heap at 10k Services).
const indexFrom = 32

// newEndpointSet is a set of eps, which it keeps (they must not change).
func newEndpointSet(eps []Endpoint) *endpointSet {
	s := &endpointSet{eps: eps}
	if len(eps) >= indexFrom {
		s.index = make(map[EndpointAddr]int, len(eps))
		for i, ep := range eps {
			s.index[ep.Addr] = i
		}
	}
	return s
}

// list is the set's endpoints; a nil set (a picker's before its first)
// has none.
func (s *endpointSet) list() []Endpoint {
	if s == nil {
		return nil
	}
	return s.eps
}

// find returns a's position in the set (none in a nil set).
func (s *endpointSet) find(ap netip.AddrPort) (int, bool) {
	if s == nil {
		return 0, false
	}
	a := EndpointAddrOf(ap)
	if s.index != nil {
		i, ok := s.index[a]
		return i, ok
	}
	for i, ep := range s.eps {
		if a == ep.Addr {
			return i, true
		}
	}
	return 0, false
}

func (s *endpointSet) has(a netip.AddrPort) bool { _, ok := s.find(a); return ok }

// Picker chooses endpoints for one service port: round robin over the usable
// endpoints, ClientIP affinity when enabled, and passive ejection of endpoints
// that keep failing. Endpoints and affinity are replaced by SetEndpoints and
// SetAffinity without disturbing pins to endpoints that stay. A Picker is safe
// for concurrent use; Order never blocks on I/O.
type Picker struct {
	settings *PickerSettings // shared with the other pickers of a server; read only
	port     ServicePortName // told to the ejection callbacks

	set      atomic.Pointer[endpointSet]
	next     atomic.Uint64
	affinity atomic.Pointer[affinity.Table] // nil when affinity is off

	mu     sync.Mutex
	health map[netip.AddrPort]*health // made by the first failure
}

// PickerSettings are what every picker of a server shares: its clock and
// its ejection policy. One pointer to them, where a clock and a policy
// were two words each, makes a Picker 112 bytes, not 128 (issue 16's
// memory budget).
type PickerSettings struct {
	// Clock is nil for the system's; each picker made with a nil Clock
	// then holds a copy of the settings of its own, so a server sets it.
	Clock    affinity.Clock
	Ejection EjectionPolicy
}

// NewPicker returns a picker with no endpoints.
func NewPicker(clock affinity.Clock, ejection EjectionPolicy) *Picker {
	return NewPortPicker(&PickerSettings{Clock: clock, Ejection: ejection}, ServicePortName{})
}

// NewPortPicker returns a picker with no endpoints for one service port,
// sharing settings (not nil, and not changed afterwards) with the other
// pickers made with them: a server's thousands of ports hold one policy
// between them (issue 16's memory budget).
func NewPortPicker(settings *PickerSettings, port ServicePortName) *Picker {
	if settings.Clock == nil {
		settings = &PickerSettings{Clock: affinity.SystemClock{}, Ejection: settings.Ejection}
	}
	// No set until the first: an empty one each, replaced at once by the
	// port's endpoints, was 32 bytes of garbage per port among the sets
	// kept, in their size class (a heap dump at 10k Services: those
	// spans 60 % full).
	return &Picker{settings: settings, port: port}
}

// SetEndpoints replaces the endpoint list. Pins and health of endpoints that
// remain are kept; the round-robin position is kept too, so an update that
// changes nothing changes no decision.
func (p *Picker) SetEndpoints(addrs []netip.AddrPort) {
	eps := make([]Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = Endpoint{Addr: EndpointAddrOf(a), Ready: true, Serving: true}
	}
	p.setEndpoints(newEndpointSet(eps))
}

// SetUsable is SetEndpoints with sp's usable endpoints (Select(localOnly)),
// sharing sp's list when all of them are.
func (p *Picker) SetUsable(sp *ServicePort, localOnly bool) {
	p.setEndpoints(newEndpointSet(sp.selectEndpoints(localOnly)))
}

func (p *Picker) setEndpoints(s *endpointSet) {
	p.set.Store(s)
	if t := p.affinity.Load(); t != nil {
		t.Retain(s.has)
	}
	p.mu.Lock()
	for a := range p.health {
		if !s.has(a) {
			delete(p.health, a)
		}
	}
	p.mu.Unlock()
}

// Pins counts the clients pinned to each endpoint by ClientIP affinity;
// nil when affinity is off.
func (p *Picker) Pins() map[netip.AddrPort]int {
	if t := p.affinity.Load(); t != nil {
		return t.PerEndpoint()
	}
	return nil
}

// Endpoints returns the current endpoint list. Callers must not modify it.
func (p *Picker) Endpoints() []netip.AddrPort {
	eps := p.set.Load().list()
	out := make([]netip.AddrPort, len(eps))
	for i, ep := range eps {
		out[i] = ep.Addr.AddrPort()
	}
	return out
}

// Len is how many endpoints the picker chooses from.
func (p *Picker) Len() int { return len(p.set.Load().list()) }

// SetAffinity turns ClientIP affinity on (with its timeout) or off. Turning it
// off drops every pin; changing the timeout keeps them.
func (p *Picker) SetAffinity(a Affinity) {
	if !a.ClientIP {
		p.affinity.Store(nil)
		return
	}
	if t := p.affinity.Load(); t != nil {
		t.SetTTL(a.Timeout)
		return
	}
	p.affinity.Store(affinity.NewTable(a.Timeout, p.settings.Clock))
}

// Order returns the endpoints to try, best first: the client's live pin, then
// healthy endpoints in round-robin order, then ejected ones whose back-off
// has run out (probes). Endpoints still in back-off come last, so a service
// whose every endpoint is ejected is still tried rather than refused.
func (p *Picker) Order(client netip.Addr) ([]netip.AddrPort, error) {
	n := len(p.set.Load().list())
	return p.AppendOrder(make([]netip.AddrPort, 0, n), client, n)
}

// AppendOrder appends to dst the first max endpoints of Order's ordering
// (fewer when the port has fewer): a connection tries no more than its
// retry policy's attempts, so it need not order, or hold, the rest
// (issue 12: Order made and filled a list of every endpoint per
// connection). Each call takes a round-robin turn, as Order does.
func (p *Picker) AppendOrder(dst []netip.AddrPort, client netip.Addr, max int) ([]netip.AddrPort, error) {
	s := p.set.Load()
	n := len(s.list())
	if n == 0 {
		return dst, ErrNoEndpoints // s may be nil: nothing below reads it
	}
	max = min(max, n)
	base := len(dst)
	pinned := -1
	if t := p.affinity.Load(); t != nil {
		if ep, ok := t.Lookup(client); ok {
			if i, ok := s.find(ep); ok {
				pinned = i
				if max > 0 {
					dst = append(dst, ep)
				}
			}
		}
	}
	var start int
	if pinned >= 0 {
		// A pinned client does not consume a round-robin turn.
		start = int(p.next.Load() % uint64(n))
	} else {
		start = int((p.next.Add(1) - 1) % uint64(n))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.health) == 0 {
		// Nothing has failed: round-robin order, no clock read.
		for k := 0; k < n && len(dst)-base < max; k++ {
			if i := (start + k) % n; i != pinned {
				dst = append(dst, s.eps[i].Addr.AddrPort())
			}
		}
		return dst, nil
	}
	// The healthy ones first, then those in back-off, each in
	// round-robin order.
	now := p.settings.Clock.Now()
	for _, backedOff := range [2]bool{false, true} {
		for k := 0; k < n && len(dst)-base < max; k++ {
			i := (start + k) % n
			if i == pinned {
				continue
			}
			a := s.eps[i].Addr.AddrPort()
			h := p.health[a]
			if (h != nil && now.Before(h.ejectedUntil)) == backedOff {
				dst = append(dst, a)
			}
		}
	}
	return dst, nil
}

// Connected records that client reached ep: ep's failures are forgiven and,
// under affinity, the client is pinned (or re-pinned) to it.
func (p *Picker) Connected(client netip.Addr, ep netip.AddrPort) {
	if t := p.affinity.Load(); t != nil {
		t.Pin(client, ep)
	}
	p.mu.Lock()
	if h := p.health[ep]; h != nil {
		if h.backoff > 0 && p.settings.Ejection.OnReturn != nil {
			p.settings.Ejection.OnReturn(p.port, ep)
		}
		delete(p.health, ep)
	}
	p.mu.Unlock()
}

// Failed records a failed connect to ep. It reports whether ep is now ejected.
func (p *Picker) Failed(client netip.Addr, ep netip.AddrPort) bool {
	if t := p.affinity.Load(); t != nil {
		t.Unpin(client, ep)
	}
	if p.settings.Ejection.Failures <= 0 {
		return false
	}
	now := p.settings.Clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.set.Load().has(ep) {
		return false
	}
	h := p.health[ep]
	if h == nil {
		if p.health == nil {
			p.health = map[netip.AddrPort]*health{}
		}
		h = &health{}
		p.health[ep] = h
	}
	h.consecutive++
	if h.consecutive < p.settings.Ejection.Failures {
		return false
	}
	if h.backoff == 0 {
		h.backoff = p.settings.Ejection.Backoff
	} else {
		h.backoff = min(2*h.backoff, max(p.settings.Ejection.MaxBackoff, p.settings.Ejection.Backoff))
	}
	h.ejectedUntil = now.Add(h.backoff)
	if p.settings.Ejection.OnEject != nil {
		p.settings.Ejection.OnEject(p.port, ep, h.backoff)
	}
	return true
}

// EjectedFor is how long ep stays in back-off (0: it is not ejected).
func (p *Picker) EjectedFor(ep netip.AddrPort) time.Duration {
	now := p.settings.Clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.health[ep]; h != nil && now.Before(h.ejectedUntil) {
		return h.ejectedUntil.Sub(now)
	}
	return 0
}

// Ejected reports whether ep is currently in back-off.
func (p *Picker) Ejected(ep netip.AddrPort) bool {
	now := p.settings.Clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.health[ep]
	return h != nil && now.Before(h.ejectedUntil)
}

// ExpirePins drops affinity pins that outlived their timeout.
func (p *Picker) ExpirePins() {
	if t := p.affinity.Load(); t != nil {
		t.Expire()
	}
}

// Has reports whether ep is among the current endpoints.
func (p *Picker) Has(ep netip.AddrPort) bool { return p.set.Load().has(ep) }
