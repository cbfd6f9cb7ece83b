package listeners

import (
	"container/heap"
	"time"
)

// deadline is one pending call on an event loop: fn (or, without one,
// owner's expire) runs on the loop once the loop's clock reaches at, unless
// it is cancelled first.
type deadline struct {
	at    time.Time
	fn    func()
	owner expirer
	index int // in the heap; -1 once it has run or been cancelled
}

// expirer is what a deadline kept inside it times out: a proxied
// connection's connect and half-close timers are one deadline in the
// connection, re-armed, so a connection allocates no closure and no
// deadline (issue 12).
type expirer interface{ expire() }

// deadlines is an event loop's timers: a min-heap on time, driven by the
// loop's own poll timeout, so connect timeouts, back-offs and flow expiry
// cost no runtime timer, goroutine or channel. It is owned by one loop and
// not safe for concurrent use.
type deadlines struct{ h deadlineHeap }

// add schedules fn at at and returns its handle for cancel.
func (d *deadlines) add(at time.Time, fn func()) *deadline {
	x := &deadline{at: at, fn: fn}
	heap.Push(&d.h, x)
	return x
}

// arm schedules x, kept and reused by its owner, at at; if x is pending
// it moves.
func (d *deadlines) arm(x *deadline, at time.Time) {
	x.at = at
	if x.index >= 0 && x.index < len(d.h) && d.h[x.index] == x {
		heap.Fix(&d.h, x.index)
		return
	}
	heap.Push(&d.h, x)
}

// cancel removes x if it has not run yet; a nil or spent x is ignored.
func (d *deadlines) cancel(x *deadline) {
	if x == nil || x.index < 0 {
		return
	}
	heap.Remove(&d.h, x.index)
}

// next is when the earliest deadline falls, and false when there is none.
func (d *deadlines) next() (time.Time, bool) {
	if len(d.h) == 0 {
		return time.Time{}, false
	}
	return d.h[0].at, true
}

// fire runs, in time order, every deadline at or before now, including
// those a call adds for no later than now. It returns how many ran.
func (d *deadlines) fire(now time.Time) int {
	n := 0
	for len(d.h) > 0 && !d.h[0].at.After(now) {
		x := heap.Pop(&d.h).(*deadline)
		if x.fn != nil {
			x.fn()
		} else {
			x.owner.expire()
		}
		n++
	}
	return n
}

// waitMillis is the poll timeout, in epoll_wait's milliseconds, until the
// earliest deadline: -1 when there is none, rounded up so the loop never
// wakes just before a deadline and polls again for nothing.
func (d *deadlines) waitMillis(now time.Time) int {
	at, ok := d.next()
	if !ok {
		return -1
	}
	wait := at.Sub(now)
	if wait <= 0 {
		return 0
	}
	ms := (wait + time.Millisecond - 1) / time.Millisecond
	if ms > 1<<30 {
		ms = 1 << 30
	}
	return int(ms)
}

func (d *deadlines) len() int { return len(d.h) }

type deadlineHeap []*deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *deadlineHeap) Push(x any) {
	d := x.(*deadline)
	d.index = len(*h)
	*h = append(*h, d)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	n := len(old)
	d := old[n-1]
	old[n-1] = nil
	d.index = -1
	*h = old[:n-1]
	return d
}
