//go:build linux

package listeners

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dgramBatchSize is how many datagrams one recvmmsg takes at most.
const dgramBatchSize = 16

// mmsghdr is struct mmsghdr of recvmmsg(2) and sendmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

// dgramBatch is one loop's receive batch: recvmmsg fills up to len(hdrs)
// datagrams with their source addresses and control messages in a single
// call. A batch that comes back short has drained the socket, which spares
// the read that would return EAGAIN (a new datagram brings a new edge).
// Only a buffer's first page is touched by a small datagram, so the batch
// costs little resident memory for its size.
type dgramBatch struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	names []unix.RawSockaddrAny
	oobs  [][]byte
	ctl   [128]byte // a GSO send's control messages

	// A merged datagram cut back into its datagrams (sendSplit).
	split     [groMaxSegments]mmsghdr
	splitIovs [groMaxSegments]unix.Iovec
}

func newDgramBatch(n, size int) *dgramBatch {
	b := &dgramBatch{hdrs: make([]mmsghdr, n), iovs: make([]unix.Iovec, n), bufs: make([][]byte, n),
		names: make([]unix.RawSockaddrAny, n), oobs: make([][]byte, n)}
	for i := range b.hdrs {
		b.bufs[i] = make([]byte, size)
		b.oobs[i] = make([]byte, 64)
	}
	return b
}

// recv reads up to len(b.hdrs) datagrams from fd without blocking, with
// their control messages; with addrs, their source addresses too.
func (b *dgramBatch) recv(fd int, addrs bool) (int, error) {
	for i := range b.hdrs {
		h := &b.hdrs[i]
		b.iovs[i] = unix.Iovec{Base: &b.bufs[i][0]}
		b.iovs[i].SetLen(len(b.bufs[i]))
		*h = mmsghdr{}
		h.hdr.Iov = &b.iovs[i]
		h.hdr.SetIovlen(1)
		if addrs {
			h.hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
			h.hdr.Namelen = uint32(unsafe.Sizeof(b.names[i]))
		}
		// Control messages always: a GRO socket says so in one.
		h.hdr.Control = &b.oobs[i][0]
		h.hdr.SetControllen(len(b.oobs[i]))
	}
	for {
		r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(len(b.hdrs)), unix.MSG_DONTWAIT, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(r), nil
	}
}

// send sends datagrams [i, j) of the last recv on fd, with one sendmmsg
// for as many as the kernel takes at once (bench cost-udp-bulk: a send per
// datagram was most of a burst's syscalls). With name, each goes to that
// address with oob as its control message (a listener's reply); without,
// the socket is connected (a flow's socket to its endpoint). A datagram
// the kernel refuses is dropped, as a send of its own would have been, and
// the rest still go; a full send buffer (EAGAIN) drops the rest. It
// returns the bytes sent.
func (b *dgramBatch) send(fd, i, j int, name *rawSockaddr, oob []byte) (bytes uint64) {
	for k := i; k < j; k++ {
		h := &b.hdrs[k]
		b.iovs[k].SetLen(int(h.n))
		h.hdr = unix.Msghdr{Iov: &b.iovs[k]}
		h.hdr.SetIovlen(1)
		address(&h.hdr, name, oob)
	}
	return sendmmsgAll(fd, b.hdrs[i:j])
}

// address makes m go to name (nil: the socket is connected) with ctl as
// its control messages.
func address(m *unix.Msghdr, name *rawSockaddr, ctl []byte) {
	if name != nil {
		m.Name = (*byte)(unsafe.Pointer(&name.raw))
		m.Namelen = name.len
	}
	if len(ctl) > 0 {
		m.Control = &ctl[0]
		m.SetControllen(len(ctl))
	}
}

// appendUDPSegment appends a UDP_SEGMENT control message to ctl: the
// kernel cuts what is sent with it into datagrams of size bytes. Within
// ctl's capacity it does not allocate.
func appendUDPSegment(ctl []byte, size int) []byte {
	at := len(ctl)
	ctl = append(ctl, make([]byte, unix.CmsgSpace(2))...)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[at]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&ctl[at+unix.CmsgLen(0)])) = uint16(size)
	return ctl
}

