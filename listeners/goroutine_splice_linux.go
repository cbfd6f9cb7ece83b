//go:build linux

package listeners

import (
	"errors"
	"io"
	"net"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// goConnFDs is what one goroutine-engine TCP connection holds: its two
// sockets. The splice pipes its bytes pass through are taken from the
// engine's pipePool, and from the descriptor budget, only while bytes are
// in flight.
const goConnFDs = 2

// maxIdlePipes bounds the pipes an engine keeps between bursts: past it a
// pipe given back is closed. HAProxy keeps at most maxconn/4 pipes.
const maxIdlePipes = 64

// pipePool is a pool of splice pipes: the goroutine engine's (issue 12),
// and each event loop's. io.Copy's splice takes a pipe from Go's pool for each direction and
// keeps it for the connection's whole life, idle time included: four
// descriptors per connection, which only a garbage collection gives back
// after a peak. Here a direction takes a pipe when its source has bytes,
// keeps it while the next read finds more, and gives it back when its
// source has nothing, so an idle connection holds none, and what stays
// after a peak is at most
// max (maxIdlePipes, or a loop's share of it) and two per connection
// still open, at once, without any collection: none once the last
// connection has ended (the engine trims it). Every pipe's two descriptors
// are taken from the engine's budget while the pipe exists.
type pipePool struct {
	fds  *fdBudget
	size int // what each new pipe is grown to (splicePipeSize); 0: left as made
	max  int // the most idle pipes kept

	mu     sync.Mutex
	idle   [][2]int // read end, write end; empty, non-blocking
	closed bool
}

func newPipePool(fds *fdBudget, size, max int) *pipePool {
	return &pipePool{fds: fds, size: size, max: max}
}

// get returns an empty pipe; false when the budget or the kernel has no
// descriptors for one.
func (p *pipePool) get() ([2]int, bool) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		pp := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return pp, true
	}
	p.mu.Unlock()
	pp, ok := openPipe(p.fds)
	if ok {
		growPipe(pp, p.size)
	}
	return pp, ok
}

