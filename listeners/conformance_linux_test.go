//go:build linux

package listeners

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/affinity"
	"github.com/sluice-proxy/sluice/lb"
)

// The conformance suite: every engine must pass all of it.

var engineNames = []string{EngineEventLoop, EngineGoroutine}

func forEachEngine(t *testing.T, fn func(t *testing.T, e Engine)) {
	forEachEngineWith(t, nil, fn)
}

// forEachEngineWith is forEachEngine with options adjusted by set.
func forEachEngineWith(t *testing.T, set func(engine string, o *Options), fn func(t *testing.T, e Engine)) {
	type variant struct {
		name, engine string
		opts         Options
	}
	var variants []variant
	for _, name := range engineNames {
		variants = append(variants, variant{name, name, Options{Loops: 2}})
	}
	// The event loop with --busy-poll must meet the same bar.
	variants = append(variants, variant{"eventloop-busypoll", EngineEventLoop, Options{Loops: 2, BusyPoll: 200 * time.Microsecond}},
		// And with a syscall per recv and send, as on a kernel without
		// io_uring (the plain "eventloop" batches them on a ring).
		variant{"eventloop-no-io-uring", EngineEventLoop, Options{Loops: 2, NoIOUring: true}})
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			if set != nil {
				set(v.engine, &v.opts)
			}
			e, err := New(v.engine, v.opts)
			if err != nil {
				t.Fatal(err)
			}
			if el, ok := e.(*EventLoop); ok && !v.opts.NoIOUring && el.IOUring() != nil {
				t.Fatalf("the event loop was meant to batch on io_uring: %v", el.IOUring())
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := e.Shutdown(ctx); err != nil {
					t.Errorf("shutdown: %v", err)
				}
			})
			fn(t, e)
		})
	}
}

type counters struct {
	opened, connected, failed, refused atomic.Int64
	closed                             chan [2]uint64
}

func newCounters() *counters                     { return &counters{closed: make(chan [2]uint64, 1024)} }
func (c *counters) Opened()                      { c.opened.Add(1) }
func (c *counters) Connected(time.Duration, int) { c.connected.Add(1) }
func (c *counters) ConnectFailed()               { c.failed.Add(1) }
func (c *counters) Refused()                     { c.refused.Add(1) }
func (c *counters) Closed(up, down uint64)       { c.closed <- [2]uint64{up, down} }

type fixture struct {
	t      *testing.T
	e      Engine
	clock  *affinity.ManualClock
	ctr    *counters
	target *Target
	ln     Listener
}

func newFixture(t *testing.T, e Engine, proto lb.Protocol, backends ...netip.AddrPort) *fixture {
	t.Helper()
	clk := affinity.NewManualClock(time.Unix(1e9, 0))
	f := &fixture{t: t, e: e, clock: clk, ctr: newCounters()}
	f.target = &Target{
		Picker:     lb.NewPicker(clk, lb.EjectionPolicy{Failures: 2, Backoff: time.Minute, MaxBackoff: time.Hour}),
		Retry:      &lb.RetryPolicy{Attempts: 4, TryTimeouts: []time.Duration{300 * time.Millisecond}, Budget: 5 * time.Second},
		UDPTimeout: 100 * time.Millisecond,
		Counters:   f.ctr,
	}
	f.target.Picker.SetEndpoints(backends)
	ln, err := e.Listen(proto, netip.MustParseAddrPort("127.0.0.1:0"), f.target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f.ln = ln
	return f
}

func (f *fixture) dial() *net.TCPConn {
	f.t.Helper()
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(f.ln.Addr()))
	if err != nil {
		f.t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a safety net, never a synchronisation
	return c
}

// serveTCP runs handle for every connection to a fresh loopback listener.
func serveTCP(t *testing.T, handle func(*net.TCPConn)) netip.AddrPort {
	t.Helper()
	return serveTCPAt(t, net.IPv4(127, 0, 0, 1), handle)
}

// serveTCPAt is serveTCP on a chosen loopback address (IPv4 or IPv6).
func serveTCPAt(t *testing.T, ip net.IP, handle func(*net.TCPConn)) netip.AddrPort {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); handle(c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func echoHandler(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// bufferedEchoHandler is echoHandler without splice(2) (and so without
// pipes of its own).
func bufferedEchoHandler(c *net.TCPConn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			c.CloseWrite()
			return
		}
	}
}

func nameHandler(name string) func(*net.TCPConn) {
	return func(c *net.TCPConn) { c.Write([]byte(name)) }
}

// refusingAddr is a loopback port with nothing listening.
func refusingAddr(t *testing.T) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}

