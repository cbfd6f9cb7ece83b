package main

import (
	"fmt"
	"time"
)

// syncBackoff spaces out a kernel plane's syncs after failures (issue
// 18): after n failed syncs in a row the next may run only 1 s << (n-1)
// later, at most max (the plane's resync period), so a restore that keeps
// failing (a 5k-service iptables-nft restore takes minutes) is not retried
// back to back on every API change. A sync that succeeds resets it.
type syncBackoff struct {
	now      func() time.Time // default time.Now
	max      time.Duration
	failures int
	until    time.Time
}

func (b *syncBackoff) clock() time.Time {
	if b.now != nil {
		return b.now()
	}
	return time.Now()
}

// wait is how long until a sync may run (0: now).
func (b *syncBackoff) wait() time.Duration {
	if b.failures == 0 {
		return 0
	}
	return max(0, b.until.Sub(b.clock()))
}

// done records a sync's outcome.
func (b *syncBackoff) done(failed bool) {
	if !failed {
		b.failures, b.until = 0, time.Time{}
		return
	}
	b.failures++
	d := time.Second << min(b.failures-1, 16)
	if b.max > 0 && d > b.max {
		d = b.max
	}
	b.until = b.clock().Add(d)
}

// errBackingOff is a sync deferred by the back-off; the resync loop runs
// it when the wait is over, with the newest state.
type errBackingOff struct {
	failures int
	wait     time.Duration
}

func (e errBackingOff) Error() string {
	return fmt.Sprintf("%d syncs in a row failed; the next try in %v, with the newest state", e.failures, e.wait.Round(time.Millisecond))
}
