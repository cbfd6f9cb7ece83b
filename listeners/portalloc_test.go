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
