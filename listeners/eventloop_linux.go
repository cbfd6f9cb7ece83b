//go:build linux

package listeners

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/lb"
)

// EventLoop is the epoll engine: a few event loops, each one goroutine that
// owns its sockets, with no goroutine per connection. Backend connects are
// non-blocking and completed on the loop; per-try timeouts are runtime
// timers that post back to the loop. Each direction of a connection has at
// most one fixed-size buffer, taken only while bytes are in flight, so an
// idle connection holds no buffer and a slow reader pauses its writer.
// A clean EOF is forwarded as shutdown(SHUT_WR).
type EventLoop struct {
	opts  Options
	loops []*loop
	next  atomic.Uint64

	mu        sync.Mutex
	listeners map[Listener]struct{}
	closing   bool
	active    sync.WaitGroup // connections and flows
	stopped   sync.WaitGroup // loop goroutines
}

// NewEventLoop starts the loops.
func NewEventLoop(opts Options) (*EventLoop, error) {
	opts = opts.withDefaults()
	n := opts.Loops
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	e := &EventLoop{opts: opts, listeners: map[Listener]struct{}{}}
	for i := 0; i < n; i++ {
		l, err := newLoop(e)
		if err != nil {
			e.stopLoops()
			return nil, err
		}
		e.loops = append(e.loops, l)
		e.stopped.Add(1)
		go l.run()
	}
	return e, nil
}

// Name returns "eventloop".
func (e *EventLoop) Name() string { return EngineEventLoop }

func (e *EventLoop) pick() *loop { return e.loops[(e.next.Add(1)-1)%uint64(len(e.loops))] }

// Listen opens a TCP or UDP listener on one loop.
func (e *EventLoop) Listen(proto lb.Protocol, addr netip.AddrPort, t *Target) (Listener, error) {
	e.mu.Lock()
	closing := e.closing
	e.mu.Unlock()
	if closing {
		return nil, errors.New("engine is shutting down")
	}
	var (
		ln  Listener
		err error
	)
	switch proto {
	case lb.TCP:
		ln, err = e.listenTCP(addr, t)
	case lb.UDP:
		ln, err = e.listenUDP(addr, t)
	default:
		return nil, ErrUnsupportedProtocol
	}
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.listeners[ln] = struct{}{}
	e.mu.Unlock()
	return ln, nil
}

func (e *EventLoop) forget(ln Listener) {
	e.mu.Lock()
	delete(e.listeners, ln)
	e.mu.Unlock()
}

// Shutdown closes every listener, waits for connections to drain until ctx
// ends, then closes the rest and stops the loops.
func (e *EventLoop) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.closing = true
	var ls []Listener
	for l := range e.listeners {
		ls = append(ls, l)
	}
	e.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	done := make(chan struct{})
	go func() { e.active.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		for _, l := range e.loops {
			l.post(l.closeAll)
		}
		<-done
	}
	e.stopLoops()
	return err
}

func (e *EventLoop) stopLoops() {
	for _, l := range e.loops {
		l.post(func() { l.quit = true })
	}
	e.stopped.Wait()
	for _, l := range e.loops {
		l.epfile.Close() // closes the epoll descriptor and unregisters it from Go's poller
		unix.Close(l.wakefd)
	}
}

// handler is anything registered on a loop.
type handler interface {
	event(ev uint32)
}

type registration struct {
	id uint32
	h  handler
}

type loop struct {
	e      *EventLoop
	epfd   int
	epfile *os.File // epfd, registered with Go's poller so the loop parks instead of blocking a thread
	wakefd int

	mu    sync.Mutex
	tasks []func()

	// Owned by the loop goroutine.
	regs  map[int32]registration
	seq   uint32
	later []*tcpConn // connections that yielded with work left
	free  [][]byte   // spare copy buffers
	rbuf  []byte     // shared UDP receive buffer
	oob   []byte
	now   time.Time
	quit  bool
	conns map[*tcpConn]struct{}
	udp   map[*elUDPListener]struct{}

	exited chan struct{} // closed when run returns; later tasks never run
}

