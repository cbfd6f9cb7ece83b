//go:build linux

package listeners

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// A loop's batched socket I/O. During a turn, each stream connection's
// recv or send is queued on the loop's ring rather than made at once; at
// the end of the turn (flushIO) one io_uring_enter makes them all, and
// each completion is applied as the direct call's result would have been,
// after which the connection steps again, queueing its next recv or send.
// A turn that handled three connections made six recv/send syscalls, plus
// the wait; batched, it makes two io_uring_enters (one for the reads, one
// for the writes the reads fed). A batch of one goes out as a plain
// syscall, which costs less than a ring entry.
//
// Nothing is in the kernel's hands between turns: every operation is
// MSG_DONTWAIT, completed inside the enter (ioRing.submit), so buffers and
// descriptors keep the ownership rules of plain syscalls. An operation
// queued but not yet submitted whose connection closes is turned into a
// no-op (cancelIO), so it can never reach a descriptor number reused since.

// ioState is where a direction's recv or send stands on the ring.
type ioState uint8

const (
	ioNone      ioState = iota
	ioQueued            // in l.ioOps at index op, its SQE not yet submitted
	ioSubmitted         // submitted and completed, its result not yet applied
)

// ioOp is a recv or send on the loop's ring.
type ioOp struct {
	c         *tcpConn
	p         *pipe
	sqe       *ioSQE
	buf       []byte // a recv's buffer (a send's is p.buf)
	send      bool
	cancelled bool
}

// maxIOBatches bounds the enters of one flush: a bulk transfer whose every
// completion queues the next recv goes on in the next turn, as a
// connection that yields does (maxRounds).
const maxIOBatches = 8

// batching reports whether the turn's recvs go on the ring: not when its
// wait brought one event, as on a single busy connection, whose recv and
// send could only go out one at a time (cost-rr: 4 % more LB CPU per
// request for queueing each and taking it back).
func (l *loop) batching() bool { return l.ring != nil && l.events > 1 && !l.ring.full() }

// ringWaits reports whether the loop waits for its events on the ring
// (an epoll wait as a ring operation), so that the sends a turn ends with
// go to the kernel in the enter that waits. Not with busy-polling, whose
// waits do not sleep.
func (l *loop) ringWaits() bool { return l.ring != nil && !l.noRingWait && l.e.opts.BusyPoll == 0 }

// queueSend queues the send of p's pending bytes. It reports false when
// the turn neither batches nor ends in a wait on the ring, or the ring is
// full: then the caller sends now.
func (l *loop) queueSend(c *tcpConn, p *pipe) bool {
	if l.ring == nil || l.ring.full() || (l.events <= 1 && !l.ringWaits()) {
		return false
	}
	b := p.buf[p.r:p.w]
	s := l.queue(c, p, ioOpSend, p.dst.fd, b)
	s.opFlags = unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL
	l.ioOps[len(l.ioOps)-1].send = true
	return true
}

// queueRecv queues a recv into buf, taken for it. It reports false, as
// queueSend does, when the caller must recv now.
func (l *loop) queueRecv(c *tcpConn, p *pipe, buf []byte) bool {
	if !l.batching() {
		return false
	}
	s := l.queue(c, p, ioOpRecv, p.src.fd, buf)
	s.opFlags = unix.MSG_DONTWAIT
	l.ioOps[len(l.ioOps)-1].buf = buf
	return true
}

func (l *loop) queue(c *tcpConn, p *pipe, opcode uint8, fd int, b []byte) *ioSQE {
	s := l.ring.next()
	s.opcode = opcode
	s.fd = int32(fd)
	s.addr = uint64(uintptr(unsafe.Pointer(&b[0])))
	s.len = uint32(len(b))
	s.userData = uint64(len(l.ioOps))
	l.ioOps = append(l.ioOps, ioOp{c: c, p: p, sqe: s})
	p.io, p.op = ioQueued, int32(len(l.ioOps)-1)
	return s
}

// cancelIO makes p's queued operation, if any, a no-op: p's connection is
// closing, and its descriptors with it.
func (l *loop) cancelIO(p *pipe) {
	if p.io == ioQueued {
		op := &l.ioOps[p.op]
		op.cancelled = true
		*op.sqe = ioSQE{opcode: ioOpNop, userData: op.sqe.userData}
	}
	p.io = ioNone
}

// flushIO makes the turn's queued operations and applies their results,
// batch after batch while completions queue more, up to maxIOBatches. A
// last batch of sends whose completions cannot lead to more work is left
// for the wait (deferrable).
func (l *loop) flushIO() {
	l.deferred = false
	for batch := 0; batch < maxIOBatches && len(l.ioOps) > 0; batch++ {
		if l.ringWaits() && l.deferrable() {
			l.deferred = true
			return
		}
		ops := l.ioOps
		l.ioOps = l.ioSpare[:0]
		if len(ops) == 1 { // one: a plain syscall costs less than an enter
			l.ring.unqueueLast()
			op := &ops[0]
			op.p.io = ioSubmitted
			var n int
			var err error
			switch {
			case op.cancelled:
			case op.send:
				n, err = sockSend(op.p.dst.fd, op.p.buf[op.p.r:op.p.w])
			default:
				n, err = sockRecv(op.p.src.fd, op.buf)
			}
			l.finishIO(op, n, err)
		} else {
			var recvs, sends uint32
			for i := range ops {
				if ops[i].cancelled {
					continue
				}
				ops[i].p.io = ioSubmitted
				if ops[i].send {
					sends++
				} else {
					recvs++
				}
			}
			l.mostRecvs, l.mostSends = max(l.mostRecvs, recvs), max(l.mostSends, sends)
			if err := l.ring.submit(); err != nil {
				// The ring is broken (not one of its operations): every
				// operation not completed fails its connection, and the
				// loop goes on with plain syscalls.
				l.e.ringFailures.Add(1)
				l.reapRing(ops)
				for i := range ops {
					if ops[i].p.io == ioSubmitted {
						l.finishIO(&ops[i], 0, err)
					}
				}
				l.dropRing()
			} else {
				l.reapRing(ops)
			}
		}
		clear(ops)
		l.ioSpare = ops[:0]
	}
}