// sendmmsgAll sends hdrs on fd, as few sendmmsg calls as the kernel allows.
// A datagram the kernel refuses is dropped and the next one tried; a full
// send buffer (EAGAIN) drops the rest. It returns the bytes sent.
func sendmmsgAll(fd int, hdrs []mmsghdr) (bytes uint64) {
	for i := 0; i < len(hdrs); {
		r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&hdrs[i])), uintptr(len(hdrs)-i), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EINTR:
		case errno == unix.EAGAIN:
			return bytes
		case errno != 0:
			i++ // refused: dropped, and the next one tried
		default:
			for k := i; k < i+int(r); k++ {
				bytes += uint64(hdrs[k].n)
			}
			i += int(r)
		}
	}
	return bytes
}

// groMaxSegments is how many datagrams the kernel merges into one at most
// (UDP_GRO_CNT_MAX), and the fewest a UDP GSO send may carry on any
// kernel that has it (UDP_MAX_SEGMENTS, 64 before Linux 6.9).
const groMaxSegments = 64

// enableGRO asks the kernel to hand fd a run of one flow's datagrams as one
// buffer (UDP_GRO, Linux 5.0), as it arrives from a GSO sender or a device
// that merged them; seg tells the size they were cut to. An older kernel
// says no, and datagrams come one by one as before.
func enableGRO(fd int) {
	unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1)
}

// seg is datagram i's GRO segment size: when the kernel merged a run of
// datagrams into it, the size of each (the last may be shorter); 0 when it
// is one datagram.
func (b *dgramBatch) seg(i int) int {
	oob := b.oobs[i][:b.hdrs[i].hdr.Controllen]
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		if h.Len < unix.SizeofCmsghdr || int(h.Len) > len(oob) {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && int(h.Len) >= unix.CmsgLen(4) {
			return int(*(*int32)(unsafe.Pointer(&oob[unix.CmsgLen(0)])))
		}
		oob = oob[min(unix.CmsgSpace(int(h.Len)-unix.CmsgLen(0)), len(oob)):]
	}
	return 0
}

// merged reports whether any of datagrams [i, j) holds several.
func (b *dgramBatch) merged(i, j int) bool {
	for k := i; k < j; k++ {
		if g := b.seg(k); g > 0 && int(b.hdrs[k].n) > g {
			return true
		}
	}
	return false
}

// sendSplit sends datagrams [i, j) as send does, cutting each merged one
// back into the datagrams it was made of (the path to the destination
// refused GSO). name and oob are as for send.
func (b *dgramBatch) sendSplit(fd, i, j int, name *rawSockaddr, oob []byte) (bytes uint64) {
	for k := i; k < j; k++ {
		g, n := b.seg(k), int(b.hdrs[k].n)
		if g <= 0 || n <= g {
			bytes += b.send(fd, k, k+1, name, oob)
			continue
		}
		hdrs, iovs := b.split[:0], b.splitIovs[:0]
		for off := 0; off < n && len(hdrs) < len(b.split); off += g {
			iovs = append(iovs, unix.Iovec{Base: &b.bufs[k][off]})
			iovs[len(iovs)-1].SetLen(min(g, n-off))
			h := mmsghdr{}
			h.hdr.Iov = &iovs[len(iovs)-1]
			h.hdr.SetIovlen(1)
			address(&h.hdr, name, oob)
			hdrs = append(hdrs, h)
		}
		bytes += sendmmsgAll(fd, hdrs)
	}
	return bytes
}

// gsoMaxPayload is the most one UDP GSO send carries: a UDP payload's
// limit over IPv4 (the kernel refuses more).
const gsoMaxPayload = 65507

// gsoSize reports whether datagrams [i, j) of the last recv can go as one
// UDP GSO send (UDP_SEGMENT, Linux 4.18): two or more datagrams in all,
// each of one size but the last, which may be shorter, and no more than a
// payload. A merged datagram (GRO) counts as the datagrams it was made of.
// The kernel cuts the one buffer back into the same datagrams.
func (b *dgramBatch) gsoSize(i, j int) (int, bool) {
	size := b.seg(i)
	if size <= 0 {
		size = int(b.hdrs[i].n)
	}
	if size == 0 {
		return 0, false
	}
	total, segs := 0, 0
	for k := i; k < j; k++ {
		n, g, last := int(b.hdrs[k].n), b.seg(k), k == j-1
		switch {
		case g > 0 && n > g: // merged: g-sized datagrams, the last maybe shorter
			if g != size || (n%g != 0 && !last) {
				return 0, false
			}
			segs += (n + g - 1) / g
		case n == 0 || n > size || (n < size && !last):
			return 0, false
		default:
			segs++
		}
		total += n
	}
	return size, segs >= 2 && segs <= groMaxSegments && total <= gsoMaxPayload
}