func newLoop(e *EventLoop) (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	wfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	// The loop waits for its epoll descriptor through Go's own poller: it
	// parks like any goroutine blocked on a socket, instead of holding an OS
	// thread in epoll_wait, which costs a scheduler hand-off on every wake-up.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		unix.Close(wfd)
		return nil, fmt.Errorf("epoll nonblock: %w", err)
	}
	l := &loop{e: e, epfd: epfd, epfile: os.NewFile(uintptr(epfd), "sluice-epoll"), wakefd: wfd, regs: map[int32]registration{},
		rbuf: make([]byte, maxDatagram+1), oob: make([]byte, 64),
		conns: map[*tcpConn]struct{}{}, udp: map[*elUDPListener]struct{}{}, exited: make(chan struct{})}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wfd)}); err != nil {
		l.epfile.Close()
		unix.Close(wfd)
		return nil, fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	return l, nil
}

// post runs fn on the loop. It is safe from any goroutine and never blocks
// on the loop.
func (l *loop) post(fn func()) {
	l.mu.Lock()
	l.tasks = append(l.tasks, fn)
	first := len(l.tasks) == 1
	l.mu.Unlock()
	if first {
		var one = [8]byte{1}
		unix.Write(l.wakefd, one[:])
	}
}

// do runs fn on the loop and waits for it. It reports false, without
// running fn, when the loop has already stopped.
func (l *loop) do(fn func()) bool {
	done := make(chan struct{})
	l.post(func() { fn(); close(done) })
	select {
	case <-done:
		return true
	case <-l.exited:
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}

// register adds fd edge-triggered for reads and writes.
func (l *loop) register(fd int, h handler) error {
	l.seq++
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd), Pad: int32(l.seq)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return err
	}
	l.regs[int32(fd)] = registration{id: l.seq, h: h}
	return nil
}

// closeFD unregisters and closes fd.
func (l *loop) closeFD(fd int) {
	delete(l.regs, int32(fd))
	unix.Close(fd) // closing the only reference removes it from epoll
}

func (l *loop) getBuf() []byte {
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b
	}
	return make([]byte, l.e.opts.BufferSize)
}

func (l *loop) putBuf(b []byte) {
	if len(l.free) < 64 { // keep a few warm; let the GC have the rest
		l.free = append(l.free, b)
	}
}

func (l *loop) run() {
	defer l.e.stopped.Done()
	defer close(l.exited)
	rc, err := l.epfile.SyscallConn()
	if err != nil {
		panic(fmt.Sprintf("epoll SyscallConn: %v", err)) // cannot happen for an *os.File
	}
	events := make([]unix.EpollEvent, 256)
	for !l.quit {
		var n int
		var werr error
		// rc.Read calls the function at once, and parks until the epoll
		// descriptor is readable only when it returns false.
		err := rc.Read(func(fd uintptr) bool {
			n, werr = unix.EpollWait(int(fd), events, 0)
			return n > 0 || len(l.later) > 0 || (werr != nil && werr != unix.EINTR)
		})
		if err != nil || (werr != nil && werr != unix.EINTR) {
			panic(fmt.Sprintf("epoll_wait: %v %v", err, werr)) // a programming error: the fd is ours
		}
		l.now = l.e.opts.Now()
		for i := 0; i < n; i++ {
			ev := &events[i]
			if int(ev.Fd) == l.wakefd {
				var b [8]byte
				unix.Read(l.wakefd, b[:])
				continue
			}
			if r, ok := l.regs[ev.Fd]; ok && r.id == uint32(ev.Pad) {
				r.h.event(ev.Events)
			}
		}
		l.runTasks()
		if later := l.later; len(later) > 0 {
			l.later = nil
			for _, c := range later {
				c.queued = false
				c.progress()
			}
		}
	}
	l.closeAll()
}

func (l *loop) runTasks() {
	for {
		l.mu.Lock()
		tasks := l.tasks
		l.tasks = nil
		l.mu.Unlock()
		if len(tasks) == 0 {
			return
		}
		for _, t := range tasks {
			t()
		}
	}
}

func (l *loop) closeAll() {
	for c := range l.conns {
		c.abort()
	}
	for u := range l.udp {
		u.closeFlows()
	}
}

// sockaddr conversions.

func toSockaddr(ap netip.AddrPort) (unix.Sockaddr, int) {
	a := ap.Addr()
	if a.Is4() || a.Is4In6() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.Unmap().As4()}, unix.AF_INET
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}, unix.AF_INET6
}

func fromSockaddr(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

func bindSocket(typ int, addr netip.AddrPort) (int, error) {
	sa, family := toSockaddr(addr)
	fd, err := unix.Socket(family, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if family == unix.AF_INET6 {
		unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", addr, err)
	}
	return fd, nil
}

func localAddr(fd int) netip.AddrPort {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}
	}
	return fromSockaddr(sa)
}

