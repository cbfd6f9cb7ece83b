//go:build linux

package listeners

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// loopState counts, on the loops themselves, the open connections and the
// copy buffers and kernel pipes they hold.
func (e *EventLoop) loopState() (conns, buffers, pipes int) {
	for _, l := range e.loops {
		l.do(func() {
			for c := range l.conns {
				conns++
				for _, p := range [2]*pipe{&c.up, &c.down} {
					if p.buf != nil {
						buffers++
					}
					if p.spliced {
						pipes++
					}
				}
			}
		})
	}
	return conns, buffers, pipes
}

// An idle connection holds no copy buffer: buffers are taken only while
// bytes are in flight (the README's claim).
func TestEventLoopIdleConnectionsHoldNoBuffers(t *testing.T) {
	e, err := NewEventLoop(Options{Loops: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		e.Shutdown(ctx)
	})
	f := newFixture(t, e, lb.TCP, serveTCP(t, echoHandler))
	var open []*net.TCPConn
	for i := 0; i < 50; i++ {
		c := f.dial()
		echoOnce(t, c, []byte("small"))
		open = append(open, c)
	}
	bulk := f.dial()
	echoOnce(t, bulk, randomBytes(1<<20)) // switches both directions to splice
	open = append(open, bulk)
	conns, buffers, pipes := e.loopState()
	if conns != 51 || buffers != 0 {
		t.Fatalf("%d connections hold %d buffers; want 51 holding none", conns, buffers)
	}
	if pipes == 0 {
		t.Fatal("a 1 MiB transfer did not switch to splice")
	}
	for _, c := range open {
		c.Close()
	}
}

// Closing or opening a listener after Shutdown neither hangs nor leaks.
func TestEventLoopListenerAfterShutdown(t *testing.T) {
	e, err := NewEventLoop(Options{Loops: 1})
	if err != nil {
		t.Fatal(err)
	}
	tg := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: defaultRetry()}
	ln, err := e.Listen(lb.TCP, netip.MustParseAddrPort("127.0.0.1:0"), tg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if _, err := e.Listen(lb.TCP, netip.MustParseAddrPort("127.0.0.1:0"), tg); err == nil {
		t.Fatal("Listen succeeded on a stopped engine")
	}
}

// Listening sockets: one per loop while they hold at most a quarter of the
// descriptor budget, then one per listener, spread over the loops (at 10k
// service ports, two loops' sockets were the whole descriptor limit);
// closing listeners gives the room back.
func TestEventLoopListenersStayWithinTheDescriptorBudget(t *testing.T) {
	e, err := NewEventLoop(Options{Loops: 2, MaxFDs: 40}) // a quarter: 10 sockets
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	var lns []*elTCPListener
	loopsUsed := map[*loop]bool{}
	for i := 0; i < 9; i++ {
		ln, err := e.Listen(lb.TCP, netip.MustParseAddrPort("127.0.0.1:0"), &Target{Picker: lb.NewPicker(nil, lb.EjectionPolicy{})})
		if err != nil {
			t.Fatal(err)
		}
		tl := ln.(*elTCPListener)
		lns = append(lns, tl)
		want := 2
		if i >= 5 {
			want = 1
			loopsUsed[tl.socks[0].l] = true
		}
		if len(tl.socks) != want {
			t.Fatalf("listener %d: %d sockets, want %d (%d open before it)", i, len(tl.socks), want, e.listenSockets.Load()-int64(len(tl.socks)))
		}
		// Accepted, then reset (no endpoint); refused would mean no socket.
		if c, err := net.Dial("tcp", ln.Addr().String()); errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("listener %d does not accept: %v", i, err)
		} else if err == nil {
			c.Close()
		}
	}
	if len(loopsUsed) != 2 {
		t.Fatalf("single sockets on %d loop(s), want both", len(loopsUsed))
	}
	for _, ln := range lns {
		ln.Close()
	}
	if n := e.listenSockets.Load(); n != 0 {
		t.Fatalf("%d listening sockets counted after every listener closed", n)
	}
	ln, err := e.Listen(lb.TCP, netip.MustParseAddrPort("127.0.0.1:0"), &Target{Picker: lb.NewPicker(nil, lb.EjectionPolicy{})})
	if err != nil || len(ln.(*elTCPListener).socks) != 2 {
		t.Fatalf("after the closes: %v, want one socket per loop again", err)
	}
	ln.Close()
}