// put takes a pipe back. One that may still hold bytes (a write failed
// half-way) is closed, as is one past max or after close.
func (p *pipePool) put(pp [2]int, empty bool) {
	if empty {
		p.mu.Lock()
		if !p.closed && len(p.idle) < p.max {
			p.idle = append(p.idle, pp)
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
	closePipe(p.fds, pp)
}

// close closes the idle pipes; pipes put back later are closed too.
func (p *pipePool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.shed()
}

// shed closes the idle pipes, giving their descriptors back to the
// budget; false if there were none.
func (p *pipePool) shed() bool { return p.trim(0) > 0 }

// trim closes the idle pipes past keep; it returns how many it closed.
func (p *pipePool) trim(keep int) int {
	p.mu.Lock()
	if len(p.idle) <= keep {
		p.mu.Unlock()
		return 0
	}
	gone := slices.Clone(p.idle[keep:])
	p.idle = p.idle[:keep]
	p.mu.Unlock()
	for _, pp := range gone {
		closePipe(p.fds, pp)
	}
	return len(gone)
}

// openPipe opens a non-blocking kernel pipe for splice(2), its two
// descriptors taken from fds; false when the budget or the kernel has
// none. Both engines' splices use it.
func openPipe(fds *fdBudget) ([2]int, bool) {
	var pp [2]int
	if !fds.take(2) {
		return pp, false
	}
	if err := unix.Pipe2(pp[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		fds.give(2)
		return pp, false
	}
	return pp, true
}

// growPipe sizes a new pipe at size bytes (0: leaves it as made). A pipe's
// capacity is in slots, one per page or skb fragment: behind a 1500 B MTU
// a default pipe's 16 slots take about 23 KB a splice, a 1 MiB pipe's 256
// ten times that (bench/latest-engine-bulk/pipe-size/). If the kernel
// refuses, the pipe works as made, with more splices.
func growPipe(pp [2]int, size int) {
	if size > 0 {
		unix.FcntlInt(uintptr(pp[0]), unix.F_SETPIPE_SZ, size)
	}
}

// splicePipeSize is what the engines grow their splice pipes to: pipeSize
// where the kernel's per-user pipe quotas spare this process, else 0, the
// kernel's default (64 KiB). A user without CAP_SYS_RESOURCE or
// CAP_SYS_ADMIN may hold fs.pipe-user-pages-soft pages of pipes (64 MiB by
// default) before every pipe it makes gets 2 slots instead of 16: 64 pipes
// of 1 MiB, the goroutine engine's idle pool alone, would use all of it.
func splicePipeSize() int {
	if pipeQuotaExempt() {
		return pipeSize
	}
	return 0
}

// pipeQuotaExempt reports whether this process has CAP_SYS_RESOURCE or
// CAP_SYS_ADMIN in its effective set, which the kernel's pipe quotas
// spare (pipe_is_unprivileged_user); false if it cannot tell.
func pipeQuotaExempt() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData // version 3: two words of 32 capabilities
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	return has(unix.CAP_SYS_RESOURCE) || has(unix.CAP_SYS_ADMIN)
}

// closePipe closes a pipe openPipe opened and gives its descriptors back.
func closePipe(fds *fdBudget, pp [2]int) {
	unix.Close(pp[0])
	unix.Close(pp[1])
	fds.give(2)
}

// tcpCopier moves one direction of a TCP connection, as io.Copy does:
// until src's EOF (nil) or an error, which may be src's read deadline
// (os.ErrDeadlineExceeded); it returns the bytes written to dst.
type tcpCopier struct {
	pipes *pipePool
}

// pipeSize is what a pipe is grown to where the pipe quotas allow it
// (splicePipeSize), and the most one splice moves: Go's own splice uses
// 1 MiB pipes (a bulk transfer at 64 KiB ran 8 % slower, with more CPU). A
// pipe's pages are the kernel's only while bytes are in it.
const pipeSize = 1 << 20

func newTCPCopier(fds *fdBudget) *tcpCopier {
	return &tcpCopier{pipes: newPipePool(fds, splicePipeSize(), maxIdlePipes)}
}

func (t *tcpCopier) close() { t.pipes.close() }

// shed gives the idle pipes' descriptors back to the budget, for a
// connection that would not fit otherwise; false if there were none.
func (t *tcpCopier) shed() bool { return t.pipes.shed() }

// connectionsOpen keeps at most two idle pipes per open connection (one
// per direction), so the pool empties when the last connection ends.
func (t *tcpCopier) connectionsOpen(n int) { t.pipes.trim(2 * n) }

// copy splices src -> pipe -> dst, one burst at a time: src is read only
// when the pipe is empty, so a slow dst pauses src and what one direction
// holds in user space is nothing and in the kernel one pipe. When no pipe
// can be had, the burst goes through a buffer instead.
func (t *tcpCopier) copy(dst, src *net.TCPConn) (int64, error) {
	sr, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	dr, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		total      int64
		pp         [2]int
		have, nopp bool
		n          int64
		left       int
		serr, werr error
	)
	// The two steps are made once per copy, not per burst (a closure per
	// call is an allocation).
	fill := func(fd uintptr) bool {
		if !have {
			if pp, have = t.pipes.get(); !have {
				nopp = true
				return true
			}
		}
		for {
			n, serr = unix.Splice(int(fd), nil, pp[1], nil, pipeSize, spliceFlags)
			if serr != unix.EINTR {
				break
			}
		}
		if serr == unix.EAGAIN {
			// Nothing to read: wait without holding the pipe.
			t.pipes.put(pp, true)
			have = false
			return false
		}
		return true
	}
	drain := func(fd uintptr) bool {
		for left > 0 {
			m, err := unix.Splice(pp[0], nil, int(fd), nil, left, spliceFlags)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // dst is full: wait until it takes more
			case err != nil:
				werr = err
				return true
			case m == 0:
				werr = io.ErrShortWrite
				return true
			}
			left -= int(m)
			total += m
		}
		return true
	}
	for {
		nopp, n, serr = false, 0, nil
		rerr := sr.Read(fill) // with the last burst's pipe, if it drained
		if nopp {
			c, err := copyBurst(dst, src)
			total += c
			if err != nil || c == 0 {
				return total, err
			}
			continue
		}
		if rerr != nil || serr != nil || n == 0 {
			if have {
				t.pipes.put(pp, true) // nothing was moved into it
				have = false
			}
			if rerr != nil {
				return total, rerr
			}
			return total, serr // nil at EOF
		}
		left, werr = int(n), nil
		rwerr := dr.Write(drain)
		if left > 0 { // a failed write: the pipe may hold bytes
			t.pipes.put(pp, false)
			have = false
		}
		// An empty pipe is kept for the next read, which gives it back if
		// src has nothing: one trip to the pool per burst, not two.
		if rwerr != nil {
			return total, rwerr
		}
		if werr != nil {
			return total, werr
		}
	}
}

// copyBurst is one read from src and its write to dst through a buffer,
// for when no pipe can be had; 0 and nil at src's EOF.
func copyBurst(dst, src *net.TCPConn) (int64, error) {
	buf := make([]byte, 16<<10)
	n, err := src.Read(buf)
	if n > 0 {
		w, werr := dst.Write(buf[:n])
		if werr != nil {
			return int64(w), werr
		}
	}
	if errors.Is(err, io.EOF) {
		return int64(n), nil
	}
	return int64(n), err
}
