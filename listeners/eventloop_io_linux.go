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

// batching reports whether the turn's recvs and sends go on the ring: not
// when its wait brought one event, as on a single busy connection, whose
// recv and send could only go out one at a time (cost-rr: 4 % more LB CPU
// per request for queueing each and taking it back).
func (l *loop) batching() bool { return l.ring != nil && l.events > 1 && !l.ring.full() }

// queueSend queues the send of p's pending bytes. It reports false when
// the turn does not batch or the ring is full: then the caller sends now.
func (l *loop) queueSend(c *tcpConn, p *pipe) bool {
	if !l.batching() {
		return false
	}
	l.queue(ioOp{c: c, p: p, send: true}, ioOpSend, p.dst.fd, p.buf[p.r:p.w], unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	return true
}

// maxQueuedRecvs bounds the recvs a batch holds buffers for: a burst of
// new connections, each readable at once, would otherwise take a buffer
// each (256 a batch, 16 MiB) where plain recvs take one at a time. It is
// below the loop's spare buffers (putBuf keeps 64), so a batch's buffers
// come back to them rather than to the collector.
const maxQueuedRecvs = 32

// queueRecv queues a recv into buf, taken for it. It reports false, as
// queueSend does, when the caller must recv now.
func (l *loop) queueRecv(c *tcpConn, p *pipe, buf []byte) bool {
	if !l.batching() || l.queuedRecvs >= maxQueuedRecvs {
		return false
	}
	l.queuedRecvs++
	l.queue(ioOp{c: c, p: p, buf: buf}, ioOpRecv, p.src.fd, buf, unix.MSG_DONTWAIT)
	return true
}

// queue writes op's SQE, for b on fd, and records op as queued.
func (l *loop) queue(op ioOp, opcode uint8, fd int, b []byte, msgFlags uint32) {
	s := l.ring.next()
	s.opcode, s.fd, s.opFlags = opcode, int32(fd), msgFlags
	s.addr = uint64(uintptr(unsafe.Pointer(&b[0])))
	s.len = uint32(len(b))
	s.userData = uint64(len(l.ioOps))
	op.sqe = s
	op.p.io, op.p.op = ioQueued, int32(len(l.ioOps))
	l.ioOps = append(l.ioOps, op)
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
// batch after batch while completions queue more, up to maxIOBatches.
func (l *loop) flushIO() {
	for batch := 0; batch < maxIOBatches && len(l.ioOps) > 0; batch++ {
		ops := l.ioOps
		l.ioOps = l.ioSpare[:0]
		l.queuedRecvs = 0
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
				l.ringBroken(ops, err)
			} else {
				l.ringOps.Add(uint64(recvs + sends))
				l.ring.reap(func(ud uint64, res int32) { l.complete(&ops[ud], res) })
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

// ringBroken gives the ring up after an enter failed (not one of its
// operations): the completions posted are applied, every other operation
// of the batch fails its connection, and the loop goes on with plain
// syscalls. The ring is gone before any result is applied, so the
// connections stepped on queue nothing on it.
func (l *loop) ringBroken(ops []ioOp, err error) {
	l.e.ringFailures.Add(1)
	if log := l.e.opts.Log; log != nil {
		// Once in a loop's life, and off the loop: a slow log writer must
		// not hold up its turn.
		go log.Warn("an event loop gave up its io_uring: io_uring_enter failed; the connections of that batch were reset, and the loop makes a syscall per read and write from now on", "err", err)
	}
	type result struct {
		op  int
		res int32
	}
	var posted []result
	l.ring.reap(func(ud uint64, res int32) { posted = append(posted, result{int(ud), res}) })
	l.ring.close()
	l.ring = nil
	for _, r := range posted {
		l.complete(&ops[r.op], r.res)
	}
	for i := range ops {
		if ops[i].p.io == ioSubmitted {
			l.finishIO(&ops[i], 0, err)
		}
	}
}