var errStopped = errors.New("event loop stopped")

// errAgain reports a would-block result.
func errAgain(err error) bool { return err == unix.EAGAIN || err == unix.EWOULDBLOCK }

// ---------------------------------------------------------------- TCP

type elTCPListener struct {
	e    *EventLoop
	l    *loop
	fd   int
	addr netip.AddrPort
	t    *Target
	once sync.Once
}

func (e *EventLoop) listenTCP(addr netip.AddrPort, t *Target) (Listener, error) {
	fd, err := bindSocket(unix.SOCK_STREAM, addr)
	if err != nil {
		return nil, err
	}
	if err := unix.Listen(fd, 4096); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	ln := &elTCPListener{e: e, l: e.pick(), fd: fd, addr: localAddr(fd), t: t}
	err = errStopped
	ln.l.do(func() { err = ln.l.register(fd, ln) })
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return ln, nil
}

func (ln *elTCPListener) Addr() netip.AddrPort { return ln.addr }

func (ln *elTCPListener) Close() error {
	ln.once.Do(func() {
		ln.e.forget(ln)
		if !ln.l.do(func() { ln.l.closeFD(ln.fd) }) {
			unix.Close(ln.fd)
		}
	})
	return nil
}

func (ln *elTCPListener) event(uint32) {
	// Accept a bounded batch, then let other sockets run; ET means we must
	// come back for the rest, so re-post ourselves when the batch is full.
	for i := 0; i < 64; i++ {
		nfd, sa, err := unix.Accept4(ln.fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch {
		case err == nil:
		case errAgain(err):
			return
		case err == unix.EINTR || err == unix.ECONNABORTED:
			continue
		default:
			// Out of descriptors (EMFILE, ENFILE) or memory: the edge is
			// spent, so come back shortly rather than spin or stall.
			time.AfterFunc(10*time.Millisecond, func() { ln.l.post(ln.retryAccept) })
			return
		}
		client := fromSockaddr(sa)
		target := ln.e.pick()
		if target == ln.l {
			ln.l.startConn(nfd, client, ln.t)
		} else {
			target.post(func() { target.startConn(nfd, client, ln.t) })
		}
	}
	ln.l.post(ln.retryAccept)
}

func (ln *elTCPListener) retryAccept() {
	if r, ok := ln.l.regs[int32(ln.fd)]; ok && r.h == handler(ln) {
		ln.event(unix.EPOLLIN)
	}
}

// side is one socket of a proxied connection.
type side struct {
	fd       int
	readable bool
	writable bool
}

// pipe is one direction: bytes read from src wait in buf[r:w] for dst.
type pipe struct {
	src, dst *side
	buf      []byte
	r, w     int
	eof      bool // src sent FIN
	shut     bool // FIN passed on to dst
	bytes    uint64

	// Splice-auto, as HAProxy does it: a read that fills the whole buffer
	// marks the direction as bulk, and once its buffer has drained the bytes
	// go src -> kernel pipe -> dst with splice(2), never copied through user
	// space. Small request/response traffic keeps the cheaper plain copy.
	bulk    bool
	spliced bool
	kpipe   [2]int // read end, write end
	inPipe  int    // bytes waiting in the kernel pipe
}

// pending reports bytes read from src and not yet written to dst.
func (p *pipe) pending() bool { return p.r < p.w || p.inPipe > 0 }

type tcpConn struct {
	l      *loop
	t      *Target
	client netip.AddrPort
	cs, bs side
	up     pipe // client -> backend
	down   pipe // backend -> client

	// connect state
	walk       *lb.Walk
	ep         netip.AddrPort
	started    time.Time
	attempt    uint32
	timer      *time.Timer
	connecting bool
	connected  bool
	closed     bool
	queued     bool
}

type clientHandler struct{ c *tcpConn }
type backendHandler struct{ c *tcpConn }

func (h clientHandler) event(ev uint32) {
	c := h.c
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.cs.readable = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.cs.writable = true
	}
	if c.connected {
		c.progress()
	}
}

func (h backendHandler) event(ev uint32) {
	c := h.c
	if c.connecting {
		if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
			c.finishConnect()
		}
		return
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.bs.readable = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		c.bs.writable = true
	}
	c.progress()
}

