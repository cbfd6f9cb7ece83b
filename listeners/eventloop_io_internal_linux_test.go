//go:build linux

package listeners

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/lb"
)

// TestIORingCompletesNonBlockingOpsInline checks what the loop's batching
// rests on: every MSG_DONTWAIT recv and send is complete, with its result,
// when submit returns, an empty socket's recv with EAGAIN.
func TestIORingCompletesNonBlockingOpsInline(t *testing.T) {
	r, err := newIORing(8)
	if err != nil {
		t.Fatalf("this kernel refuses io_uring: %v", err)
	}
	defer r.close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	msg, in, empty := []byte("one batch"), make([]byte, 64), make([]byte, 64)
	queue := func(op uint8, fd int, b []byte, ud uint64) {
		s := r.next()
		s.opcode, s.fd, s.len, s.userData = op, int32(fd), uint32(len(b)), ud
		s.addr = uint64(uintptr(unsafe.Pointer(&b[0])))
		s.opFlags = unix.MSG_DONTWAIT
	}
	queue(ioOpRecv, fds[0], empty, 1) // nothing to read yet
	queue(ioOpSend, fds[0], msg, 2)
	queue(ioOpRecv, fds[1], in, 3) // after the send: reads it
	if err := r.submit(); err != nil {
		t.Fatal(err)
	}
	if r.enters != 1 || r.carried != 3 {
		t.Fatalf("%d enters carrying %d entries, want 1 carrying 3", r.enters, r.carried)
	}
	got := map[uint64]int32{}
	r.reap(func(ud uint64, res int32) { got[ud] = res })
	want := map[uint64]int32{1: -int32(unix.EAGAIN), 2: int32(len(msg)), 3: int32(len(msg))}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("completions %v, want %v", got, want)
	}
	if !bytes.Equal(in[:len(msg)], msg) {
		t.Fatalf("read %q, want %q", in[:len(msg)], msg)
	}
	if r.ready() != 0 {
		t.Fatalf("%d completions left after reaping", r.ready())
	}
}

// TestEventLoopBatchesATurnsRecvsAndSends holds the loop while eight
// clients each send a request, so that its next turn finds all eight
// readable: their recvs must go to the kernel in one io_uring_enter, and
// every reply must come back whole. With more readable at once than
// maxQueuedRecvs, a batch holds buffers for no more than that.
func TestEventLoopBatchesATurnsRecvsAndSends(t *testing.T) {
	for _, tc := range []struct{ clients, want int }{{8, 8}, {maxQueuedRecvs + 8, maxQueuedRecvs}} {
		t.Run(fmt.Sprint(tc.clients), func(t *testing.T) { testTurnBatches(t, tc.clients, tc.want) })
	}
}

func testTurnBatches(t *testing.T, n, wantRecvs int) {
	e, l, f := ringLoopForTest(t)
	conns := openEchoed(t, f, n)
	var before, opsBefore uint64
	held, release := make(chan struct{}), make(chan struct{})
	l.post(func() {
		before, opsBefore = l.ring.carried, e.IOUringOps()
		l.mostRecvs, l.mostSends = 0, 0
		close(held)
		<-release
	})
	<-held
	func() {
		defer close(release) // a held loop would hang the clean-up
		for i, c := range conns {
			if _, err := fmt.Fprintf(c, "request %d", i); err != nil {
				t.Error(err)
			}
		}
	}()
	for i, c := range conns {
		want := fmt.Sprintf("request %d", i)
		got := make([]byte, len(want))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
			t.Fatalf("connection %d: echo %q, %v; want %q", i, got, err, want)
		}
	}
	var carried uint64
	var recvs, sends uint32
	l.do(func() { carried, recvs, sends = l.ring.carried-before, l.mostRecvs, l.mostSends })
	if int(recvs) != wantRecvs || int(sends) < wantRecvs {
		t.Fatalf("the most one io_uring_enter carried was %d recvs and %d sends, want %d recvs and at least as many sends in the turn that found %d clients readable", recvs, sends, wantRecvs, n)
	}
	if carried < uint64(2*wantRecvs) {
		t.Fatalf("the ring carried %d recvs and sends, want at least %d (a recv and a send per request)", carried, 2*wantRecvs)
	}
	if ops := e.IOUringOps() - opsBefore; ops != carried {
		t.Fatalf("IOUringOps counted %d reads and writes, the ring carried %d", ops, carried)
	}
}