// blackholeAddr is a loopback listener whose accept queue is full, so the
// kernel drops every further SYN: a connect to it hangs until it times out,
// like a dead pod behind a firewall. Nothing outside loopback is touched.
func blackholeAddr(t *testing.T) netip.AddrPort {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(sa.(*unix.SockaddrInet4).Port))
	// Fill the queue, then prove that a further connect really hangs.
	for i := 0; i < 2; i++ {
		c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	if c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("black hole accepted a connection; the test cannot prove anything")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("black hole did not time out: %v", err)
	}
	return addr
}

func echoOnce(t *testing.T, c *net.TCPConn, payload []byte) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { _, err := c.Write(payload); errc <- err }()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("echo differs from what was sent")
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestConformanceEcho(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, serveTCP(t, echoHandler))
		c := f.dial()
		defer c.Close()
		echoOnce(t, c, []byte("hello"))
		echoOnce(t, c, randomBytes(4<<20))
		c.CloseWrite()
		if n, err := io.Copy(io.Discard, c); err != nil || n != 0 {
			t.Fatalf("after half-close: %d bytes, %v; want clean EOF", n, err)
		}
		got := <-f.ctr.closed
		if got[0] != 5+4<<20 || got[1] != 5+4<<20 {
			t.Fatalf("byte counters %v", got)
		}
	})
}

func TestConformanceManyConcurrentConnections(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, serveTCP(t, echoHandler), serveTCP(t, echoHandler))
		const n = 200
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.DialTimeout("tcp", f.ln.Addr().String(), 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				msg := randomBytes(16 << 10)
				go c.Write(msg)
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(c, got); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, msg) {
					errs <- errors.New("corrupted echo")
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if got := f.ctr.connected.Load(); got != n {
			t.Fatalf("connected %d, want %d", got, n)
		}
	})
}

func TestConformanceHalfClose(t *testing.T) {
	reply := randomBytes(2 << 20)
	backend := func(c *net.TCPConn) {
		n, _ := io.Copy(io.Discard, c) // read the whole request up to the client's FIN
		fmt.Fprintf(c, "%08d", n)
		c.Write(reply)
		c.CloseWrite()
	}
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, serveTCP(t, backend))
		c := f.dial()
		defer c.Close()
		req := randomBytes(300 << 10)
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("reading the reply after shutdown(SHUT_WR): %v", err)
		}
		if want := fmt.Sprintf("%08d", len(req)); len(got) < 8 || string(got[:8]) != want {
			t.Fatalf("backend saw %q bytes, want %s", got[:min(8, len(got))], want)
		}
		if !bytes.Equal(got[8:], reply) {
			t.Fatalf("reply truncated: %d of %d bytes", len(got)-8, len(reply))
		}
	})
}

// silentBackend reads each request to the client's FIN (then eof gets a
// value), and neither answers nor closes until the test ends; saw gets the
// error that ended its socket (a reset shows as POLLHUP with SO_ERROR).
type silentBackend struct {
	addr netip.AddrPort
	eof  chan struct{}
	saw  chan error
}

func newSilentBackend(t *testing.T) *silentBackend {
	b := &silentBackend{eof: make(chan struct{}, 16), saw: make(chan error, 16)}
	release := make(chan struct{})
	defer t.Cleanup(func() { close(release) }) // registered after serveTCP's, so it runs before it
	b.addr = serveTCP(t, func(c *net.TCPConn) {
		defer c.Close()
		io.Copy(io.Discard, c)
		b.eof <- struct{}{}
		raw, err := c.SyscallConn()
		if err != nil {
			b.saw <- err
			return
		}
		raw.Control(func(fd uintptr) {
			// Events 0: only POLLHUP and POLLERR, which a FIN from the
			// proxy does not raise (this side never shut its writes) and
			// a reset does. The 100 ms poll only lets the test's end in.
			pfd := []unix.PollFd{{Fd: int32(fd)}}
			for {
				select {
				case <-release:
					return
				default:
				}
				if n, _ := unix.Poll(pfd, 100); n > 0 {
					soerr, _ := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
					b.saw <- syscall.Errno(soerr)
					return
				}
			}
		})
	})
	return b
}

