package listeners

import (
	"context"
	"fmt"
	"github.com/sluice-proxy/sluice/lb"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ishidawataru/sctp"
	"golang.org/x/sys/unix"
)

// SCTPSupported reports why this kernel cannot serve SCTP, or nil.
func SCTPSupported() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("the kernel has no SCTP (socket: %w; load the sctp module)", err)
	}
	unix.Close(fd)
	return nil
}

// sctpClose shuts a socket down before closing it: the library's calls
// block in the kernel rather than in Go's poller, and on Linux only
// shutdown(2) wakes a thread blocked in accept or read on that socket.
func sctpClose(c any) error {
	if sc, ok := c.(interface {
		SyscallConn() (syscall.RawConn, error)
	}); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
		}
	}
	if cl, ok := c.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// sctpNetwork pins the socket family to the address's: the library would
// otherwise pick from the address's length and the host's IPv6 support.
func sctpNetwork(a netip.Addr) string {
	if a.Is4() {
		return "sctp4"
	}
	return "sctp6"
}

// SCTPDialFunc connects to an SCTP endpoint within timeout.
type SCTPDialFunc func(ep netip.AddrPort, timeout time.Duration) (net.Conn, error)

// DialSCTP is the real SCTPDialFunc. It connects a one-to-one SCTP socket
// itself, non-blocking through Go's poller, so the try's timeout is a real
// deadline and a signal during connect(2) cannot turn into EISCONN (the
// library's blocking connect retries after EINTR); the connected socket is
// then handed to the library in blocking mode.
func DialSCTP(ep netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	family, sa := unix.AF_INET, unix.Sockaddr(nil)
	if ep.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(ep.Port()), Addr: ep.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ep.Port()), Addr: ep.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", ep, err)
	}
	f := os.NewFile(uintptr(fd), "sctp-connect") // polls fd until connected
	if err := unix.Connect(fd, sa); err != nil && err != unix.EINPROGRESS {
		f.Close()
		return nil, fmt.Errorf("connect to %s: %w", ep, err)
	}
	f.SetWriteDeadline(time.Now().Add(timeout))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	var soErr int
	waited := false
	werr := rc.Write(func(fd uintptr) bool {
		if !waited { // wait for writability: the connect has ended
			waited = true
			return false
		}
		soErr, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		return true
	})
	if werr != nil {
		f.Close()
		return nil, fmt.Errorf("connect to %s: timed out after %s", ep, timeout)
	}
	if err == nil && soErr != 0 {
		err = unix.Errno(soErr)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("connect to %s: %w", ep, err)
	}
	// Hand a blocking duplicate to the library (it reads and writes with
	// plain syscalls) and let the poller's copy go.
	nfd, err := unix.Dup(fd)
	f.Close()
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(nfd)
	if err := unix.SetNonblock(nfd, false); err != nil {
		unix.Close(nfd)
		return nil, err
	}
	return sctp.NewSCTPConn(nfd, nil), nil
}

// SCTP serves SCTP service ports: gnet and the event loop have no SCTP, so
// it is a goroutine per association, with the same picker, affinity, retry
// and ejection as TCP. SCTP has no half-close: when one side ends, both are
// closed.
type SCTP struct {
	opts Options
	dial SCTPDialFunc

	mu        sync.Mutex
	listeners map[*sctpListener]struct{}
	conns     map[io.Closer]struct{}
	closing   bool
	wg        sync.WaitGroup
	loops     sync.WaitGroup
}

// NewSCTP returns an SCTP engine; dial nil means DialSCTP.
func NewSCTP(opts Options, dial SCTPDialFunc) *SCTP {
	if dial == nil {
		dial = DialSCTP
	}
	return &SCTP{opts: opts.withDefaults(), dial: dial, listeners: map[*sctpListener]struct{}{}, conns: map[io.Closer]struct{}{}}
}

// sctpListener accepts through Go's poller: the library's Accept is a
// blocking accept(2) that neither close(2) nor shutdown(2) wakes, so the
// listening socket is made non-blocking and owned by an *os.File whose
// Close does wake the accept loop.
type sctpListener struct {
	s    *SCTP
	f    *os.File
	fd   int
	addr netip.AddrPort
	t    *Target
	once sync.Once
}