// TestEventLoopCancelsTheQueuedIOOfAClosedConnection queues a recv for a
// connection, closes the connection, and hands its descriptor number to a
// new socket before the batch goes out: the recv must not read from the
// new socket.
func TestEventLoopCancelsTheQueuedIOOfAClosedConnection(t *testing.T) {
	_, l, f := ringLoopForTest(t)
	client := f.dial()
	defer client.Close()
	echoOnce(t, client, []byte("open"))
	var errs []string
	l.do(func() {
		c := l.conns.head
		if c == nil {
			errs = append(errs, "no connection on the loop")
			return
		}
		fd := c.cs.fd
		l.events = 2 // as in a turn that batches
		if !l.queueRecv(c, &c.up, l.getBuf()) {
			errs = append(errs, "the ring refused a recv")
			return
		}
		c.abort() // closes fd
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			errs = append(errs, err.Error())
			return
		}
		defer unix.Close(pair[0])
		defer unix.Close(pair[1])
		// The closed connection's number, now the new socket's: the
		// kernel hands it out again lowest first, else dup3 puts it there.
		reused, writer := pair[0], pair[1]
		switch fd {
		case pair[1]:
			reused, writer = pair[1], pair[0]
		case pair[0]:
		default:
			if err := unix.Dup3(pair[0], fd, unix.O_CLOEXEC); err != nil {
				errs = append(errs, err.Error())
				return
			}
			defer unix.Close(fd)
			reused = fd
		}
		if _, err := unix.Write(writer, []byte("not the closed connection's")); err != nil {
			errs = append(errs, err.Error())
			return
		}
		l.flushIO()
		buf := make([]byte, 64)
		if n, err := unix.Read(reused, buf); err != nil || string(buf[:n]) != "not the closed connection's" {
			errs = append(errs, fmt.Sprintf("the new socket on descriptor %d holds %q, %v: the closed connection's recv read it", fd, buf[:max(n, 0)], err))
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
}

// A kernel that has io_uring but not a setup flag the ring asks for
// (before 5.18, IORING_SETUP_SUBMIT_ALL) refuses with the EINVAL of any
// bad argument; the error says which it was. A flag bit no kernel knows
// stands in for SUBMIT_ALL on an older one; too many entries stay a
// plain EINVAL.
func TestIORingSaysWhenTheKernelLacksASetupFlag(t *testing.T) {
	const unknownFlag = 1 << 30
	_, err := newIORingFlags(8, ioSetupSubmitAll|unknownFlag)
	if err == nil || !strings.Contains(err.Error(), "refuses the setup flags") || !strings.Contains(err.Error(), "5.18") {
		t.Fatalf("a flag the kernel lacks: %v; want an error naming the flags and the kernel needed", err)
	}
	_, err = newIORingFlags(1<<20, ioSetupSubmitAll)
	if err == nil || strings.Contains(err.Error(), "setup flags") || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("too many entries: %v; want the kernel's EINVAL, not blamed on the flags", err)
	}
}

// TestEventLoopWithoutIORingSaysWhyAndServes has the kernel refuse the
// loops' rings (more entries than io_uring_setup takes): the engine says
// why, keeps no ring, and serves with plain syscalls.
func TestEventLoopWithoutIORingSaysWhyAndServes(t *testing.T) {
	e := eventLoopForTest(t, Options{Loops: 2, ringEntries: 1 << 20})
	if err := e.IOUring(); err == nil || !strings.Contains(err.Error(), "io_uring_setup") {
		t.Fatalf("IOUring() = %v, want io_uring_setup's refusal", err)
	}
	if n := e.IOUringLoops(); n != 0 {
		t.Fatalf("IOUringLoops() = %d with no ring; want 0", n)
	}
	for i, l := range e.loops {
		var ring bool
		l.do(func() { ring = l.ring != nil })
		if ring {
			t.Fatalf("loop %d kept a ring when another could not have one", i)
		}
	}
	f := newFixture(t, e, lb.TCP, serveTCP(t, echoHandler))
	for i := 0; i < 4; i++ {
		c := f.dial()
		echoOnce(t, c, []byte("plain syscalls"))
		c.Close()
	}
}

// TestEventLoopGivesUpABrokenRing breaks a loop's ring under it (its
// descriptor becomes an eventfd, which io_uring_enter refuses) and then
// has two connections' requests batched on it: the two connections are
// reset, not left hanging, the loop counts the failure and drops the
// ring, and it serves new connections with plain syscalls.
func TestEventLoopGivesUpABrokenRing(t *testing.T) {
	warned := make(chan slog.Record, 1)
	e, l, f := ringLoopWith(t, Options{Loops: 1, Log: slog.New(recordTo(warned))})
	if n := e.IOUringLoops(); n != 1 {
		t.Fatalf("before the failure: %d loops batching on a ring; want 1", n)
	}
	conns := openEchoed(t, f, 2)
	held, release := make(chan struct{}), make(chan struct{})
	var breakErr error
	l.post(func() {
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err == nil {
			err = unix.Dup3(efd, l.ring.fd, unix.O_CLOEXEC)
			unix.Close(efd)
		}
		breakErr = err
		close(held)
		<-release
	})
	<-held
	func() {
		defer close(release)
		if breakErr != nil {
			t.Errorf("breaking the ring: %v", breakErr)
			return
		}
		for _, c := range conns { // both readable in the next turn: batched
			if _, err := c.Write([]byte("request")); err != nil {
				t.Error(err)
			}
		}
	}()
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 16)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("connection %d, whose recv was on the broken ring: read %d bytes, %v; want it reset", i, n, err)
		}
	}
	var ring bool
	l.do(func() { ring = l.ring != nil })
	if ring || e.IOUringFailures() != 1 || e.IOUringLoops() != 0 {
		t.Fatalf("after the failure: ring kept %v, failures counted %d, loops batching %d; want it dropped, 1 and 0",
			ring, e.IOUringFailures(), e.IOUringLoops())
	}
	select {
	case r := <-warned:
		var why string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				why = a.Value.String()
			}
			return true
		})
		if r.Level != slog.LevelWarn || !strings.Contains(r.Message, "io_uring") || why == "" {
			t.Errorf("logged %v %q (err %q); want a warning that the loop gave up its io_uring, and why", r.Level, r.Message, why)
		}
	case <-time.After(10 * time.Second):
		t.Error("the ring given up was not logged")
	}
	c := f.dial()
	defer c.Close()
	echoOnce(t, c, []byte("served with plain syscalls"))
}

