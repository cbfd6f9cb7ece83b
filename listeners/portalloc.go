package listeners

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// PortAllocator hands out proxy ports from a range, starting at a random
// offset so that restarts do not reuse ports in order. With an empty range it
// returns 0, letting the kernel choose, or, made by
// NewEphemeralPortAllocator, random ports of the kernel's ephemeral range.
type PortAllocator struct {
	base, size int
	mu         sync.Mutex
	// used holds a bit per port of the range (at most 8 KiB), made on the
	// first Next: a map of the ports handed out was 29 bytes per service
	// port at 10k (issue 16's memory budget).
	used []uint64
	// ephemeral: random picks in base..base+size-1, skipping reserved.
	ephemeral bool
	reserved  func(port int) bool
}

// NewPortAllocator returns an allocator over ports base..base+size-1; base 0
// means random ports chosen by the kernel.
func NewPortAllocator(base, size int) *PortAllocator {
	return &PortAllocator{base: base, size: size}
}

// ErrPortRangeExhausted means every port of the range is in use.
var ErrPortRangeExhausted = fmt.Errorf("proxy port range exhausted")

// NewEphemeralPortAllocator hands out random ports of the kernel's
// ephemeral range lo..hi (net.ipv4.ip_local_port_range), skipping those
// reserved reports (ip_local_reserved_ports) and, while it can, odd ones,
// as a bind to port 0 does; when its picks keep meeting ports it handed
// out already it returns 0 and the kernel chooses. It picks them itself
// because the kernel's bind to port 0 searches the range for a free port:
// with 10,000 proxy ports bound here each such bind took 260 µs, 2.6 s of
// a 10k-Service start, where a bind to a given port is a hash lookup. A
// port someone else holds fails its bind, and the caller tries the next.
func NewEphemeralPortAllocator(lo, hi int, reserved func(port int) bool) *PortAllocator {
	if lo < 1 || hi < lo || hi > 65535 {
		return NewPortAllocator(0, 0)
	}
	if reserved == nil {
		reserved = func(int) bool { return false }
	}
	return &PortAllocator{base: lo, size: hi - lo + 1, ephemeral: true, reserved: reserved}
}

// ephemeralTries is how many random picks Next makes in an ephemeral
// range before it leaves the choice to the kernel.
const ephemeralTries = 64

// Next returns a free port, or 0 when the range is random.
func (a *PortAllocator) Next() (int, error) {
	if a.base == 0 {
		return 0, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used == nil {
		a.used = make([]uint64, (a.size+63)/64)
	}
	if a.ephemeral {
		for try := 0; try < ephemeralTries; try++ {
			p := a.base + rand.IntN(a.size)
			if try < ephemeralTries/2 && p%2 == 1 {
				// Even ones first, as bind does: connect() starts with odd ones.
				if p > a.base {
					p--
				} else if p < a.base+a.size-1 {
					p++
				}
			}
			if !a.taken(p) && !a.reserved(p) {
				a.take(p)
				return p, nil
			}
		}
		return 0, nil
	}
	off := rand.IntN(a.size)
	for i := 0; i < a.size; i++ {
		p := a.base + (off+i)%a.size
		if !a.taken(p) {
			a.take(p)
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: %d-%d", ErrPortRangeExhausted, a.base, a.base+a.size-1)
}

// Release returns a port. Ports outside the range are ignored.
func (a *PortAllocator) Release(p int) {
	a.mu.Lock()
	if i := p - a.base; i >= 0 && i < a.size && a.used != nil {
		a.used[i/64] &^= 1 << (i % 64)
	}
	a.mu.Unlock()
}

// taken reports whether p, a port of the range, is handed out.
func (a *PortAllocator) taken(p int) bool {
	i := p - a.base
	return a.used[i/64]&(1<<(i%64)) != 0
}

// take marks p, a port of the range, handed out.
func (a *PortAllocator) take(p int) {
	i := p - a.base
	a.used[i/64] |= 1 << (i % 64)
}