// Listen opens an SCTP listener on addr.
func (s *SCTP) Listen(addr netip.AddrPort, t *Target) (Listener, error) {
	socks := s.opts.sockets()
	fd, bound := -1, addr
	if fds := socks.Take("sctp", addr); len(fds) > 0 { // a predecessor's (hitless restart)
		fd = fds[0]
		for _, extra := range fds[1:] {
			unix.Close(extra)
		}
		unix.CloseOnExec(fd)
	} else {
		ln, err := sctp.ListenSCTP(sctpNetwork(addr.Addr()), &sctp.SCTPAddr{IPAddrs: []net.IPAddr{{IP: addr.Addr().AsSlice()}}, Port: int(addr.Port())})
		if err != nil {
			return nil, err
		}
		if a, ok := ln.Addr().(*sctp.SCTPAddr); ok {
			bound = netip.AddrPortFrom(addr.Addr(), uint16(a.Port))
		}
		rc, err := ln.SyscallConn()
		if err != nil {
			ln.Close()
			return nil, err
		}
		rc.Control(func(f uintptr) { fd = int(f) })
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// Owned by the *os.File from here on (never the library's Close: its
	// shutdown(2) would end the socket for a successor holding it too).
	f := os.NewFile(uintptr(fd), "sctp-listener "+bound.String())
	l := &sctpListener{s: s, f: f, fd: fd, addr: bound, t: t}
	socks.Hold("sctp", bound, fd)
	s.mu.Lock()
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	s.loops.Add(1)
	go l.serve()
	return l, nil
}

func (l *sctpListener) Addr() netip.AddrPort { return l.addr }

func (l *sctpListener) Close() error {
	var err error
	l.once.Do(func() {
		l.s.mu.Lock()
		delete(l.s.listeners, l)
		l.s.mu.Unlock()
		l.s.opts.sockets().Release(l.fd)
		err = l.f.Close()
	})
	return err
}

func (l *sctpListener) serve() {
	defer l.s.loops.Done()
	rc, err := l.f.SyscallConn()
	if err != nil {
		return
	}
	var backoff time.Duration
	for {
		var nfd int
		var aerr error
		if err := rc.Read(func(fd uintptr) bool {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC)
			return aerr != unix.EAGAIN
		}); err != nil {
			return // closed
		}
		if aerr != nil {
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		c := sctp.NewSCTPConn(nfd, nil)
		l.s.mu.Lock()
		if l.s.closing {
			l.s.mu.Unlock()
			c.Close()
			continue
		}
		l.s.conns[c] = struct{}{}
		l.s.wg.Add(1)
		l.s.mu.Unlock()
		go l.handle(c)
	}
}

func (l *sctpListener) handle(client net.Conn) {
	defer func() {
		l.s.mu.Lock()
		delete(l.s.conns, client)
		l.s.mu.Unlock()
		l.s.wg.Done()
	}()
	t, ctr := l.t, l.t.counters()
	ctr.Opened()
	var up, down int64
	defer func() { ctr.Closed(uint64(up), uint64(down)) }() // refusals too
	var src netip.Addr
	if a, ok := client.RemoteAddr().(*sctp.SCTPAddr); ok && a != nil && len(a.IPAddrs) > 0 {
		src, _ = netip.AddrFromSlice(a.IPAddrs[0].IP)
		src = src.Unmap()
	}
	start := l.s.opts.Now()
	walk := new(lb.Walk)
	if err := t.startWalk(walk, src, start); err != nil {
		ctr.Refused()
		client.Close()
		return
	}
	var backend net.Conn
	for backend == nil {
		ep, timeout, ok := walk.Next(l.s.opts.Now())
		if !ok {
			ctr.Refused()
			client.Close()
			return
		}
		c, err := l.s.dial(ep, timeout)
		if err != nil {
			t.Picker.Failed(src, ep)
			ctr.ConnectFailed()
			continue
		}
		backend = c
		t.Picker.Connected(src, ep)
		ctr.Connected(l.s.opts.Now().Sub(start), walk.Tries())
	}
	l.s.mu.Lock()
	l.s.conns[backend] = struct{}{}
	l.s.mu.Unlock()
	defer func() {
		l.s.mu.Lock()
		delete(l.s.conns, backend)
		l.s.mu.Unlock()
	}()
	var wg sync.WaitGroup
	var once sync.Once
	closeBoth := func() { once.Do(func() { sctpClose(client); sctpClose(backend) }) }
	wg.Add(2)
	go func() { defer wg.Done(); up, _ = io.Copy(backend, client); closeBoth() }()
	go func() { defer wg.Done(); down, _ = io.Copy(client, backend); closeBoth() }()
	wg.Wait()
}

// Shutdown closes the listeners and waits for associations until ctx
// ends, then closes what is left.
func (s *SCTP) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	var ls []*sctpListener
	for l := range s.listeners {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	// The listeners close and their loops end first: an association
	// accepted before that is served, not closed unanswered.
	for _, l := range ls {
		l.Close()
	}
	s.loops.Wait()
	s.mu.Lock()
	s.closing = true
	ls = ls[:0]
	for l := range s.listeners {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	s.loops.Wait()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	for c := range s.conns {
		sctpClose(c)
	}
	s.mu.Unlock()
	<-done
	return ctx.Err()
}