func (l *loop) startConn(fd int, client netip.AddrPort, t *Target) {
	ctr := t.counters()
	ctr.Opened()
	e := l.e
	e.mu.Lock()
	closing := e.closing
	if !closing {
		e.active.Add(1)
	}
	e.mu.Unlock()
	if closing {
		resetClose(fd)
		return
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	c := &tcpConn{l: l, t: t, client: client, cs: side{fd: fd}, bs: side{fd: -1}, started: l.now}
	c.up = pipe{src: &c.cs, dst: &c.bs}
	c.down = pipe{src: &c.bs, dst: &c.cs}
	order, err := t.order(client.Addr())
	if err != nil {
		ctr.Refused()
		resetClose(fd)
		e.active.Done()
		return
	}
	if err := l.register(fd, clientHandler{c}); err != nil {
		resetClose(fd)
		e.active.Done()
		return
	}
	l.conns[c] = struct{}{}
	c.walk = t.Retry.Walk(order, c.started)
	c.tryNext()
}

// resetClose closes with SO_LINGER 0, which sends RST: the client sees
// ECONNRESET at once instead of hanging.
func resetClose(fd int) {
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(fd)
}

// tryNext starts a non-blocking connect to the next endpoint of the walk.
func (c *tcpConn) tryNext() {
	l := c.l
	for {
		ep, timeout, ok := c.walk.Next(l.e.opts.Now())
		if !ok {
			c.t.counters().Refused()
			c.abort()
			return
		}
		sa, family := toSockaddr(ep)
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			c.t.counters().Refused()
			c.abort()
			return
		}
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		err = unix.Connect(fd, sa)
		if err != nil && err != unix.EINPROGRESS {
			unix.Close(fd)
			c.failed(ep)
			continue
		}
		c.ep = ep
		c.bs = side{fd: fd}
		c.connecting = true
		c.attempt++
		if err := l.register(fd, backendHandler{c}); err != nil {
			unix.Close(fd)
			c.bs.fd = -1
			c.connecting = false
			c.failed(ep)
			continue
		}
		attempt := c.attempt
		c.timer = time.AfterFunc(timeout, func() {
			l.post(func() {
				if c.connecting && c.attempt == attempt && !c.closed {
					c.connectFailed()
				}
			})
		})
		return
	}
}

func (c *tcpConn) failed(ep netip.AddrPort) {
	c.t.Picker.Failed(c.client.Addr(), ep)
	c.t.counters().ConnectFailed()
}

func (c *tcpConn) connectFailed() {
	c.connecting = false
	c.stopTimer()
	c.l.closeFD(c.bs.fd)
	c.bs.fd = -1
	c.failed(c.ep)
	c.tryNext()
}

func (c *tcpConn) stopTimer() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