// isReset: a reset met after the peer's FIN is reported as EPIPE.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// ended waits for what the backend's socket met, with a safety net.
func (b *silentBackend) ended(t *testing.T) error {
	t.Helper()
	select {
	case err := <-b.saw:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the backend's socket was neither reset nor closed in 20 s")
		return nil
	}
}

// A client that sent its request and closed, facing a backend that never
// answers nor closes, is not held forever (issue 19, item 6): after
// HalfCloseTimeout of silence both sides are reset.
func TestConformanceHalfClosedToASilentBackendEnds(t *testing.T) {
	forEachEngineWith(t, func(_ string, o *Options) { o.HalfCloseTimeout = 300 * time.Millisecond }, func(t *testing.T, e Engine) {
		b := newSilentBackend(t)
		f := newFixture(t, e, lb.TCP, b.addr)
		c := f.dial()
		defer c.Close()
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		c.CloseWrite()
		_, err := io.ReadAll(c)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client: %v, want a reset once the half-closed connection was idle", err)
		}
		if err := b.ended(t); !isReset(err) {
			t.Fatalf("backend: %v, want a reset", err)
		}
		if got := <-f.ctr.closed; got[0] != uint64(len("request")) {
			t.Fatalf("closed with %d bytes up, want %d", got[0], len("request"))
		}
	})
}

// The half-close timeout is for silence, not for length: a backend that
// keeps streaming its answer after the client's FIN, for longer than the
// timeout in all, is never cut; nor is a connection that idles with both
// directions open.
func TestConformanceHalfClosedButMovingIsNotCut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	backend := func(c *net.TCPConn) {
		io.Copy(io.Discard, c)
		for i := 0; i < 10; i++ { // 1 s in all, a byte every 100 ms
			time.Sleep(timeout / 3)
			if _, err := c.Write([]byte{'0' + byte(i)}); err != nil {
				return
			}
		}
		c.CloseWrite()
	}
	forEachEngineWith(t, func(_ string, o *Options) { o.HalfCloseTimeout = timeout }, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, serveTCP(t, backend))
		c := f.dial()
		defer c.Close()
		c.Write([]byte("request"))
		c.CloseWrite()
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "0123456789" {
			t.Fatalf("streamed answer after the client's FIN: %q, %v; want all ten bytes and a clean end", got, err)
		}
		// Both directions open and idle for three timeouts: still alive.
		c2 := newFixture(t, e, lb.TCP, serveTCP(t, echoHandler)).dial()
		defer c2.Close()
		echoOnce(t, c2, []byte("first"))
		time.Sleep(3 * timeout) // the time that must pass without a cut
		echoOnce(t, c2, []byte("after an idle spell"))
	})
}

// A drain ends by its deadline whatever the backends do (issue 19, item
// 5): here the client has sent its request and closed, and the backend
// stays silent; the goroutine engine used to wait on it forever.
func TestConformanceShutdownCutsASilentBackendAtTheDeadline(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		b := newSilentBackend(t)
		f := newFixture(t, e, lb.TCP, b.addr)
		c := f.dial()
		defer c.Close()
		c.Write([]byte("request"))
		c.CloseWrite()
		<-b.eof // the backend has the request and its FIN before the drain starts
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- e.Shutdown(ctx) }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("shutdown: %v, want the deadline (connections cut)", err)
			}
		case <-time.After(20 * time.Second): // a safety net
			t.Fatal("shutdown still waiting 20 s after a 200 ms drain deadline")
		}
		if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client after the cut: %v, want a reset", err)
		}
		if err := b.ended(t); !isReset(err) {
			t.Fatalf("backend after the cut: %v, want a reset", err)
		}
	})
}

// pushUntilStalled writes up to offered bytes and returns how many went out
// before a write made no progress for a second, i.e. the pipeline was full.
// The deadline measures that moment; nothing waits on it.
func pushUntilStalled(c *net.TCPConn, offered int64) int64 {
	chunk := make([]byte, 64<<10)
	var n int64
	for n < offered {
		c.SetWriteDeadline(time.Now().Add(time.Second))
		m, err := c.Write(chunk)
		n += int64(m)
		if err != nil {
			break
		}
	}
	return n
}

