// Package handover owns the hitless restart: a new sluice, started with the
// same command line while the old one runs, receives the old one's
// listening sockets over a Unix socket (SCM_RIGHTS, as HAProxy's
// `expose-fd listeners` and Envoy's hot restart do), serves on them, and
// then tells the old one to retire. The sockets are the same kernel
// objects throughout, so no connection waiting in an accept queue is lost
// and no client is refused; the old process stops accepting and drains
// what it has.
//
// A Broker is the process's register of listening sockets: components ask
// it for an inherited socket before they bind (Take) and record the ones
// they listen on (Hold, Release) so that a successor can have them.
package handover

import (
	"net/netip"
	"sync"
)

// key names a listening socket: its network ("tcp", "udp", "sctp") and
// address.
type key struct {
	network string
	addr    netip.AddrPort
}

// Broker holds the sockets inherited from a predecessor until they are
// taken, and the sockets this process listens on. The zero value is
// usable and inherits nothing. It is safe for concurrent use.
type Broker struct {
	mu        sync.Mutex
	inherited map[key][]int
	// bound[fd] is the network (1 tcp, 2 udp) of a held TCP or UDP socket
	// whose address is the one the kernel gives for it (getsockname), 0
	// for the rest: its address is asked again when it is offered. An
	// event-loop listener's address is its socket's own, and a map entry
	// per listener was 44 bytes per service port at 10k (issue 16's
	// memory budget).
	bound     []uint8
	held      map[int32]heldKey
	heldOther map[int32]key // the keys heldKey cannot name
}

// networkName is the network that bound and heldKey number i (less one
// in bound).
func networkName(i uint8) string { return [...]string{"tcp", "udp", "sctp"}[i] }

// heldKey is a key as held: a process with a listener per service port
// holds tens of thousands, and a key with its network's name and a
// netip.AddrPort made each map slot 56 bytes where this makes it 24
// (issue 16's memory budget).
type heldKey struct {
	ip      [16]byte
	port    uint16
	network uint8 // 0 tcp, 1 udp, 2 sctp
	is4     bool
}

// hold is k as held; ok is false for a key heldKey cannot name (a zoned
// address, another network), which is held as it is.
func hold(k key) (h heldKey, ok bool) {
	switch k.network {
	case "tcp":
		h.network = 0
	case "udp":
		h.network = 1
	case "sctp":
		h.network = 2
	default:
		return heldKey{}, false
	}
	a := k.addr.Addr()
	h.ip, h.port, h.is4 = a.As16(), k.addr.Port(), a.Is4()
	return h, a.IsValid() && a.Zone() == ""
}

// key is h as a key again.
func (h heldKey) key() key {
	a := netip.AddrFrom16(h.ip)
	if h.is4 {
		a = a.Unmap()
	}
	return key{networkName(h.network), netip.AddrPortFrom(a, h.port)}
}

// Take returns the inherited sockets listening on network/addr (several
// for a TCP listener whose predecessor had one SO_REUSEPORT socket per
// event loop), and forgets them: they are the caller's to serve, all of
// them (a socket of a reuseport group that is closed drops its queue).
// A port 0 address never matches.
func (b *Broker) Take(network string, addr netip.AddrPort) []int {
	if b == nil || addr.Port() == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := key{network, addr}
	fds := b.inherited[k]
	delete(b.inherited, k)
	return fds
}

// Hold records a socket this process listens on, for a successor.
func (b *Broker) Hold(network string, addr netip.AddrPort, fd int) {
	if b == nil {
		return
	}
	h, ok := hold(key{network, addr})
	// Asked before the lock: one getsockname per listening socket. Only
	// for TCP and UDP, whose listening socket's name is what it was bound
	// to for its life; an SCTP socket's was not the one a successor asks
	// for at hand-over (TestUserspaceSCTPInVM lost its NodePorts; an
	// association's own address, most likely).
	own := ok && (network == "tcp" || network == "udp") && fd >= 0 && addr.Port() != 0 && boundAddr(fd) == addr
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forget(fd)
	if own {
		if fd >= len(b.bound) {
			b.bound = append(b.bound, make([]uint8, max(fd+1, 2*len(b.bound))-len(b.bound))...)
		}
		b.bound[fd] = h.network + 1
		return
	}
	if !ok {
		if b.heldOther == nil {
			b.heldOther = map[int32]key{}
		}
		b.heldOther[int32(fd)] = key{network, addr}
		return
	}
	if b.held == nil {
		b.held = map[int32]heldKey{}
	}
	b.held[int32(fd)] = h
}

// Release forgets a held socket; call it before closing the socket.
func (b *Broker) Release(fd int) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.forget(fd)
}

// forget drops fd from what is held, under the lock.
func (b *Broker) forget(fd int) {
	if fd >= 0 && fd < len(b.bound) {
		b.bound[fd] = 0
	}
	delete(b.held, int32(fd))
	delete(b.heldOther, int32(fd))
}

// inherit adds a received socket.
func (b *Broker) inherit(network string, addr netip.AddrPort, fd int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inherited == nil {
		b.inherited = map[key][]int{}
	}
	k := key{network, addr}
	b.inherited[k] = append(b.inherited[k], fd)
}

// Untaken closes the inherited sockets nobody took (services removed
// while the processes changed over) and says how many there were.
func (b *Broker) Untaken() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for k, fds := range b.inherited {
		for _, fd := range fds {
			closeFD(fd)
			n++
		}
		delete(b.inherited, k)
	}
	return n
}

// socket is one held socket, for sending.
type socket struct {
	key
	fd int
}

// eachHeld calls fn for every held socket, under the lock, so that no
// socket is released and closed (and its number reused) while it is being
// sent.
func (b *Broker) eachHeld(fn func(socket) error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for fd, n := range b.bound {
		if n == 0 {
			continue
		}
		if err := fn(socket{key{networkName(n - 1), boundAddr(fd)}, fd}); err != nil {
			return err
		}
	}
	for fd, h := range b.held {
		if err := fn(socket{h.key(), int(fd)}); err != nil {
			return err
		}
	}
	for fd, k := range b.heldOther {
		if err := fn(socket{k, int(fd)}); err != nil {
			return err
		}
	}
	return nil
}
