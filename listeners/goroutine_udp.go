package listeners

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
)

type goUDPListener struct {
	g        *Goroutine
	conn     *net.UDPConn
	t        *Target
	wildcard bool

	mu       sync.Mutex
	flows    map[netip.AddrPort]*goUDPFlow
	once     sync.Once
	draining bool // under mu: no longer read; closes with its last flow
}

type goUDPFlow struct {
	l       *goUDPListener
	client  netip.AddrPort
	local   netip.Addr // the address the client sent to (wildcard listeners)
	ep      netip.AddrPort
	backend *net.UDPConn

	mu         sync.Mutex
	lastActive time.Time
	up, down   uint64
}

func (g *Goroutine) listenUDP(addr netip.AddrPort, t *Target) (Listener, error) {
	wildcard := addr.Addr().IsUnspecified()
	lc := net.ListenConfig{}
	if wildcard {
		lc.Control = func(network, address string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = enablePktinfo(fd, addr.Addr().Is6() && !addr.Addr().Is4In6()) })
			return errors.Join(err, serr)
		}
	}
	network := "udp4"
	if addr.Addr().Is6() {
		network = "udp6"
	}
	var pc net.PacketConn
	for _, fd := range g.opts.sockets().Take("udp", addr) { // a predecessor's (hitless restart)
		disableGRO(uintptr(fd)) // an event-loop predecessor's socket merges bursts
		f := os.NewFile(uintptr(fd), "inherited UDP socket")
		if c, err := net.FilePacketConn(f); err == nil && pc == nil {
			pc = c
		} else if err == nil {
			c.Close()
		}
		f.Close()
	}
	if pc == nil {
		var err error
		pc, err = lc.ListenPacket(context.Background(), network, addr.String())
		if err != nil {
			return nil, err
		}
	}
	l := &goUDPListener{g: g, conn: pc.(*net.UDPConn), t: t, wildcard: wildcard, flows: map[netip.AddrPort]*goUDPFlow{}}
	g.opts.sockets().Hold("udp", l.Addr(), rawFD(l.conn))
	g.addListener(l)
	g.loops.Add(1)
	go l.serve()
	return l, nil
}

func (l *goUDPListener) Addr() netip.AddrPort { return l.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// Close stops reading new datagrams. Open flows cannot reply without the
// socket, so they end too.
func (l *goUDPListener) Close() error {
	var err error
	l.once.Do(func() {
		l.g.opts.sockets().Release(rawFD(l.conn))
		err = l.conn.Close()
		l.g.removeListener(l)
		l.mu.Lock()
		for _, f := range l.flows {
			f.backend.Close()
		}
		l.mu.Unlock()
	})
	return err
}

// drain is Shutdown's close: the socket is no longer read (after a
// hand-over the successor reads it) while the flows go on relaying
// replies until they idle out; the socket closes with the last one.
func (l *goUDPListener) drain() {
	l.once.Do(func() {
		l.g.removeListener(l)
		l.mu.Lock()
		l.draining = true
		empty := len(l.flows) == 0
		l.mu.Unlock()
		l.g.opts.sockets().Release(rawFD(l.conn))
		if empty {
			l.conn.Close()
		} else {
			l.conn.SetReadDeadline(time.Now()) // ends serve's read
		}
	})
}

func (l *goUDPListener) serve() {
	defer l.g.loops.Done()
	buf := make([]byte, maxDatagram+1)
	oob := make([]byte, oobSize)
	for {
		n, oobn, flags, client, err := l.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			l.mu.Lock()
			draining := l.draining
			l.mu.Unlock()
			if draining || errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. ICMP errors reported on the socket
		}
		if flags&msgTrunc != 0 {
			continue // never forward a truncated datagram
		}
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		f := l.flow(client, oob[:oobn])
		if f == nil {
			continue
		}
		if _, err := f.backend.Write(buf[:n]); err != nil {
			continue
		}
		f.touch(uint64(n), 0, l.g.opts.Now())
	}
}

func (l *goUDPListener) flow(client netip.AddrPort, oob []byte) *goUDPFlow {
	l.mu.Lock()
	f := l.flows[client]
	l.mu.Unlock()
	if f != nil {
		if l.t.Picker.Has(f.ep) {
			return f
		}
		f.backend.Close() // its endpoint went away: the flow ends and re-picks
		l.remove(f)
	}
	ctr := l.t.counters()
	ep, err := l.t.first(client.Addr())
	if err != nil {
		ctr.Refused()
		return nil
	}
	if !l.g.fds.take(1) {
		ctr.Refused() // out of descriptors: the datagram is dropped
		return nil
	}
	// A UDP "dial" is a local socket and connect: it does not wait on the network.
	bc, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ep))
	if err != nil {
		l.g.fds.give(1)
		l.t.Picker.Failed(client.Addr(), ep)
		ctr.ConnectFailed()
		ctr.Refused()
		return nil
	}
	if !l.g.track(bc) {
		bc.Close()
		l.g.fds.give(1)
		return nil
	}
	l.t.Picker.Connected(client.Addr(), ep)
	f = &goUDPFlow{l: l, client: client, ep: ep, backend: bc, lastActive: l.g.opts.Now()}
	if l.wildcard {
		f.local = pktinfoDst(oob)
	}
	l.mu.Lock()
	l.flows[client] = f
	l.mu.Unlock()
	ctr.Opened()
	go f.serve()
	return f
}

func (l *goUDPListener) remove(f *goUDPFlow) {
	l.mu.Lock()
	if l.flows[f.client] == f {
		delete(l.flows, f.client)
	}
	last := l.draining && len(l.flows) == 0
	l.mu.Unlock()
	if last {
		l.conn.Close()
	}
}

func (f *goUDPFlow) touch(up, down uint64, now time.Time) {
	f.mu.Lock()
	f.lastActive = now
	f.up += up
	f.down += down
	f.mu.Unlock()
}

func (f *goUDPFlow) idleSince() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastActive
}

// serve relays replies until the flow has been idle in both directions for
// the UDP timeout, or the endpoint refuses.
func (f *goUDPFlow) serve() {
	l := f.l
	defer l.g.fds.give(1)
	defer l.g.untrack(f.backend)
	defer func() {
		f.backend.Close()
		l.remove(f)
		f.mu.Lock()
		up, down := f.up, f.down
		f.mu.Unlock()
		l.t.counters().Closed(up, down)
	}()
	timeout := l.t.UDPTimeout
	oob := pktinfoSrc(f.local)
	for {
		f.backend.SetReadDeadline(f.idleSince().Add(timeout))
		buf, n, truncated, err := l.g.dgrams.read(f.backend)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if l.g.opts.Now().Sub(f.idleSince()) < timeout {
					continue // client traffic kept it alive
				}
				return
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				l.t.Picker.Failed(f.client.Addr(), f.ep)
				l.t.counters().ConnectFailed()
			}
			return
		}
		if truncated {
			l.g.dgrams.put(buf)
			continue // never forward a truncated datagram
		}
		_, _, err = l.conn.WriteMsgUDPAddrPort((*buf)[:n], oob, f.client)
		l.g.dgrams.put(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		f.touch(0, uint64(n), l.g.opts.Now())
	}
}