func TestConformanceSlowReaderKeepsMemoryBounded(t *testing.T) {
	const offered = 256 << 20
	const bound = 32 << 20 // kernel socket buffers on both hops plus the proxy's own
	forEachEngine(t, func(t *testing.T, e Engine) {
		written := make(chan int64, 1)
		backend := serveTCP(t, func(c *net.TCPConn) {
			c.SetWriteBuffer(64 << 10)
			written <- pushUntilStalled(c, offered)
			c.SetWriteDeadline(time.Time{})
			c.CloseWrite()
			io.Copy(io.Discard, c)
		})
		f := newFixture(t, e, lb.TCP, backend)
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10) })
		}}
		c, err := d.Dial("tcp", f.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		n := <-written // the client has read nothing so far
		t.Logf("backend pushed %d KiB before the pipeline filled", n>>10)
		if n >= bound {
			t.Fatalf("a client that reads nothing let the backend push %d MiB through the proxy; want < %d MiB", n>>20, bound>>20)
		}
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.Copy(io.Discard, c)
		if err != nil || got != n {
			t.Fatalf("client read %d bytes (%v), backend wrote %d", got, err, n)
		}
	})
}

func TestConformanceRefusesAtOnceWithNoEndpoints(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP)
		// The reset can race the end of the client's connect, so it may show
		// up on the dial or on the first read; both are an immediate refusal.
		c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(f.ln.Addr()))
		if err == nil {
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			_, err = c.Read(make([]byte, 1))
		}
		if err == nil {
			t.Fatal("read data from a service with no endpoints")
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("client left hanging")
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("got %v, want connection reset", err)
		}
		if f.ctr.refused.Load() != 1 {
			t.Fatalf("refused counter = %d", f.ctr.refused.Load())
		}
	})
}

// Every connection counted as opened is counted as closed once, refused
// ones included, so the active-connections gauge (opened minus closed)
// falls back to zero (issue 19, item 8: it counted 695 with nothing open).
func TestConformanceEveryOpenedConnectionIsClosedOnce(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP)
		refusedRead := func() {
			t.Helper()
			c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(f.ln.Addr()))
			if err == nil {
				c.SetDeadline(time.Now().Add(20 * time.Second))
				_, err = c.Read(make([]byte, 1))
				c.Close()
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("got %v, want a reset", err)
			}
		}
		refusedRead() // no endpoints
		f.target.Picker.SetEndpoints([]netip.AddrPort{refusingAddr(t)})
		refusedRead() // every try refused
		f.target.Picker.SetEndpoints([]netip.AddrPort{serveTCP(t, echoHandler)})
		c := f.dial()
		echoOnce(t, c, []byte("hello"))
		c.Close()
		var closed [][2]uint64
		for len(closed) < 3 {
			select {
			case v := <-f.ctr.closed:
				closed = append(closed, v)
			case <-time.After(20 * time.Second): // a safety net
				t.Fatalf("closed %v after 3 connections opened (%d counted)", closed, f.ctr.opened.Load())
			}
		}
		if n := f.ctr.opened.Load(); n != 3 {
			t.Fatalf("opened %d, want 3", n)
		}
		select {
		case v := <-f.ctr.closed:
			t.Fatalf("a fourth Closed %v for three connections", v)
		default:
		}
		zero := 0
		for _, v := range closed {
			if v == [2]uint64{} {
				zero++
			}
		}
		if zero != 2 {
			t.Fatalf("closed %v, want the two refusals with no bytes", closed)
		}
	})
}

func testRetryPast(t *testing.T, bad func(*testing.T) netip.AddrPort) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, bad(t), serveTCP(t, echoHandler))
		for i := 0; i < 10; i++ {
			c := f.dial()
			echoOnce(t, c, []byte(fmt.Sprint("try ", i)))
			c.Close()
		}
		// Round robin puts the bad endpoint first on every other connection:
		// it costs two failures, then passive ejection skips it.
		if got := f.ctr.failed.Load(); got != 2 {
			t.Fatalf("connect failures = %d, want 2 (then ejected)", got)
		}
		if f.ctr.refused.Load() != 0 {
			t.Fatal("a client was refused although a good endpoint existed")
		}
	})
}

func TestConformanceRetryPastRefusingEndpoint(t *testing.T)   { testRetryPast(t, refusingAddr) }
func TestConformanceRetryPastBlackholedEndpoint(t *testing.T) { testRetryPast(t, blackholeAddr) }

