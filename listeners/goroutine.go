package listeners

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// Dialer opens connections to endpoints. *net.Dialer satisfies it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Goroutine is the standard-library engine: a goroutine per listener and two
// per TCP connection (io.Copy with half-close), and a goroutine per UDP flow.
// It runs everywhere Go does, Windows included.
type Goroutine struct {
	opts   Options
	dialer Dialer

	mu        sync.Mutex
	listeners map[io.Closer]struct{}
	conns     map[io.Closer]struct{}
	closing   bool
	wg        sync.WaitGroup // open connections and flows
	loops     sync.WaitGroup // accept and read loops
	dgrams    *datagramReader
	fds       *fdBudget
	copier    *tcpCopier // with its splice pipes on Linux
}

// NewGoroutine returns a goroutine engine that dials with net.Dialer.
func NewGoroutine(opts Options) *Goroutine {
	return NewGoroutineWithDialer(opts, &net.Dialer{})
}

// NewGoroutineWithDialer returns a goroutine engine with an injected dialer.
func NewGoroutineWithDialer(opts Options, d Dialer) *Goroutine {
	opts = opts.withDefaults()
	fds := newFDBudget(opts.MaxFDs)
	return &Goroutine{opts: opts, dialer: d, listeners: map[io.Closer]struct{}{}, conns: map[io.Closer]struct{}{}, dgrams: newDatagramReader(),
		fds: fds, copier: newTCPCopier(fds)}
}

// Name returns "goroutine".
func (g *Goroutine) Name() string { return EngineGoroutine }

func (g *Goroutine) track(c io.Closer) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	g.conns[c] = struct{}{}
	g.wg.Add(1)
	return true
}

// untrack forgets a connection; its copies have ended, so their pipes
// are back in the pool, which keeps two per connection still open.
func (g *Goroutine) untrack(c io.Closer) {
	g.mu.Lock()
	delete(g.conns, c)
	open := len(g.conns)
	g.mu.Unlock()
	g.copier.connectionsOpen(open)
	g.wg.Done()
}

// Listen opens a TCP or UDP listener.
func (g *Goroutine) Listen(proto lb.Protocol, addr netip.AddrPort, t *Target) (Listener, error) {
	switch proto {
	case lb.TCP:
		lns, err := g.adoptOrListenTCP(addr)
		if err != nil {
			return nil, err
		}
		l := &goTCPListener{g: g, ln: lns[0], rest: lns[1:], t: t}
		g.addListener(l)
		// Held under the address asked for, which a successor asks for
		// too: Go listens on [::] for 0.0.0.0 ("tcp"), and under that
		// address a restart found nothing to take, failed to listen
		// (EADDRINUSE) and served the port only once this process had
		// retired.
		held := netip.AddrPortFrom(addr.Addr(), l.Addr().Port())
		for _, ln := range lns {
			g.opts.sockets().Hold("tcp", held, rawFD(ln))
			g.loops.Add(1)
			go l.serve(ln)
		}
		return l, nil
	case lb.UDP:
		return g.listenUDP(addr, t)
	}
	return nil, ErrUnsupportedProtocol
}

func (g *Goroutine) addListener(l io.Closer) {
	g.mu.Lock()
	g.listeners[l] = struct{}{}
	g.mu.Unlock()
}

func (g *Goroutine) removeListener(l io.Closer) {
	g.mu.Lock()
	delete(g.listeners, l)
	g.mu.Unlock()
}

// Shutdown closes the listeners and drains connections until ctx ends.
func (g *Goroutine) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	var ls []io.Closer
	for l := range g.listeners {
		ls = append(ls, l)
	}
	g.mu.Unlock()
	// The listeners close and their loops end first: a connection
	// accepted before that is served, not closed unanswered.
	for _, l := range ls {
		if u, ok := l.(*goUDPListener); ok {
			u.drain()
		} else {
			l.Close()
		}
	}
	g.loops.Wait()
	g.mu.Lock()
	g.closing = true
	ls = ls[:0]
	for l := range g.listeners { // opened meanwhile
		ls = append(ls, l)
	}
	g.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	g.loops.Wait()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	defer g.copier.close() // every connection has ended
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	<-done
	return ctx.Err()
}