// ringLoopForTest is an event loop engine of one loop, which must have
// its ring, and an echo service through it.
func ringLoopForTest(t *testing.T) (*EventLoop, *loop, *fixture) {
	return ringLoopWith(t, Options{Loops: 1})
}

// ringLoopWith is ringLoopForTest with o (of one loop).
func ringLoopWith(t *testing.T, o Options) (*EventLoop, *loop, *fixture) {
	t.Helper()
	e := eventLoopForTest(t, o)
	l := e.loops[0]
	if l.ring == nil {
		t.Fatalf("no ring: %v", e.IOUring())
	}
	return e, l, newFixture(t, e, lb.TCP, serveTCP(t, echoHandler))
}

// openEchoed opens n connections through f, each echoed once, closed
// when the test ends.
func openEchoed(t *testing.T, f *fixture, n int) []*net.TCPConn {
	t.Helper()
	var conns []*net.TCPConn
	t.Cleanup(func() { // before the backend's, which waits for its handlers
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < n; i++ {
		c := f.dial()
		echoOnce(t, c, []byte("open"))
		conns = append(conns, c)
	}
	return conns
}

// recordTo is a slog handler that passes each record to ch, dropping what
// ch has no room for.
type recordTo chan slog.Record

func (h recordTo) Enabled(context.Context, slog.Level) bool { return true }
func (h recordTo) Handle(_ context.Context, r slog.Record) error {
	select {
	case h <- r:
	default:
	}
	return nil
}
func (h recordTo) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordTo) WithGroup(string) slog.Handler      { return h }