func readName(t *testing.T, f *fixture, from string) string {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConformanceAffinityPinAndExpiry(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, serveTCP(t, nameHandler("a")), serveTCP(t, nameHandler("b")), serveTCP(t, nameHandler("c")))
		// Without affinity: strict rotation.
		var seq []string
		for i := 0; i < 3; i++ {
			seq = append(seq, readName(t, f, "127.0.0.1"))
		}
		if seq[0] == seq[1] || seq[1] == seq[2] || seq[0] == seq[2] {
			t.Fatalf("no rotation without affinity: %v", seq)
		}
		f.target.Picker.SetAffinity(lb.Affinity{ClientIP: true, Timeout: time.Minute})
		pinned := readName(t, f, "127.0.0.1")
		for i := 0; i < 5; i++ {
			if got := readName(t, f, "127.0.0.1"); got != pinned {
				t.Fatalf("client moved from %s to %s under affinity", pinned, got)
			}
		}
		other := readName(t, f, "127.0.0.2")
		if other == pinned {
			t.Fatalf("second client got the first client's endpoint %s", other)
		}
		f.clock.Step(2 * time.Minute)
		if got := readName(t, f, "127.0.0.1"); got == pinned {
			t.Fatalf("pin to %s survived its timeout", pinned)
		}
	})
}

func TestConformanceGracefulShutdownDrains(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, serveTCP(t, echoHandler))
		c := f.dial()
		defer c.Close()
		echoOnce(t, c, []byte("before"))
		done := make(chan error, 1)
		go func() { done <- e.Shutdown(context.Background()) }()
		// New connections are refused once the listener is gone.
		for {
			c2, err := net.DialTimeout("tcp", f.ln.Addr().String(), time.Second)
			if err != nil {
				break
			}
			c2.Close()
		}
		echoOnce(t, c, []byte("during drain"))
		select {
		case err := <-done:
			t.Fatalf("shutdown returned (%v) with a connection open", err)
		default:
		}
		c.CloseWrite()
		io.Copy(io.Discard, c)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// ---------------------------------------------------------------- UDP

func serveUDP(t *testing.T, reply func(req []byte) []byte) netip.AddrPort {
	t.Helper()
	return serveUDPAt(t, net.IPv4(127, 0, 0, 1), reply)
}

// serveUDPAt is serveUDP on a chosen loopback address (IPv4 or IPv6).
func serveUDPAt(t *testing.T, ip net.IP, reply func(req []byte) []byte) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort(reply(buf[:n]), from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

func udpEcho(req []byte) []byte               { return append([]byte(nil), req...) }
func udpName(name string) func([]byte) []byte { return func([]byte) []byte { return []byte(name) } }

func udpAsk(t *testing.T, c *net.UDPConn, to netip.AddrPort, msg []byte) ([]byte, netip.AddrPort) {
	t.Helper()
	if _, err := c.WriteToUDPAddrPort(msg, to); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 65536)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no UDP reply: %v", err)
	}
	return buf[:n], from
}

func udpClient(t *testing.T) *net.UDPConn {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConformanceUDPEchoAndLargeDatagrams(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.UDP, serveUDP(t, udpEcho))
		c := udpClient(t)
		for _, size := range []int{1, 1400, 60 << 10, 65507} {
			msg := randomBytes(size)
			got, _ := udpAsk(t, c, f.ln.Addr(), msg)
			if !bytes.Equal(got, msg) {
				t.Fatalf("%d-byte datagram came back as %d bytes", size, len(got))
			}
		}
	})
}

func TestConformanceUDPFlowsPinAndExpire(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.UDP, serveUDP(t, udpName("a")), serveUDP(t, udpName("b")))
		c1, c2 := udpClient(t), udpClient(t)
		first, _ := udpAsk(t, c1, f.ln.Addr(), []byte("x"))
		for i := 0; i < 3; i++ {
			if got, _ := udpAsk(t, c1, f.ln.Addr(), []byte("x")); !bytes.Equal(got, first) {
				t.Fatalf("flow moved from %s to %s", first, got)
			}
		}
		second, _ := udpAsk(t, c2, f.ln.Addr(), []byte("x"))
		if bytes.Equal(first, second) {
			t.Fatalf("two flows went to the same endpoint %s", first)
		}
		// Both flows end after the idle timeout...
		for i := 0; i < 2; i++ {
			select {
			case <-f.ctr.closed:
			case <-time.After(10 * time.Second):
				t.Fatal("idle UDP flow never expired")
			}
		}
		// ...so c1's next datagram starts a new flow on the next endpoint.
		if got, _ := udpAsk(t, c1, f.ln.Addr(), []byte("x")); !bytes.Equal(got, first) {
			// Round robin has advanced by two since c1's first flow: back to "first".
			t.Fatalf("new flow after expiry went to %s, want %s", got, first)
		}
		if f.ctr.opened.Load() != 3 {
			t.Fatalf("opened %d flows, want 3", f.ctr.opened.Load())
		}
	})
}

