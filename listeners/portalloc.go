package listeners

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// PortAllocator hands out proxy ports from a range, starting at a random
// offset so that restarts do not reuse ports in order. With an empty range it
// returns 0, letting the kernel choose.
type PortAllocator struct {
	base, size int
	mu         sync.Mutex
	used       map[int]bool
}

// NewPortAllocator returns an allocator over ports base..base+size-1; base 0
// means random ports chosen by the kernel.
func NewPortAllocator(base, size int) *PortAllocator {
	return &PortAllocator{base: base, size: size, used: map[int]bool{}}
}

// ErrPortRangeExhausted means every port of the range is in use.
var ErrPortRangeExhausted = fmt.Errorf("proxy port range exhausted")

// Next returns a free port, or 0 when the range is random.
func (a *PortAllocator) Next() (int, error) {
	if a.base == 0 {
		return 0, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	off := rand.IntN(a.size)
	for i := 0; i < a.size; i++ {
		p := a.base + (off+i)%a.size
		if !a.used[p] {
			a.used[p] = true
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: %d-%d", ErrPortRangeExhausted, a.base, a.base+a.size-1)
}

// Release returns a port. Ports outside the range are ignored.
func (a *PortAllocator) Release(p int) {
	a.mu.Lock()
	delete(a.used, p)
	a.mu.Unlock()
}
