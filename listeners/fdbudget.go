package listeners

import (
	"sync/atomic"
)

// fdBudget caps the descriptors the data plane holds, below the process's
// limit, so that running out is the data plane pausing its accepts (new
// clients wait in the kernel's accept queue, as behind HAProxy's maxconn)
// rather than every accept failing with EMFILE: the admin endpoints, the
// API watch and the kernel-mode commands keep the descriptors they need,
// and a liveness probe does not fail, and restart the pod, only because
// the data plane is full (issue 19, item 7).
type fdBudget struct {
	limit int64 // 0: no limit
	held  atomic.Int64
}

// fdReserve is what is left outside the data plane: a sixteenth of the
// limit, at least 64.
func fdReserve(limit int64) int64 { return max(64, limit/16) }

func newFDBudget(maxFDs int) *fdBudget {
	switch {
	case maxFDs > 0:
		return &fdBudget{limit: int64(maxFDs)}
	case maxFDs < 0:
		return &fdBudget{}
	}
	lim := processFDLimit()
	if lim <= 0 {
		return &fdBudget{}
	}
	return &fdBudget{limit: max(16, lim-fdReserve(lim))}
}

// take reserves n descriptors; false if that would pass the limit.
func (b *fdBudget) take(n int64) bool {
	if b.limit == 0 {
		b.held.Add(n)
		return true
	}
	for {
		h := b.held.Load()
		if h+n > b.limit {
			return false
		}
		if b.held.CompareAndSwap(h, h+n) {
			return true
		}
	}
}

// give returns n descriptors.
func (b *fdBudget) give(n int64) { b.held.Add(-n) }