func TestConformanceUDPReplyComesFromTheAddressTheClientUsed(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		backend := serveUDP(t, udpEcho)
		tg := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: defaultRetry(), UDPTimeout: time.Second}
		tg.Picker.SetEndpoints([]netip.AddrPort{backend})
		ln, err := e.Listen(lb.UDP, netip.MustParseAddrPort("0.0.0.0:0"), tg)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c := udpClient(t)
		to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), ln.Addr().Port())
		got, from := udpAsk(t, c, to, []byte("where from?"))
		if string(got) != "where from?" {
			t.Fatalf("reply %q", got)
		}
		if from != to {
			t.Fatalf("reply came from %s, client sent to %s", from, to)
		}
	})
}

func TestConformanceUDPFlowToRemovedEndpointRepicks(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		a, b := serveUDP(t, udpName("a")), serveUDP(t, udpName("b"))
		f := newFixture(t, e, lb.UDP, a, b)
		c := udpClient(t)
		first, _ := udpAsk(t, c, f.ln.Addr(), []byte("x"))
		keep := b
		if string(first) == "b" {
			keep = a
		}
		f.target.Picker.SetEndpoints([]netip.AddrPort{keep})
		got, _ := udpAsk(t, c, f.ln.Addr(), []byte("x"))
		if bytes.Equal(got, first) {
			t.Fatalf("flow stayed on removed endpoint %s", first)
		}
	})
}

// IPv6: a listener and endpoints on ::1, TCP and UDP, for dual-stack services.
func TestConformanceIPv6(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		tcp6 := serveTCPAt(t, net.IPv6loopback, echoHandler)
		udp6 := serveUDPAt(t, net.IPv6loopback, udpEcho)
		tg := func(ep netip.AddrPort) *Target {
			t := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: defaultRetry(), UDPTimeout: time.Second}
			t.Picker.SetEndpoints([]netip.AddrPort{ep})
			return t
		}
		tl, err := e.Listen(lb.TCP, netip.MustParseAddrPort("[::1]:0"), tg(tcp6))
		if err != nil {
			t.Fatal(err)
		}
		defer tl.Close()
		c, err := net.DialTCP("tcp6", nil, net.TCPAddrFromAddrPort(tl.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		echoOnce(t, c, randomBytes(256<<10))

		ul, err := e.Listen(lb.UDP, netip.MustParseAddrPort("[::]:0"), tg(udp6))
		if err != nil {
			t.Fatal(err)
		}
		defer ul.Close()
		uc, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
		if err != nil {
			t.Fatal(err)
		}
		defer uc.Close()
		to := netip.AddrPortFrom(netip.IPv6Loopback(), ul.Addr().Port())
		got, from := udpAsk(t, uc, to, []byte("v6"))
		if string(got) != "v6" || from != to {
			t.Fatalf("UDP over IPv6: %q from %s", got, from)
		}
	})
}

