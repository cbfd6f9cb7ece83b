package listeners

import (
	"errors"
	"testing"
)

func TestPortAllocatorExhaustsAndReleases(t *testing.T) {
	a := NewPortAllocator(1, 1)
	p, err := a.Next()
	if err != nil || p != 1 {
		t.Fatalf("Next = %d, %v", p, err)
	}
	if _, err := a.Next(); !errors.Is(err, ErrPortRangeExhausted) {
		t.Fatalf("full range gave %v", err)
	}
	a.Release(1)
	if p, err := a.Next(); err != nil || p != 1 {
		t.Fatalf("after release: %d, %v", p, err)
	}
	seen := map[int]bool{}
	a = NewPortAllocator(100, 50)
	for i := 0; i < 50; i++ {
		p, err := a.Next()
		if err != nil || p < 100 || p > 149 || seen[p] {
			t.Fatalf("Next = %d, %v (seen %v)", p, err, seen[p])
		}
		seen[p] = true
	}
}

func TestEphemeralPortAllocatorPicksRandomFreePortsOfTheRange(t *testing.T) {
	reserved := func(p int) bool { return p == 40002 }
	a := NewEphemeralPortAllocator(40000, 40009, reserved)
	seen := map[int]bool{}
	for i := 0; i < 9; i++ { // every port but the reserved one
		p, err := a.Next()
		if err != nil {
			t.Fatal(err)
		}
		if p == 0 {
			// Left to the kernel: only once its picks keep meeting taken
			// ports, which with 64 tries over 10 ports is past the evens.
			if len(seen) < 5 {
				t.Fatalf("gave up after %d ports: %v", len(seen), seen)
			}
			continue
		}
		if p < 40000 || p > 40009 || p == 40002 || seen[p] {
			t.Fatalf("Next = %d (seen %v)", p, seen)
		}
		seen[p] = true
	}
	// The even ones go first.
	for _, p := range []int{40000, 40004, 40006, 40008} {
		if !seen[p] {
			t.Errorf("even port %d never handed out: %v", p, seen)
		}
	}
	// A full range leaves the choice to the kernel, and a released port
	// comes back.
	b := NewEphemeralPortAllocator(50000, 50000, nil)
	if p, _ := b.Next(); p != 50000 {
		t.Fatalf("Next = %d, want 50000", p)
	}
	if p, err := b.Next(); p != 0 || err != nil {
		t.Fatalf("full: Next = %d, %v; want 0 (the kernel's choice)", p, err)
	}
	b.Release(50000)
	if p, _ := b.Next(); p != 50000 {
		t.Fatalf("after release: Next = %d", p)
	}
	// A range that makes no sense is the kernel's choice throughout.
	if p, _ := NewEphemeralPortAllocator(0, 0, nil).Next(); p != 0 {
		t.Fatalf("empty range: Next = %d", p)
	}
}
