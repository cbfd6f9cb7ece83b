package listeners

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// registry maps a descriptor to its handler on a loop. Descriptors are
// small integers the kernel hands out lowest first, so a table indexed by
// descriptor replaces a map lookup per event (bench cost-keepalive: the
// map's lookup was about 1 % of the loop's CPU).
//
// The table is in pages of registryPage slots, made as a descriptor in
// them is first registered, where one slice grew by doubling to the
// highest descriptor: with a listener per service port at 10k, two
// loops' slices of 16,384 registrations of 24 bytes were 79 bytes per
// port, half of it slots past the highest descriptor (issue 16's memory
// budget). A slot is the handler alone: a stale event is dropped when its
// descriptor is (loop.drop), not by a registration number.
type registry struct{ pages []*[registryPage]handler }

// registryPage is how many descriptors a page of a registry holds (8 KiB).
const registryPage = 512

func (r *registry) get(fd int) handler {
	if fd < 0 || fd/registryPage >= len(r.pages) {
		return nil
	}
	if p := r.pages[fd/registryPage]; p != nil {
		return p[fd%registryPage]
	}
	return nil
}

func (r *registry) set(fd int, h handler) {
	i := fd / registryPage
	if i >= len(r.pages) {
		r.pages = append(r.pages, make([]*[registryPage]handler, i+1-len(r.pages))...)
	}
	if r.pages[i] == nil {
		r.pages[i] = new([registryPage]handler)
	}
	r.pages[i][fd%registryPage] = h
}

func (r *registry) drop(fd int) {
	if fd >= 0 && fd/registryPage < len(r.pages) {
		if p := r.pages[fd/registryPage]; p != nil {
			p[fd%registryPage] = nil
		}
	}
}

// each calls fn with every registered handler.
func (r *registry) each(fn func(handler)) {
	for _, p := range r.pages {
		if p == nil {
			continue
		}
		for _, h := range p {
			if h != nil {
				fn(h)
			}
		}
	}
}

// sockRecv and sockSend are recv(2) and send(2) on a non-blocking socket,
// made without Go's entersyscall/exitsyscall: such a call never blocks, so
// the scheduler need not know about it, and recvfrom/sendto skip the VFS
// layer read(2) and write(2) go through (bench cost-keepalive: Go's
// syscall bookkeeping and the VFS layer were 5-6 % of the loop's CPU).
// MSG_NOSIGNAL: a send to a reset peer is EPIPE, never a signal.
func sockRecv(fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(p), uintptr(len(b)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func sockSend(fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(p), uintptr(len(b)), unix.MSG_NOSIGNAL, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// The calls below are made once or twice per proxied connection, and
// never block either: epoll_ctl, shutdown and setsockopt on a socket, and
// close of a socket with no lingering timeout (the engine sets none; its
// resets linger for 0 s) or of a pipe. So they too are raw: Go's
// entersyscall/exitsyscall around each cost about 85 ns on this VM
// (BenchmarkSyscallBookkeeping), against six such calls per connection.

// epollAdd registers fd with epfd for ev.
func epollAdd(epfd, fd int, ev *unix.EpollEvent) error {
	_, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), unix.EPOLL_CTL_ADD, uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// closeNow closes fd; its error is of no use to a caller that is done
// with it (the descriptor is released whatever close reports).
func closeNow(fd int) { unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0) }

// shutWrite sends fd's FIN (shutdown SHUT_WR).
func shutWrite(fd int) error {
	_, _, errno := unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), unix.SHUT_WR, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// setIntOpt is setsockopt(2) of an int option.
func setIntOpt(fd, level, opt, value int) error {
	v := int32(value)
	_, _, errno := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), 4, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// lingerNone sets SO_LINGER on for 0 s, so close sends RST and frees the
// socket at once.
func lingerNone(fd int) {
	l := unix.Linger{Onoff: 1, Linger: 0}
	unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_LINGER, uintptr(unsafe.Pointer(&l)), unsafe.Sizeof(l), 0)
}