// A UDP flow waiting for its backend's reply holds no datagram buffer: 300
// open flows cost well under 32 KiB each of heap and stacks (issue 19, item
// 10: the goroutine engine's flows held a 64 KiB buffer each, about 130 KB
// per flow in all).
func TestConformanceWaitingUDPFlowsHoldNoBuffers(t *testing.T) {
	const flows = 300
	forEachEngine(t, func(t *testing.T, e Engine) {
		got := make(chan struct{}, flows)
		backend := serveUDP(t, func([]byte) []byte { got <- struct{}{}; return nil }) // answers with nothing
		tg := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: defaultRetry(), UDPTimeout: time.Minute}
		tg.Picker.SetEndpoints([]netip.AddrPort{backend})
		ln, err := e.Listen(lb.UDP, netip.MustParseAddrPort("127.0.0.1:0"), tg)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var clients []*net.UDPConn
		defer func() {
			for _, c := range clients {
				c.Close()
			}
		}()
		for i := 0; i < flows; i++ {
			c := udpClient(t)
			clients = append(clients, c)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		// One at a time: a burst would overflow the socket's receive buffer.
		for i, c := range clients {
			if _, err := c.WriteToUDPAddrPort([]byte("q"), ln.Addr()); err != nil {
				t.Fatal(err)
			}
			select {
			case <-got: // the flow exists once its datagram reached the backend
			case <-time.After(20 * time.Second): // a safety net
				t.Fatalf("%d of %d datagrams reached the backend", i, flows)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		grown := int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
		per := grown / flows
		t.Logf("%d bytes of heap and stack per waiting flow", per)
		if per > 32<<10 {
			t.Fatalf("%d bytes of heap and stack per waiting flow, want under 32 KiB", per)
		}
	})
}

// Past its descriptor budget an engine stops accepting: a further client
// waits in the accept queue, neither refused nor served, and is served as
// soon as a connection ends (issue 19, item 7: out of descriptors, every
// accept failed with EMFILE and the admin endpoints could not accept
// either). Five connections fill the budget.
func TestConformanceDescriptorBudgetPausesAccepts(t *testing.T) {
	budget := func(engine string, o *Options) {
		// Two sockets each; the goroutine engine's splice pipes, taken
		// from the budget while bytes are in flight, do not fit, so its
		// copies go through a buffer here.
		o.MaxFDs = 5 * 2
	}
	forEachEngineWith(t, budget, func(t *testing.T, e Engine) {
		f := newFixture(t, e, lb.TCP, serveTCP(t, echoHandler))
		var open []*net.TCPConn
		for i := 0; i < 5; i++ {
			c := f.dial()
			echoOnce(t, c, []byte("in"))
			open = append(open, c)
		}
		waiting := f.dial() // the kernel completes the handshake; sluice has not accepted
		defer waiting.Close()
		if _, err := waiting.Write([]byte("queued")); err != nil {
			t.Fatal(err)
		}
		waiting.SetReadDeadline(time.Now().Add(300 * time.Millisecond)) // the time it must stay unserved
		if n, err := waiting.Read(make([]byte, 16)); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the sixth connection past a budget of five: read %d bytes, %v; want it waiting", n, err)
		}
		open[0].Close()
		waiting.SetReadDeadline(time.Now().Add(20 * time.Second)) // a safety net
		buf := make([]byte, len("queued"))
		if _, err := io.ReadFull(waiting, buf); err != nil || string(buf) != "queued" {
			t.Fatalf("once a connection ended, the waiting one got %q, %v", buf, err)
		}
		for _, c := range open[1:] {
			echoOnce(t, c, []byte("still"))
			c.Close()
		}
	})
}

// idleCount is how many pipes the pool holds between bursts.
func (p *pipePool) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// The goroutine engine's splice pipes are its own (issue 12; issue 19,
// item 10): a direction holds a pipe only while bytes are in flight, so
// idle connections hold none (io.Copy kept two per connection for its
// life, and Go's pool kept them after it until a collection), and after a
// peak of bulk transfers the engine keeps at most maxIdlePipes, and none
// once the last connection has ended, with no collection at all.
func TestGoroutineEngineHoldsSplicePipesOnlyInFlight(t *testing.T) {
	// No collection: pipes must go back without one.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	e := NewGoroutine(Options{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Shutdown(ctx)
	})
	// The backend echoes through a buffer: io.Copy would splice through
	// Go's pipes, in this process, and be counted with the engine's.
	f := newFixture(t, e, lb.TCP, serveTCP(t, bufferedEchoHandler))
	const conns = 80 // more than maxIdlePipes
	var open []*net.TCPConn
	t.Cleanup(func() { // first, so that a failure does not wait on the backend's handlers
		for _, c := range open {
			c.Close()
		}
	})
	// A reply can reach the client just before its pipe is put back:
	// poll (the engine has no event for it) until every open pipe is a
	// pooled one. The pipes open are the engine's own, counted by its
	// descriptor budget (every pipe's two are the budget's while it
	// exists: TestPipePoolIsBoundedAndBudgeted) less the live connections'
	// and the next accept's, taken before it waits: not every pipe of the
	// process, since another test's io.Copy may still be closing Go's
	// (this read -3 in CI).
	pooled := func(what string, most, live int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second) // a safety net; the poll ends as soon as it holds
		for {
			held, idle := (int(e.fds.held.Load())-(live+1)*goConnFDs)/2, e.copier.pipes.idleCount() // two descriptors a pipe
			if held == idle && idle <= most {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d pipes open, %d of them idle in the pool; want none held by a connection and at most %d pooled", what, held, idle, most)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// One echo at a time, each waiting for the last one's pipes to be
	// back: otherwise an echo can start while the last one's pipe is on
	// its way back, take a new one, and the pool rightly ends with three
	// (this failed once on a busy machine). So the pool never needs more
	// than one echo's two, and idle connections hold none.
	for i := 0; i < conns; i++ {
		c := f.dial()
		echoOnce(t, c, []byte("ping"))
		open = append(open, c)
		pooled(fmt.Sprintf("after the echo on connection %d", i+1), 2, len(open))
	}
	// A peak: every connection moves 1 MiB each way at once.
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for _, c := range open {
		wg.Add(1)
		go func(c *net.TCPConn) {
			defer wg.Done()
			go c.Write(payload)
			got := make([]byte, len(payload))
			c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a safety net
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, payload) {
				errs <- fmt.Errorf("echo of 1 MiB: %v", err)
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pooled("after a peak of 1 MiB each way on every connection", maxIdlePipes, len(open))
	for _, c := range open {
		c.Close()
	}
	for i := 0; i < conns; i++ {
		<-f.ctr.closed
	}
	pooled("after the last connection", 0, 0) // the pool keeps two per open connection
}

// The pool keeps at most maxIdlePipes between bursts and closes the
// rest; a pipe that may hold bytes is never reused; every pipe's
// descriptors are the budget's while it exists; a shed gives the idle
// ones back; past the budget get says no.
func TestPipePoolIsBoundedAndBudgeted(t *testing.T) {
	fds := newFDBudget(2 * (maxIdlePipes + 10))
	p := newPipePool(fds, splicePipeSize(), maxIdlePipes)
	// The pool's own descriptors are counted by what they link to, not
	// every pipe of the process: another test's engine may still be
	// closing its own (this counted 144-146 of 148 on a busy machine).
	ends := map[int]string{}
	record := func(pp [2]int) {
		for _, fd := range pp {
			l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
			if err != nil || !strings.HasPrefix(l, "pipe:") {
				t.Fatalf("descriptor %d of a pipe: %q %v", fd, l, err)
			}
			ends[fd] = l
		}
	}
	open := func() int {
		n := 0
		for fd, was := range ends {
			if l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err == nil && l == was {
				n++
			}
		}
		return n
	}
	var got [][2]int
	for i := 0; i < maxIdlePipes+10; i++ {
		pp, ok := p.get()
		if !ok {
			t.Fatalf("pipe %d refused within the budget", i)
		}
		record(pp)
		got = append(got, pp)
	}
	if _, ok := p.get(); ok {
		t.Fatal("a pipe past the budget")
	}
	if n := open(); n != 2*(maxIdlePipes+10) { // two ends each
		t.Fatalf("%d pipe descriptors open, want %d", n, 2*(maxIdlePipes+10))
	}
	p.put(got[0], false) // may hold bytes: closed, though the pool has room
	if p.idleCount() != 0 || open() != 2*(maxIdlePipes+9) {
		t.Fatalf("a pipe put back with bytes in it: pooled %d, %d descriptors open", p.idleCount(), open())
	}
	for _, pp := range got[1:] {
		p.put(pp, true)
	}
	if p.idleCount() != maxIdlePipes || fds.held.Load() != 2*maxIdlePipes || open() != 2*maxIdlePipes {
		t.Fatalf("pooled %d, budget holds %d, %d descriptors open; want %d pipes", p.idleCount(), fds.held.Load(), open(), maxIdlePipes)
	}
	if !p.shed() || p.idleCount() != 0 || fds.held.Load() != 0 || open() != 0 {
		t.Fatalf("after a shed: pooled %d, budget %d, %d of the pool's descriptors open", p.idleCount(), fds.held.Load(), open())
	}
	p.close()
	pp, _ := p.get()
	record(pp)
	p.put(pp, true) // after close: closed, not pooled
	if p.idleCount() != 0 || open() != 0 {
		t.Fatal("a pipe pooled after close")
	}
}

// defaultRetry is the default retry policy as a Target takes it.
func defaultRetry() *lb.RetryPolicy {
	r := lb.DefaultRetryPolicy()
	return &r
}
