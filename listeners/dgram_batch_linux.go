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

// recv reads up to len(b.hdrs) datagrams from fd without blocking. With
// addrs, the source address and control messages of each are kept.
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
			h.hdr.Control = &b.oobs[i][0]
			h.hdr.SetControllen(len(b.oobs[i]))
		}
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
		if name != nil {
			h.hdr.Name = (*byte)(unsafe.Pointer(&name.raw))
			h.hdr.Namelen = name.len
		}
		if len(oob) > 0 {
			h.hdr.Control = &oob[0]
			h.hdr.SetControllen(len(oob))
		}
	}
	for i < j {
		r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[i])), uintptr(j-i), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EINTR:
		case errno == unix.EAGAIN:
			return bytes
		case errno != 0:
			i++ // refused: dropped, and the next one tried
		default:
			for k := i; k < i+int(r); k++ {
				bytes += uint64(b.hdrs[k].n)
			}
			i += int(r)
		}
	}
	return bytes
}

// gsoMaxPayload is the most one UDP GSO send carries: a UDP payload's
// limit over IPv4 (the kernel refuses more).
const gsoMaxPayload = 65507

// gsoSize reports whether datagrams [i, j) of the last recv can go as one
// UDP GSO send (UDP_SEGMENT, Linux 4.18): two or more, each of one size
// but the last, which may be shorter, and no more than a payload in all.
// The kernel cuts the one buffer back into the same datagrams.
func (b *dgramBatch) gsoSize(i, j int) (int, bool) {
	if j-i < 2 {
		return 0, false
	}
	size, total := int(b.hdrs[i].n), 0
	for k := i; k < j; k++ {
		n := int(b.hdrs[k].n)
		if n == 0 || n > size || (n < size && k != j-1) {
			return 0, false
		}
		total += n
	}
	return size, total <= gsoMaxPayload
}

// sendGSO sends datagrams [i, j), which gsoSize passed, in one sendmsg
// that the kernel segments every size bytes: one trip down the stack for
// the burst instead of one per datagram. name and oob are as for send.
// Nothing is sent when it fails; the caller may send them one by one.
func (b *dgramBatch) sendGSO(fd, i, j, size int, name *rawSockaddr, oob []byte) (uint64, error) {
	seg := unix.CmsgSpace(2)
	if len(oob)+seg > len(b.ctl) {
		return 0, unix.ENOBUFS
	}
	for k := i; k < j; k++ {
		b.iovs[k].SetLen(int(b.hdrs[k].n))
	}
	ctl := b.ctl[:len(oob)+seg]
	copy(ctl, oob)
	clear(ctl[len(oob):])
	h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[len(oob)]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&ctl[len(oob)+unix.CmsgLen(0)])) = uint16(size)
	msg := unix.Msghdr{Iov: &b.iovs[i], Control: &ctl[0]}
	msg.SetIovlen(j - i)
	msg.SetControllen(len(ctl))
	if name != nil {
		msg.Name = (*byte)(unsafe.Pointer(&name.raw))
		msg.Namelen = name.len
	}
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

// rawSockaddr is an IPv4 or IPv6 socket address in the kernel's layout,
// made once per flow for its replies.
type rawSockaddr struct {
	raw unix.RawSockaddrInet6 // room for either family
	len uint32
}

// newRawSockaddr lays out ap as toSockaddr would make it: an IPv4 address
// (mapped or not) as AF_INET, anything else as AF_INET6.
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