// complete applies a completion's result.
func (l *loop) complete(op *ioOp, res int32) {
	if res < 0 {
		l.finishIO(op, 0, unix.Errno(-res))
		return
	}
	l.finishIO(op, int(res), nil)
}

// finishIO applies an operation's result to its direction, then steps the
// connection on.
func (l *loop) finishIO(op *ioOp, n int, err error) {
	c, p := op.c, op.p
	if op.cancelled || c.closed {
		if op.buf != nil {
			l.putBuf(op.buf)
		}
		return
	}
	p.io = ioNone
	var ok bool
	if op.send {
		_, ok = c.sent(p, n, err)
	} else {
		_, ok = c.received(p, op.buf, n, err)
	}
	if !ok {
		c.abort()
		return
	}
	c.progress()
}

// deferrable reports whether every queued operation is a send after
// which the connection has nothing more to do whatever it returns: its
// source has no unread bytes the send's room would let in, and no EOF to
// pass on. A short send waits for EPOLLOUT, and a failed one ends the
// connection, which can wait for the next wake-up (at most
// maxDeferredWait away).
func (l *loop) deferrable() bool {
	for i := range l.ioOps {
		op := &l.ioOps[i]
		if op.cancelled {
			continue
		}
		if !op.send || op.p.src.readable || op.p.eof {
			return false
		}
	}
	return true
}

// maxDeferredWait bounds, in milliseconds, a wait that carries sends:
// their results are applied when it ends.
const maxDeferredWait = 1

// epollUserData marks the ring's epoll wait among its completions.
const epollUserData = ^uint64(0)

// reapRing applies the completions posted: ops' by their index, the
// epoll wait's by keeping its result for the turn (epollDone).
func (l *loop) reapRing(ops []ioOp) {
	l.ring.reap(func(ud uint64, res int32) {
		if ud == epollUserData {
			l.epollArmed, l.epollDone, l.epollRes = false, true, res
			return
		}
		l.complete(&ops[ud], res)
	})
}

// ringWait is a turn's wait on the ring: one io_uring_enter submits the
// sends the last turn left (flushIO) and an epoll wait on the loop's
// epoll descriptor, then sleeps until the epoll wait completes or the
// timeout passes. The sends complete inside the enter, and the epoll wait
// there too when events are ready. Where the kernel has no epoll wait
// operation (before 6.15), its completion says so and the loop goes back
// to epoll_wait. The results are applied by reapWait, after the turn's
// clock is read.
func (l *loop) ringWait(timeout int) {
	ops := l.ioOps
	l.ioOps = l.ioSpare[:0]
	for i := range ops {
		if !ops[i].cancelled {
			ops[i].p.io = ioSubmitted
		}
	}
	l.waiting, l.deferred = ops, false
	want := uint32(len(ops))
	l.mostSends = max(l.mostSends, want)
	l.waitSends += uint64(want)
	if !l.epollDone { // else its events are in hand: no wait
		if !l.epollArmed {
			s := l.ring.next() // full keeps a slot for it
			s.opcode, s.fd, s.userData = ioOpEpollWait, int32(l.epfd), epollUserData
			s.addr = uint64(uintptr(unsafe.Pointer(&l.ringEvents[0])))
			s.len = uint32(len(l.ringEvents))
			l.epollArmed = true
		}
		if timeout != 0 {
			want++
		}
		if len(ops) > 0 && (timeout < 0 || timeout > maxDeferredWait) {
			timeout = maxDeferredWait
		}
	}
	if want == 0 && l.ring.queued == 0 {
		return // the events are in hand and nothing is to be sent
	}
	if err := l.ring.submitWait(want, timeout); err != nil {
		l.ringBroken(err)
	}
}

// reapWait applies what ringWait's enter brought and returns how many
// events the epoll wait left in l.ringEvents.
func (l *loop) reapWait() int {
	ops := l.waiting
	l.waiting = nil
	if l.ring != nil {
		l.reapRing(ops)
	}
	clear(ops)
	l.ioSpare = ops[:0]
	if !l.epollDone {
		return 0
	}
	l.epollDone = false
	switch res := l.epollRes; {
	case res >= 0:
		return int(res)
	case res == -int32(unix.EINVAL) || res == -int32(unix.EOPNOTSUPP):
		l.noRingWait = true // no epoll wait on this kernel's rings
	}
	return 0 // -EINTR, -ECANCELED: armed again next turn
}

// ringBroken gives the ring up after an enter failed (not one of its
// operations): every operation not completed fails its connection, and
// the loop goes on with plain syscalls and epoll_wait.
func (l *loop) ringBroken(err error) {
	l.e.ringFailures.Add(1)
	ops := l.waiting
	l.reapRing(ops)
	for i := range ops {
		if ops[i].p.io == ioSubmitted {
			l.finishIO(&ops[i], 0, err)
		}
	}
	l.dropRing()
}

func (l *loop) dropRing() {
	l.ring.close()
	l.ring = nil
	l.epollArmed, l.epollDone, l.deferred = false, false, false
	// Operations queued since the batch that failed went with the ring.
	ops := l.ioOps
	l.ioOps = nil
	for i := range ops {
		l.finishIO(&ops[i], 0, unix.ECANCELED)
	}
}