func (c *tcpConn) finishConnect() {
	soerr, err := unix.GetsockoptInt(c.bs.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil || soerr != 0 {
		c.connectFailed()
		return
	}
	// A spurious wake-up before the handshake finished: still connecting.
	if _, err := unix.Getpeername(c.bs.fd); err != nil {
		return
	}
	c.connecting = false
	c.connected = true
	c.stopTimer()
	c.bs.writable = true
	c.bs.readable = true // drain anything that arrived with the handshake
	c.t.Picker.Connected(c.client.Addr(), c.ep)
	c.t.counters().Connected(c.l.e.opts.Now().Sub(c.started), c.walk.Tries())
	c.progress()
}

// maxRounds bounds the work one connection does per wake-up, so a bulk
// transfer cannot starve the other sockets of its loop.
const maxRounds = 16

// progress moves bytes until nothing can move, or yields after maxRounds.
func (c *tcpConn) progress() {
	if c.closed || !c.connected {
		return
	}
	for round := 0; round < maxRounds; round++ {
		moved := false
		for _, p := range [2]*pipe{&c.up, &c.down} {
			m, ok := c.step(p)
			if !ok {
				c.abort()
				return
			}
			moved = moved || m
		}
		if c.up.shut && c.down.shut {
			c.close()
			return
		}
		if !moved {
			return
		}
	}
	if !c.queued {
		c.queued = true
		c.l.later = append(c.l.later, c)
	}
}

// step advances one direction. It returns whether anything happened, and
// false in ok when the connection must be reset.
func (c *tcpConn) step(p *pipe) (moved, ok bool) {
	if p.spliced {
		moved, ok = c.spliceStep(p)
	} else {
		moved, ok = c.copyStep(p)
	}
	if !ok {
		return moved, false
	}
	// Pass a FIN on once everything before it has been written.
	if p.eof && !p.pending() && !p.shut {
		if err := unix.Shutdown(p.dst.fd, unix.SHUT_WR); err != nil && err != unix.ENOTCONN {
			return moved, false
		}
		p.shut = true
		moved = true
	}
	return moved, true
}

// copyStep moves bytes through a user-space buffer.
func (c *tcpConn) copyStep(p *pipe) (moved, ok bool) {
	// Flush what is waiting.
	if p.r < p.w && p.dst.writable {
		n, err := unix.Write(p.dst.fd, p.buf[p.r:p.w])
		switch {
		case errAgain(err):
			p.dst.writable = false
		case err != nil:
			return false, false
		default:
			p.r += n
			p.bytes += uint64(n)
			moved = true
		}
	}
	if p.buf != nil && p.r == p.w {
		c.l.putBuf(p.buf)
		p.buf, p.r, p.w = nil, 0, 0
		if p.bulk && c.startSplice(p) {
			return true, true
		}
	}
	// Read only when the buffer is empty: a slow dst pauses src.
	if p.buf == nil && !p.eof && p.src.readable {
		buf := c.l.getBuf()
		n, err := unix.Read(p.src.fd, buf)
		switch {
		case errAgain(err):
			p.src.readable = false
			c.l.putBuf(buf)
		case err != nil:
			c.l.putBuf(buf)
			return moved, false
		case n == 0:
			p.eof = true
			c.l.putBuf(buf)
			moved = true
		default:
			p.buf, p.r, p.w = buf, 0, n
			p.bulk = n == len(buf)
			moved = true
		}
	}
	return moved, true
}

// startSplice switches a drained bulk direction to splice(2). If no pipe can
// be had (descriptor limits), the direction keeps copying.
func (c *tcpConn) startSplice(p *pipe) bool {
	if err := unix.Pipe2(p.kpipe[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		p.bulk = false
		return false
	}
	p.spliced = true
	return true
}

const spliceFlags = unix.SPLICE_F_NONBLOCK | unix.SPLICE_F_MOVE

// spliceStep moves bytes src -> kernel pipe -> dst. As with the buffer, src
// is read only when the pipe is empty, so a slow dst pauses src and the pipe
// (64 KiB) bounds what one direction holds.
func (c *tcpConn) spliceStep(p *pipe) (moved, ok bool) {
	if p.inPipe > 0 && p.dst.writable {
		n, err := unix.Splice(p.kpipe[0], nil, p.dst.fd, nil, p.inPipe, spliceFlags)
		switch {
		case errAgain(err):
			p.dst.writable = false
		case err != nil:
			return false, false
		default:
			p.inPipe -= int(n)
			p.bytes += uint64(n)
			moved = true
		}
	}
	if p.inPipe == 0 && !p.eof && p.src.readable {
		// The pipe is empty, so EAGAIN can only mean src has nothing.
		n, err := unix.Splice(p.src.fd, nil, p.kpipe[1], nil, c.l.e.opts.BufferSize, spliceFlags)
		switch {
		case errAgain(err):
			p.src.readable = false
		case err != nil:
			return moved, false
		case n == 0:
			p.eof = true
			moved = true
		default:
			p.inPipe = int(n)
			moved = true
		}
	}
	return moved, true
}

func (c *tcpConn) release() {
	for _, p := range [2]*pipe{&c.up, &c.down} {
		if p.buf != nil {
			c.l.putBuf(p.buf)
			p.buf = nil
		}
		if p.spliced {
			unix.Close(p.kpipe[0])
			unix.Close(p.kpipe[1])
			p.spliced = false
		}
	}
	c.stopTimer()
	delete(c.l.conns, c)
	c.t.counters().Closed(c.up.bytes, c.down.bytes)
	c.l.e.active.Done()
}

func (c *tcpConn) close() {
	if c.closed {
		return
	}
	c.closed = true
	c.l.closeFD(c.cs.fd)
	if c.bs.fd >= 0 {
		c.l.closeFD(c.bs.fd)
	}
	c.release()
}

// abort resets both sides, passing an RST on in each direction.
func (c *tcpConn) abort() {
	if c.closed {
		return
	}
	c.closed = true
	delete(c.l.regs, int32(c.cs.fd))
	resetClose(c.cs.fd)
	if c.bs.fd >= 0 {
		delete(c.l.regs, int32(c.bs.fd))
		resetClose(c.bs.fd)
	}
	c.release()
}
