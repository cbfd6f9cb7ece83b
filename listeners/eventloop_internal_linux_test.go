//go:build linux

package listeners

import (
	"context"
	"net"
	"net/netip"
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
	tg := &Target{Picker: lb.NewPicker(nil, lb.DefaultEjectionPolicy()), Retry: lb.DefaultRetryPolicy()}
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
