package listeners

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestDeadlinesFireInOrderAndCancel(t *testing.T) {
	var d deadlines
	t0 := time.Unix(1000, 0)
	var ran []int
	add := func(ms, id int) *deadline {
		return d.add(t0.Add(time.Duration(ms)*time.Millisecond), func() { ran = append(ran, id) })
	}
	add(30, 3)
	c := add(10, 1)
	add(20, 2)
	add(5, 0)
	if got := d.waitMillis(t0); got != 5 {
		t.Fatalf("waitMillis = %d, want 5", got)
	}
	d.cancel(c)
	d.cancel(c) // twice is harmless
	if n := d.fire(t0.Add(20 * time.Millisecond)); n != 2 {
		t.Fatalf("fired %d, want 2", n)
	}
	if !slices.Equal(ran, []int{0, 2}) {
		t.Fatalf("ran %v, want [0 2] (1 was cancelled)", ran)
	}
	if got := d.waitMillis(t0.Add(20*time.Millisecond + 1)); got != 10 {
		t.Fatalf("waitMillis rounds up: got %d, want 10", got)
	}
	d.fire(t0.Add(time.Hour))
	if got := d.waitMillis(t0); got != -1 || d.len() != 0 {
		t.Fatalf("empty: waitMillis %d len %d", got, d.len())
	}
}

func TestDeadlinesFireAddsDuringFire(t *testing.T) {
	var d deadlines
	t0 := time.Unix(1000, 0)
	n := 0
	d.add(t0, func() {
		n++
		d.add(t0, func() { n++ })                  // due now: runs in the same fire
		d.add(t0.Add(time.Second), func() { n++ }) // later: does not
	})
	if got := d.fire(t0); got != 2 || n != 2 {
		t.Fatalf("fire = %d, n = %d, want 2, 2", got, n)
	}
	if d.len() != 1 {
		t.Fatalf("len = %d, want 1", d.len())
	}
}

// A random walk of adds and cancels fires exactly the live deadlines, in
// time order.
func TestDeadlinesRandomWalk(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		var d deadlines
		t0 := time.Unix(0, 0)
		live := map[*deadline]time.Duration{}
		var all []*deadline
		var fired []time.Duration
		for i := 0; i < 50; i++ {
			if len(all) > 0 && r.IntN(3) == 0 {
				x := all[r.IntN(len(all))]
				d.cancel(x)
				delete(live, x)
				continue
			}
			at := time.Duration(r.IntN(1000)) * time.Millisecond
			var x *deadline
			x = d.add(t0.Add(at), func() {
				if _, ok := live[x]; !ok {
					t.Fatalf("a cancelled deadline ran")
				}
				fired = append(fired, at)
			})
			live[x] = at
			all = append(all, x)
		}
		d.fire(t0.Add(time.Hour))
		if len(fired) != len(live) || !slices.IsSorted(fired) {
			t.Fatalf("round %d: fired %d of %d live, sorted %v", round, len(fired), len(live), slices.IsSorted(fired))
		}
	}
}

// expiries is an owner that counts its deadline's expiries and re-arms it
// from expire as many times as it is told.
type expiries struct {
	d      *deadlines
	dl     deadline
	n      int
	rearms int
	at     time.Time
}

func (e *expiries) expire() {
	e.n++
	if e.rearms > 0 {
		e.rearms--
		e.at = e.at.Add(time.Second)
		e.d.arm(&e.dl, e.at)
	}
}

// A deadline kept inside its owner is reused: armed, moved while pending
// (never in the heap twice), cancelled and armed again, re-armed from its
// own expire, and it never disturbs the deadlines around it.
func TestDeadlinesArmAKeptDeadline(t *testing.T) {
	var d deadlines
	t0 := time.Unix(1000, 0)
	e := &expiries{d: &d, at: t0.Add(2 * time.Second)}
	e.dl = deadline{owner: e, index: -1}
	var ran []int
	d.add(t0.Add(time.Second), func() { ran = append(ran, 1) })
	d.arm(&e.dl, t0.Add(5*time.Second))
	d.arm(&e.dl, e.at) // moved earlier while pending
	d.add(t0.Add(3*time.Second), func() { ran = append(ran, 3) })
	if d.len() != 3 {
		t.Fatalf("len = %d, want 3 (the kept deadline once)", d.len())
	}
	d.cancel(&e.dl)
	d.arm(&e.dl, e.at)
	e.rearms = 2 // fires at 2 s, then 3 s, then 4 s
	if n := d.fire(t0.Add(10 * time.Second)); n != 5 || e.n != 3 || !slices.Equal(ran, []int{1, 3}) {
		t.Fatalf("fired %d, owner expired %d times, funcs ran %v; want 5, 3, [1 3]", n, e.n, ran)
	}
	if d.len() != 0 || e.dl.index != -1 {
		t.Fatalf("after: len %d, index %d", d.len(), e.dl.index)
	}
	// A zero deadline (index 0, never armed) is not taken for the heap's
	// first element.
	var other expiries
	other.dl.owner = &other
	d.add(t0, func() {})
	d.arm(&other.dl, t0.Add(time.Second))
	if d.len() != 2 {
		t.Fatalf("a never-armed deadline at index 0 replaced the heap's first: len %d", d.len())
	}
}

// Arming a kept deadline and firing it allocate nothing (a closure and a
// deadline per timer did, twice per proxied connection).
func TestDeadlinesArmAllocatesNothing(t *testing.T) {
	var d deadlines
	t0 := time.Unix(1000, 0)
	e := &expiries{d: &d}
	e.dl = deadline{owner: e, index: -1}
	d.arm(&e.dl, t0) // the heap's room, once
	d.fire(t0)
	if n := testing.AllocsPerRun(100, func() {
		d.arm(&e.dl, t0)
		d.fire(t0)
	}); n != 0 {
		t.Fatalf("arm and fire: %v allocations, want 0", n)
	}
}
