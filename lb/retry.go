package lb

import (
	"net/netip"
	"time"
)

// DefaultTryTimeouts are legacy kube-proxy's per-try connect timeouts.
var defaultTryTimeouts = [...]time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// RetryPolicy bounds how a connection walks the endpoint ordering: at most
// Attempts tries, try i limited to TryTimeouts[min(i, len-1)], and all tries
// together limited to Budget.
type RetryPolicy struct {
	Attempts    int
	TryTimeouts []time.Duration
	Budget      time.Duration
}

// DefaultRetryPolicy follows legacy kube-proxy: 4 tries of 250ms, 500ms, 1s
// and 2s, so a budget of 3.75s.
func DefaultRetryPolicy() RetryPolicy {
	ts := defaultTryTimeouts[:]
	var budget time.Duration
	for _, t := range ts {
		budget += t
	}
	return RetryPolicy{Attempts: len(ts), TryTimeouts: append([]time.Duration(nil), ts...), Budget: budget}
}

// TryTimeout returns the timeout of try i (0-based), clipped to what is left
// of the budget after elapsed. ok is false when no try i may start.
func (p RetryPolicy) TryTimeout(i int, elapsed time.Duration) (time.Duration, bool) {
	if i >= p.Attempts || len(p.TryTimeouts) == 0 {
		return 0, false
	}
	t := p.TryTimeouts[min(i, len(p.TryTimeouts)-1)]
	if p.Budget > 0 {
		left := p.Budget - elapsed
		if left <= 0 {
			return 0, false
		}
		t = min(t, left)
	}
	return t, true
}

// Validate reports a policy that could never connect.
func (p RetryPolicy) Validate() error {
	if p.Attempts < 1 {
		return errorf("retry attempts must be at least 1, got %d", p.Attempts)
	}
	if len(p.TryTimeouts) == 0 {
		return errorf("at least one per-try timeout is required")
	}
	for _, t := range p.TryTimeouts {
		if t <= 0 {
			return errorf("per-try timeout must be positive, got %s", t)
		}
	}
	if p.Budget < 0 {
		return errorf("retry budget must not be negative, got %s", p.Budget)
	}
	return nil
}

// Walk is one connection's way through an endpoint ordering under a policy:
// each endpoint at most once, at most Attempts tries, within the budget.
type Walk struct {
	order  []netip.AddrPort
	policy RetryPolicy
	start  time.Time
	tries  int
}

// Rewalk makes w a new walk over order at time start, reusing w: an
// engine keeps its walks and their orders' room between connections
// instead of making them per connection.
func (p RetryPolicy) Rewalk(w *Walk, order []netip.AddrPort, start time.Time) {
	*w = Walk{order: order, policy: p, start: start}
}

// Order is the ordering w walks; its room may be reused (as
// Picker.AppendOrder's dst, emptied) once w is done with.
func (w *Walk) Order() []netip.AddrPort { return w.order }

// Next returns the next endpoint to try and that try's timeout, or ok=false
// when the walk is over.
func (w *Walk) Next(now time.Time) (ep netip.AddrPort, timeout time.Duration, ok bool) {
	if w.tries >= len(w.order) {
		return netip.AddrPort{}, 0, false
	}
	timeout, ok = w.policy.TryTimeout(w.tries, now.Sub(w.start))
	if !ok {
		return netip.AddrPort{}, 0, false
	}
	ep = w.order[w.tries]
	w.tries++
	return ep, timeout, true
}

// Tries returns how many tries have been handed out.
func (w *Walk) Tries() int { return w.tries }
