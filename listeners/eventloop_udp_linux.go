//go:build linux

package listeners

import (
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// elUDPListener is a UDP listener owned by one loop, with its flow table.
// Each flow has a connected socket to its endpoint on the same loop.
type elUDPListener struct {
	e        *EventLoop
	l        *loop
	fd       int
	addr     netip.AddrPort
	t        *Target
	wildcard bool
	once     sync.Once

	// Loop-owned.
	flows    map[netip.AddrPort]*udpFlow
	sweep    *deadline // the next expiry pass while there are flows
	closed   bool
	draining bool // no longer read; closes with its last flow
}

type udpFlow struct {
	ln         *elUDPListener
	fd         int
	client     netip.AddrPort
	clientSA   rawSockaddr // where replies go
	oob        []byte      // pktinfo for replies from a wildcard listener
	ep         netip.AddrPort
	lastActive time.Time
	up, down   uint64
	noGSO      bool // a GSO send was refused on this flow's path
	gro        bool // its socket takes merged datagrams (enableGRO)
}

func (e *EventLoop) listenUDP(addr netip.AddrPort, t *Target) (Listener, error) {
	fd, err := adoptOrBindUDP(e.opts.sockets(), addr)
	if err != nil {
		return nil, err
	}
	enableGRO(fd)
	wildcard := addr.Addr().IsUnspecified()
	if wildcard {
		if err := enablePktinfo(uintptr(fd), addr.Addr().Is6()); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	ln := &elUDPListener{e: e, l: e.pick(), fd: fd, addr: localAddr(fd), t: t, wildcard: wildcard, flows: map[netip.AddrPort]*udpFlow{}}
	err = errStopped
	ln.l.do(func() {
		if err = ln.l.registerReads(fd, ln); err == nil {
			ln.l.udp[ln] = struct{}{}
		}
	})
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	e.opts.sockets().Hold("udp", ln.addr, fd)
	return ln, nil
}

// adoptOrBindUDP takes a predecessor's socket for addr (hitless restart:
// datagrams queued on it are not lost), else binds one.
func adoptOrBindUDP(socks Sockets, addr netip.AddrPort) (int, error) {
	if fds := socks.Take("udp", addr); len(fds) > 0 {
		for _, extra := range fds[1:] {
			unix.Close(extra)
		}
		unix.SetNonblock(fds[0], true)
		unix.CloseOnExec(fds[0])
		return fds[0], nil
	}
	return bindSocket(unix.SOCK_DGRAM, addr)
}

func (ln *elUDPListener) Addr() netip.AddrPort { return ln.addr }

// Close stops the listener; its flows cannot reply without it, so they end.
func (ln *elUDPListener) Close() error {
	ln.once.Do(func() {
		closed := ln.l.do(func() {
			ln.closed = true
			ln.l.timers.cancel(ln.sweep)
			ln.sweep = nil
			ln.closeFlows()
			ln.l.closeListening(ln.fd)
			delete(ln.l.udp, ln)
		})
		if !closed {
			ln.e.opts.sockets().Release(ln.fd)
			unix.Close(ln.fd)
		}
	})
	return nil
}

// drain is Shutdown's close: the socket is no longer read (after a
// hand-over the successor reads it), while the flows go on relaying their
// endpoints' replies until they idle out; the socket closes with the last
// one, or at the drain's deadline.
func (ln *elUDPListener) drain() {
	ln.once.Do(func() {
		if !ln.l.do(func() {
			ln.e.opts.sockets().Release(ln.fd)
			unix.EpollCtl(ln.l.epfd, unix.EPOLL_CTL_DEL, ln.fd, nil)
			ln.l.drop(ln.fd)
			ln.draining = true
			if len(ln.flows) == 0 {
				ln.finish()
			}
		}) {
			ln.e.opts.sockets().Release(ln.fd)
			unix.Close(ln.fd)
		}
	})
}

// finish closes a draining listener's socket once its flows are gone.
func (ln *elUDPListener) finish() {
	ln.closed = true
	ln.l.timers.cancel(ln.sweep)
	ln.sweep = nil
	unix.Close(ln.fd)
	delete(ln.l.udp, ln)
}

func (ln *elUDPListener) closeFlows() {
	for _, f := range ln.flows {
		f.close()
	}
}

func (ln *elUDPListener) event(ev uint32) {
	if ev&(unix.EPOLLIN|unix.EPOLLERR) == 0 {
		return
	}
	l := ln.l
	b := l.dgrams()
	for round := 0; round < 4; round++ {
		n, err := b.recv(ln.fd, true)
		if err != nil {
			if errAgain(err) {
				return
			}
			continue // a queued ICMP error; keep reading
		}
		// Consecutive datagrams of one flow go up in one send; a run is
		// sent before the next datagram's flow is looked up, which may
		// close and replace a flow.
		var run *udpFlow
		start := 0
		for i := 0; i < n; i++ {
			client := b.from(i)
			if run != nil && client == run.client && !b.truncated(i) && ln.t.Picker.Has(run.ep) {
				continue
			}
			run.sendUp(start, i)
			run, start = nil, i
			if !b.truncated(i) {
				run = ln.flow(client, b.oob(i))
			}
		}
		run.sendUp(start, n)
		if n < len(b.hdrs) {
			return // drained: the next datagram brings a new edge
		}
	}
	l.again = append(l.again, func() {
		if !ln.closed && !ln.draining {
			ln.event(unix.EPOLLIN)
		}
	})
}

func (ln *elUDPListener) flow(client netip.AddrPort, oob []byte) *udpFlow {
	if f := ln.flows[client]; f != nil {
		if ln.t.Picker.Has(f.ep) {
			return f
		}
		f.close() // its endpoint went away: re-pick
	}
	ctr := ln.t.counters()
	ep, err := ln.t.first(client.Addr())
	if err != nil {
		ctr.Refused()
		return nil
	}
	epsa := newRawSockaddr(ep)
	fds := ln.e.fds
	if !fds.take(1) {
		ctr.Refused() // out of descriptors: the datagram is dropped
		return nil
	}
	fd, err := unix.Socket(epsa.family(), unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fds.give(1)
		ctr.Refused()
		return nil
	}
	if err := connectRaw(fd, &epsa); err != nil {
		unix.Close(fd)
		fds.give(1)
		ln.t.Picker.Failed(client.Addr(), ep)
		ctr.ConnectFailed()
		ctr.Refused()
		return nil
	}
	f := &udpFlow{ln: ln, fd: fd, client: client, clientSA: newRawSockaddr(client), ep: ep, lastActive: ln.l.now}
	if ln.wildcard {
		f.oob = pktinfoSrc(pktinfoDst(oob))
	}
	if err := ln.l.registerReads(fd, f); err != nil {
		unix.Close(fd)
		fds.give(1)
		ctr.Refused()
		return nil
	}
	e := ln.e
	e.mu.Lock()
	e.active.Add(1)
	e.mu.Unlock()
	ln.flows[client] = f
	ln.t.Picker.Connected(client.Addr(), ep)
	ctr.Opened()
	ln.scheduleSweep()
	return f
}

// scheduleSweep arms one loop deadline per listener while it has flows;
// flows end between one and 1.25 UDP timeouts after their last datagram.
func (ln *elUDPListener) scheduleSweep() {
	if ln.sweep != nil {
		return
	}
	timeout := ln.t.UDPTimeout
	ln.sweep = ln.l.after(max(timeout/4, time.Millisecond), func() {
		ln.sweep = nil
		if ln.closed {
			return
		}
		now := ln.l.now // the turn's clock, which lastActive is read from too
		for _, f := range ln.flows {
			if now.Sub(f.lastActive) >= timeout {
				f.close()
			}
		}
		if len(ln.flows) > 0 {
			ln.scheduleSweep()
		}
	})
}

// event relays replies from the endpoint to the client.
func (f *udpFlow) event(ev uint32) {
	if ev&(unix.EPOLLIN|unix.EPOLLERR) == 0 {
		return
	}
	l := f.ln.l
	b := l.dgrams()
	for round := 0; round < 4; round++ {
		n, err := b.recv(f.fd, false)
		if err != nil {
			if errAgain(err) {
				return
			}
			if err == unix.ECONNREFUSED {
				f.ln.t.Picker.Failed(f.client.Addr(), f.ep)
				f.ln.t.counters().ConnectFailed()
				f.close()
				return
			}
			continue
		}
		if n > 1 && !f.gro {
			// A burst: the endpoint may send more like it, which the
			// kernel can then hand over merged. A flow of one exchange
			// never pays the setsockopt.
			enableGRO(f.fd)
			f.gro = true
		}
		if sent := f.relay(f.ln.fd, 0, n, &f.clientSA, f.oob); sent > 0 {
			f.down += sent
			f.lastActive = l.now
		}
		if n < len(b.hdrs) {
			return // drained
		}
	}
	l.again = append(l.again, func() {
		if f.ln.flows[f.client] == f {
			f.event(unix.EPOLLIN)
		}
	})
}

// sendUp relays datagrams [i, j) of the loop's last receive, all from f's
// client, to f's endpoint; a lone datagram with a plain send.
func (f *udpFlow) sendUp(i, j int) {
	if f == nil || i == j {
		return
	}
	b := f.ln.l.batch
	var sent uint64
	if j-i == 1 && b.seg(i) == 0 {
		d := b.data(i)
		if _, err := sockSend(f.fd, d); err == nil {
			sent = uint64(len(d))
		}
	} else {
		sent = f.relay(f.fd, i, j, nil, nil)
	}
	if sent > 0 {
		f.up += sent
		f.lastActive = f.ln.l.now
	}
}

// relay sends datagrams [i, j) of the loop's last receive, of one flow
// (two or more, or one the kernel merged from several), on fd: as one GSO
// send when they are of one size and the flow's path takes it, else with
// sendmmsg. A GSO send the kernel refuses (a datagram larger than the
// path's MTU, a kernel before 4.18) is sent the other way, and the flow
// stops trying GSO, both ways; one that fails for another reason is sent
// the other way too, and the next burst tries GSO again.
func (f *udpFlow) relay(fd, i, j int, name *rawSockaddr, oob []byte) uint64 {
	b := f.ln.l.batch
	size, ok := 0, false
	if !f.noGSO { // not worked out once the path refused GSO
		size, ok = b.gsoSize(i, j)
	}
	if ok {
		sent, err := b.sendGSO(fd, i, j, size, name, oob)
		switch {
		case err == nil:
			return sent
		case errAgain(err):
			return 0 // the send buffer is full: dropped, as sendmmsg would
		case gsoRefused(err):
			f.noGSO = true
		}
		// Else an error of the socket's, such as an endpoint's earlier
		// ICMP refusal reported on this send: the datagrams go one by one,
		// as before GSO, and the next burst tries GSO again.
	}
	if b.merged(i, j) {
		return b.sendSplit(fd, i, j, name, oob)
	}
	return b.send(fd, i, j, name, oob)
}

// gsoRefused reports whether a GSO send failed for being one: a segment
// over the path's MTU or a payload over the limit (EINVAL, EMSGSIZE), a
// device without checksum offload on an older kernel (EIO), or a kernel
// without UDP_SEGMENT.
func gsoRefused(err error) bool {
	switch err {
	case unix.EINVAL, unix.EMSGSIZE, unix.EIO, unix.ENOPROTOOPT, unix.EOPNOTSUPP:
		return true
	}
	return false
}

func (f *udpFlow) close() {
	ln := f.ln
	if ln.flows[f.client] != f {
		return
	}
	delete(ln.flows, f.client)
	ln.l.closeFD(f.fd)
	ln.e.fds.give(1)
	ln.t.counters().Closed(f.up, f.down)
	if ln.draining && !ln.closed && len(ln.flows) == 0 {
		ln.finish()
	}
	ln.e.active.Done()
}

// dgrams is the loop's receive batch, made by its first UDP receive: a
// loop that serves no UDP holds none (with datagrams of up to 64 KiB, a
// batch is a megabyte of heap, one per loop, which the collector's goal
// then doubled).
func (l *loop) dgrams() *dgramBatch {
	if l.batch == nil {
		l.batch = newDgramBatch(dgramBatchSize, maxDatagram+1)
	}
	return l.batch
}
