// Package affinity owns ClientIP session affinity: a table that pins a client
// IP to one endpoint for a TTL, with an injected clock. It knows nothing about
// sockets, Kubernetes or the kernel, and uses only the standard library.
package affinity

import (
	"net/netip"
	"sync"
	"time"
)

// Clock is the time source. Tests inject a fake one.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

type pin struct {
	endpoint netip.AddrPort
	lastUsed time.Time
}

// Table pins client IPs to endpoints. A pin lives until it has been unused for
// the TTL, or until its endpoint goes away. The zero value is not usable; use
// NewTable. A Table is safe for concurrent use.
type Table struct {
	clock Clock

	mu   sync.Mutex
	ttl  time.Duration
	pins map[netip.Addr]pin
}

// NewTable returns an empty table with the given TTL.
func NewTable(ttl time.Duration, clock Clock) *Table {
	if clock == nil {
		clock = SystemClock{}
	}
	return &Table{clock: clock, ttl: ttl, pins: make(map[netip.Addr]pin)}
}

// SetTTL changes the TTL. Existing pins are judged against the new value,
// which fixes legacy kube-proxy's habit of ignoring timeout changes.
func (t *Table) SetTTL(ttl time.Duration) {
	t.mu.Lock()
	t.ttl = ttl
	t.mu.Unlock()
}

// Lookup returns the live pin for client and refreshes its last use. An
// expired pin is removed and reported as absent.
func (t *Table) Lookup(client netip.Addr) (netip.AddrPort, bool) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pins[client]
	if !ok {
		return netip.AddrPort{}, false
	}
	if now.Sub(p.lastUsed) >= t.ttl {
		delete(t.pins, client)
		return netip.AddrPort{}, false
	}
	p.lastUsed = now
	t.pins[client] = p
	return p.endpoint, true
}

// Pin creates or overwrites the pin for client.
func (t *Table) Pin(client netip.Addr, endpoint netip.AddrPort) {
	now := t.clock.Now()
	t.mu.Lock()
	t.pins[client] = pin{endpoint: endpoint, lastUsed: now}
	t.mu.Unlock()
}

// Unpin removes the pin for client if it points at endpoint.
func (t *Table) Unpin(client netip.Addr, endpoint netip.AddrPort) {
	t.mu.Lock()
	if p, ok := t.pins[client]; ok && p.endpoint == endpoint {
		delete(t.pins, client)
	}
	t.mu.Unlock()
}

// Retain drops every pin whose endpoint is not in live. Pins to endpoints that
// are still present are kept, so unrelated updates never move a client.
func (t *Table) Retain(live func(netip.AddrPort) bool) {
	t.mu.Lock()
	for c, p := range t.pins {
		if !live(p.endpoint) {
			delete(t.pins, c)
		}
	}
	t.mu.Unlock()
}

// Expire removes every pin that has outlived the TTL and returns how many.
func (t *Table) Expire() int {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for c, p := range t.pins {
		if now.Sub(p.lastUsed) >= t.ttl {
			delete(t.pins, c)
			n++
		}
	}
	return n
}

// PerEndpoint counts the live pins (used within the TTL) of each endpoint,
// for status pages; it takes the lock once and allocates one map.
func (t *Table) PerEndpoint() map[netip.AddrPort]int {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[netip.AddrPort]int)
	for _, p := range t.pins {
		if now.Sub(p.lastUsed) < t.ttl {
			out[p.endpoint]++
		}
	}
	return out
}

// Len returns the number of pins, expired or not.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pins)
}

// ManualClock is a Clock that moves only when told to. It is for tests, here
// and in every package that takes a Clock. Safe for concurrent use.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Step moves the clock forward by d.
func (c *ManualClock) Step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