// sendGSO sends datagrams [i, j), which gsoSize passed, in one sendmsg
// that the kernel segments every size bytes: one trip down the stack for
// the burst instead of one per datagram. name and oob are as for send.
// Nothing is sent when it fails; the caller may send them one by one.
func (b *dgramBatch) sendGSO(fd, i, j, size int, name *rawSockaddr, oob []byte) (uint64, error) {
	if len(oob)+unix.CmsgSpace(2) > len(b.ctl) {
		return 0, unix.ENOBUFS
	}
	for k := i; k < j; k++ {
		b.iovs[k].SetLen(int(b.hdrs[k].n))
	}
	ctl := appendUDPSegment(append(b.ctl[:0], oob...), size)
	msg := unix.Msghdr{Iov: &b.iovs[i]}
	msg.SetIovlen(j - i)
	address(&msg, name, ctl)
	for {
		r, _, errno := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), unix.MSG_DONTWAIT)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return uint64(r), nil
	}
}

// rawSockaddr is an IPv4 or IPv6 socket address in the kernel's layout:
// made once per flow for its replies, and on the stack for a bind or a
// connect (bindRaw, connectRaw).
type rawSockaddr struct {
	raw unix.RawSockaddrInet6 // room for either family
	len uint32
}

// newRawSockaddr lays out ap for the kernel: an IPv4 address (mapped or
// not) as AF_INET, anything else as AF_INET6.
func newRawSockaddr(ap netip.AddrPort) rawSockaddr {
	var r rawSockaddr
	a := ap.Addr()
	if a.Is4() || a.Is4In6() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.raw))
		sa.Family = unix.AF_INET
		sa.Addr = a.Unmap().As4()
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], ap.Port())
		r.len = unix.SizeofSockaddrInet4
		return r
	}
	r.raw.Family = unix.AF_INET6
	r.raw.Addr = a.As16()
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&r.raw.Port))[:], ap.Port())
	r.len = unix.SizeofSockaddrInet6
	return r
}

// family is r's address family.
func (r *rawSockaddr) family() int { return int(r.raw.Family) }

// connectRaw is connect(2) to r, for a non-blocking socket, with no
// allocation: unix.Connect takes a Sockaddr, one allocation per backend
// connection or flow.
func connectRaw(fd int, r *rawSockaddr) error { return sockaddrCall(unix.SYS_CONNECT, fd, r) }

// bindRaw is bind(2) to r, with no allocation.
func bindRaw(fd int, r *rawSockaddr) error { return sockaddrCall(unix.SYS_BIND, fd, r) }

// sockaddrCall is the socket call trap on fd with r as its address.
func sockaddrCall(trap uintptr, fd int, r *rawSockaddr) error {
	_, _, errno := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&r.raw)), uintptr(r.len))
	if errno != 0 {
		return errno
	}
	return nil
}

// data is datagram i of the last recv.
func (b *dgramBatch) data(i int) []byte { return b.bufs[i][:b.hdrs[i].n] }

// truncated reports whether datagram i was larger than its buffer.
func (b *dgramBatch) truncated(i int) bool { return b.hdrs[i].hdr.Flags&unix.MSG_TRUNC != 0 }

// oob is datagram i's control messages.
func (b *dgramBatch) oob(i int) []byte { return b.oobs[i][:b.hdrs[i].hdr.Controllen] }

// from is datagram i's source address.
func (b *dgramBatch) from(i int) netip.AddrPort { return rawAddrPort(&b.names[i]) }

// rawAddrPort reads an IPv4 or IPv6 address and port from a raw sockaddr.
func rawAddrPort(raw *unix.RawSockaddrAny) netip.AddrPort {
	switch raw.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(raw))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(raw))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}
