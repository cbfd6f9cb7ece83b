package listeners

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// registry maps a descriptor to its registration on a loop. Descriptors
// are small integers the kernel hands out lowest first, so a slice indexed
// by descriptor replaces a map lookup per event (bench cost-keepalive: the
// map's lookup was about 1 % of the loop's CPU).
type registry struct{ regs []registration }

func (r *registry) get(fd int) registration {
	if fd < 0 || fd >= len(r.regs) {
		return registration{}
	}
	return r.regs[fd]
}

func (r *registry) set(fd int, reg registration) {
	if fd >= len(r.regs) {
		n := max(64, 2*len(r.regs))
		for n <= fd {
			n *= 2
		}
		grown := make([]registration, n)
		copy(grown, r.regs)
		r.regs = grown
	}
	r.regs[fd] = reg
}

func (r *registry) drop(fd int) {
	if fd >= 0 && fd < len(r.regs) {
		r.regs[fd] = registration{}
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