// adoptOrListenTCP serves a predecessor's sockets for addr (hitless
// restart), every one of them, or listens anew.
func (g *Goroutine) adoptOrListenTCP(addr netip.AddrPort) ([]*net.TCPListener, error) {
	var lns []*net.TCPListener
	for _, fd := range g.opts.sockets().Take("tcp", addr) {
		f := os.NewFile(uintptr(fd), "inherited listener")
		ln, err := net.FileListener(f)
		f.Close()
		if err == nil {
			lns = append(lns, ln.(*net.TCPListener))
		}
	}
	if len(lns) > 0 {
		return lns, nil
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	return []*net.TCPListener{ln}, nil
}

// rawFD is a listener's or socket's descriptor, for Sockets.Hold and
// Release; -1 if it has none.
func rawFD(c syscall.Conn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

type goTCPListener struct {
	g      *Goroutine
	ln     *net.TCPListener
	rest   []*net.TCPListener // more of a predecessor's reuseport group (hitless restart)
	t      *Target
	once   sync.Once
	closed atomic.Bool
}

func (l *goTCPListener) Addr() netip.AddrPort { return l.ln.Addr().(*net.TCPAddr).AddrPort() }

func (l *goTCPListener) Close() error {
	var err error
	l.once.Do(func() {
		l.closed.Store(true)
		for _, ln := range append([]*net.TCPListener{l.ln}, l.rest...) {
			l.g.opts.sockets().Release(rawFD(ln))
			if cerr := ln.Close(); err == nil {
				err = cerr
			}
		}
		l.g.removeListener(l)
	})
	return err
}

func (l *goTCPListener) serve(ln *net.TCPListener) {
	defer l.g.loops.Done()
	var backoff time.Duration
	fds := l.g.fds
	for {
		// A connection's descriptors are taken before the accept: past
		// the budget, clients wait in the accept queue. Idle splice pipes
		// are given up first: connections come before their cache.
		if !fds.take(goConnFDs) && !(l.g.copier.shed() && fds.take(goConnFDs)) {
			backoff = min(max(2*backoff, 5*time.Millisecond), 100*time.Millisecond)
			if l.closed.Load() {
				return
			}
			time.Sleep(backoff)
			continue
		}
		c, err := ln.AcceptTCP()
		if err != nil {
			fds.give(goConnFDs)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: back off instead of spinning or panicking.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		gc := newGoConn(c)
		if !l.g.track(gc) {
			c.Close()
			fds.give(goConnFDs)
			continue
		}
		go l.handle(gc)
	}
}

// goConn is one proxied TCP connection, as the engine tracks it: Close
// (the drain's cut) cancels a connect in progress and resets both sides,
// so a copy blocked on a silent backend returns too.
type goConn struct {
	client *net.TCPConn
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	backend *net.TCPConn
	cut     bool
}

func newGoConn(c *net.TCPConn) *goConn {
	ctx, cancel := context.WithCancel(context.Background())
	return &goConn{client: c, ctx: ctx, cancel: cancel}
}

// connected records the backend; false if the connection was cut meanwhile.
func (c *goConn) connected(b *net.TCPConn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return false
	}
	c.backend = b
	return true
}

func (c *goConn) Close() error {
	c.cancel()
	c.mu.Lock()
	c.cut = true
	b := c.backend
	c.mu.Unlock()
	refuse(c.client)
	if b != nil {
		refuse(b)
	}
	return nil
}

// refuse resets the client connection: the nearest a userspace proxy gets
// to ECONNREFUSED once the kernel has completed the handshake.
func refuse(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func (l *goTCPListener) handle(gc *goConn) {
	defer l.g.fds.give(goConnFDs)
	defer l.g.untrack(gc)
	defer gc.cancel()
	client := gc.client
	t := l.t
	if t.resolver() != nil {
		t = nil
		if rc, err := client.SyscallConn(); err == nil {
			v6 := false
			if la, ok := client.LocalAddr().(*net.TCPAddr); ok {
				v6 = la.IP.To4() == nil
			}
			rc.Control(func(fd uintptr) { t = l.t.resolved(int(fd), v6) })
		}
		if t == nil {
			refuse(client)
			return
		}
	}
	ctr := t.counters()
	ctr.Opened()
	var up, down uint64
	defer func() { ctr.Closed(up, down) }() // refusals too
	src := client.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	start := l.g.opts.Now()
	walk := new(lb.Walk)
	if err := t.startWalk(walk, src, start); err != nil {
		ctr.Refused()
		refuse(client)
		return
	}
	var backend *net.TCPConn
	for backend == nil {
		ep, timeout, ok := walk.Next(l.g.opts.Now())
		if !ok {
			ctr.Refused()
			refuse(client)
			return
		}
		ctx, cancel := context.WithTimeout(gc.ctx, timeout)
		c, err := l.g.dialer.DialContext(ctx, "tcp", ep.String())
		cancel()
		if gc.ctx.Err() != nil { // cut by the drain
			if err == nil {
				c.Close()
			}
			ctr.Refused()
			return
		}
		if err != nil {
			t.Picker.Failed(src, ep)
			ctr.ConnectFailed()
			continue
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			t.Picker.Failed(src, ep)
			ctr.ConnectFailed()
			continue
		}
		if !gc.connected(tc) {
			tc.Close()
			ctr.Refused()
			return
		}
		backend = tc
		t.Picker.Connected(src, ep)
		ctr.Connected(l.g.opts.Now().Sub(start), walk.Tries())
	}
	up, down = pump2(client, backend, l.g.copier, l.g.opts.HalfCloseTimeout, l.g.opts.Now)
}

// pump2 pumps both directions until both have ended. A clean EOF is
// passed on as a half-close (CloseWrite); an error resets both sides. Once
// one direction has ended, the other is reset when it moves nothing for
// halfClose.
func pump2(client, backend *net.TCPConn, copier *tcpCopier, halfClose time.Duration, now func() time.Time) (up, down uint64) {
	var wg sync.WaitGroup
	var once sync.Once
	abort := func() {
		once.Do(func() {
			client.SetLinger(0)
			backend.SetLinger(0)
			client.Close()
			backend.Close()
		})
	}
	var ended sync.Once
	pump := func(dst, src, other *net.TCPConn, n *uint64) {
		defer wg.Done()
		for {
			// The copier splices through a pooled pipe on Linux; memory
			// per direction stays bounded because a blocked write stops
			// the reads. A read deadline (set once the other direction has
			// ended) stops it with nothing left in flight.
			c, err := copier.copy(dst, src)
			*n += uint64(c)
			if err == nil {
				break
			}
			if errors.Is(err, os.ErrDeadlineExceeded) && c > 0 {
				src.SetReadDeadline(now().Add(halfClose)) // still moving: another period
				continue
			}
			abort()
			return
		}
		if err := dst.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ENOTCONN) {
			abort()
			return
		}
		// This direction is done: the other now has halfClose to move
		// something, each time.
		ended.Do(func() { other.SetReadDeadline(now().Add(halfClose)) })
	}
	wg.Add(2)
	go pump(backend, client, backend, &up)
	go pump(client, backend, client, &down)
	wg.Wait()
	once.Do(func() {
		client.Close()
		backend.Close()
	})
	return up, down
}
