//go:build linux

package listeners

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioRing is a minimal io_uring (io_uring_setup(2), io_uring_enter(2)) used
// as a syscall batcher: a loop queues the reads and writes of a turn's
// sockets, all non-blocking (MSG_DONTWAIT), and one io_uring_enter runs
// them all. With MSG_DONTWAIT the kernel completes every one inline, an
// empty socket or a full one with -EAGAIN, so once submit returns nothing
// is in flight: no buffer or descriptor is held by the kernel past the
// call, which keeps the loop's ownership rules as they are with plain
// syscalls. A kernel entry costs about 1-3 us on this project's VMs, more
// than the recv or send it carries (see docs/userspace.md).
//
// Only the loop's goroutine touches a ring.
type ioRing struct {
	fd      int
	sqTail  *uint32
	sqMask  uint32
	sqes    []ioSQE
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []ioCQE
	queued  uint32 // SQEs written past the tail, not yet submitted
	ringMem []byte
	sqeMem  []byte

	// Counted work, for tests: enters made by submit, and the entries
	// they carried.
	enters, carried uint64
}

// The kernel's ABI (include/uapi/linux/io_uring.h).
type ioSQRingOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type ioCQRingOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type ioURingParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  ioSQRingOffsets
	cqOff                                                                  ioCQRingOffsets
}

// ioSQE is struct io_uring_sqe (64 bytes).
type ioSQE struct {
	opcode    uint8
	flags     uint8
	ioprio    uint16
	fd        int32
	off       uint64
	addr      uint64
	len       uint32
	opFlags   uint32 // msg_flags for send and recv
	userData  uint64
	bufIndex  uint16
	personal  uint16
	spliceIn  int32
	addr3     uint64
	reserved0 uint64
}

// ioCQE is struct io_uring_cqe (16 bytes).
type ioCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

const (
	ioOpNop  = 0
	ioOpSend = 26
	ioOpRecv = 27

	ioFeatSingleMmap = 1 << 0
	ioOffSQEs        = 0x10000000
	ioEnterGetEvents = 1 << 0
	ioSetupSubmitAll = 1 << 7 // 5.18+: one SQE's error does not stop the rest
)

// The layouts are the kernel's: a size that differs does not compile.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(ioSQE{})-64]
	_ = [1]struct{}{}[unsafe.Sizeof(ioCQE{})-16]
	_ = [1]struct{}{}[unsafe.Sizeof(ioURingParams{})-120]
)

// newIORing sets up a ring of entries submission slots (a power of two),
// with the kernel's default of twice as many completion slots. An error means the kernel refuses
// io_uring (too old, kernel.io_uring_disabled, a seccomp filter): the loop
// then makes plain syscalls.
func newIORing(entries uint32) (*ioRing, error) { return newIORingFlags(entries, ioSetupSubmitAll) }

// newIORingFlags is newIORing with the setup flags the ring asks for.
func newIORingFlags(entries, flags uint32) (*ioRing, error) {
	p := ioURingParams{flags: flags}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno == unix.EINVAL && flags != 0 {
		// A kernel before 5.18 refuses IORING_SETUP_SUBMIT_ALL with the
		// EINVAL it gives any bad argument: a ring without the flags says
		// whether that is why (Ubuntu 22.04's 5.15, say).
		bare := ioURingParams{}
		if fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&bare)), 0); errno == 0 {
			unix.Close(int(fd))
			return nil, fmt.Errorf("io_uring_setup: the kernel has io_uring but refuses the setup flags %#x (IORING_SETUP_SUBMIT_ALL needs Linux 5.18+)", flags)
		}
	}
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ioRing{fd: int(fd)}
	if p.features&ioFeatSingleMmap == 0 {
		unix.Close(r.fd)
		return nil, fmt.Errorf("io_uring: the kernel lacks IORING_FEAT_SINGLE_MMAP (5.4+)")
	}
	size := max(int(p.sqOff.array)+4*int(p.sqEntries), int(p.cqOff.cqes)+16*int(p.cqEntries))
	mem, err := unix.Mmap(r.fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.Close(r.fd)
		return nil, fmt.Errorf("io_uring rings mmap: %w", err)
	}
	sqeMem, err := unix.Mmap(r.fd, ioOffSQEs, 64*int(p.sqEntries), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.Munmap(mem)
		unix.Close(r.fd)
		return nil, fmt.Errorf("io_uring SQEs mmap: %w", err)
	}
	r.ringMem, r.sqeMem = mem, sqeMem
	base := unsafe.Pointer(&mem[0])
	r.sqTail = (*uint32)(unsafe.Add(base, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(base, p.sqOff.ringMask))
	r.cqHead = (*uint32)(unsafe.Add(base, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(base, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(base, p.cqOff.ringMask))
	r.cqes = unsafe.Slice((*ioCQE)(unsafe.Add(base, p.cqOff.cqes)), p.cqEntries)
	r.sqes = unsafe.Slice((*ioSQE)(unsafe.Pointer(&sqeMem[0])), p.sqEntries)
	// The SQ array maps ring slots to SQEs one to one, for good.
	array := unsafe.Slice((*uint32)(unsafe.Add(base, p.sqOff.array)), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	return r, nil
}

// full reports whether every submission slot is taken.
func (r *ioRing) full() bool { return int(r.queued) >= len(r.sqes) }

// next is the next free SQE, zeroed. The caller checks full first.
func (r *ioRing) next() *ioSQE {
	s := &r.sqes[(*r.sqTail+r.queued)&r.sqMask]
	*s = ioSQE{}
	r.queued++
	return s
}

// unqueueLast takes back the one SQE queued, which was never submitted.
func (r *ioRing) unqueueLast() { r.queued-- }

// submit hands the queued SQEs to the kernel and returns once each has
// completed. All are MSG_DONTWAIT, which the kernel completes inline, so
// the first io_uring_enter normally returns with every completion posted;
// if one was not (it cannot be, short of a kernel change), a second,
// blocking enter waits for it, so that no buffer is in the kernel's hands
// once submit returns.
func (r *ioRing) submit() error {
	n := r.queued
	if n == 0 {
		return nil
	}
	atomic.StoreUint32(r.sqTail, *r.sqTail+n)
	r.queued = 0
	r.enters++
	r.carried += uint64(n)
	for done := uint32(0); done < n; {
		ret, _, errno := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n-done), 0, 0, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		if ret == 0 { // cannot happen with SUBMIT_ALL; never spin on it
			return fmt.Errorf("io_uring_enter took none of %d entries", n-done)
		}
		done += uint32(ret)
	}
	for r.ready() < n {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, uintptr(n-r.ready()), ioEnterGetEvents, 0, 0)
		if errno != 0 && errno != unix.EINTR {
			return fmt.Errorf("io_uring_enter wait: %w", errno)
		}
	}
	return nil
}

// ready is how many completions wait to be reaped.
func (r *ioRing) ready() uint32 { return atomic.LoadUint32(r.cqTail) - *r.cqHead }

// reap calls fn with each completion posted, oldest first, and frees
// their slots.
func (r *ioRing) reap(fn func(userData uint64, res int32)) {
	head, tail := *r.cqHead, atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		c := &r.cqes[head&r.cqMask]
		fn(c.userData, c.res)
	}
	atomic.StoreUint32(r.cqHead, head)
}

func (r *ioRing) close() {
	unix.Munmap(r.sqeMem)
	unix.Munmap(r.ringMem)
	unix.Close(r.fd)
}
