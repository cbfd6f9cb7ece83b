package handover

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func rawFD(t *testing.T, c syscall.Conn) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// A successor gets the predecessor's listening sockets, the same kernel
// sockets: a connection waiting in the accept queue before the hand-over
// is accepted by the successor; retire reaches the predecessor only when
// the successor asks.
func TestHandOverPassesTheSameSockets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	tcpAddr := ln.Addr().(*net.TCPAddr).AddrPort()
	udpAddr := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	old := &Broker{}
	old.Hold("tcp", tcpAddr, rawFD(t, ln.(*net.TCPListener)))
	old.Hold("udp", udpAddr, rawFD(t, pc.(*net.UDPConn)))

	path := filepath.Join(t.TempDir(), "handover.sock")
	retired := make(chan struct{})
	offer, err := Serve(path, old, func() { close(retired) })
	if err != nil {
		t.Fatal(err)
	}
	defer offer.Close()

	// Waiting in the accept queue: nobody accepts on ln.
	queued, err := net.Dial("tcp", tcpAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()

	nb := &Broker{}
	pred, err := Connect(path, nb, 5*time.Second)
	if err != nil || pred == nil {
		t.Fatalf("connect: %v %v", pred, err)
	}
	fds := nb.Take("tcp", tcpAddr)
	if len(fds) != 1 {
		t.Fatalf("took %d TCP sockets, want 1", len(fds))
	}
	if again := nb.Take("tcp", tcpAddr); again != nil {
		t.Fatalf("a socket taken twice: %v", again)
	}
	f := os.NewFile(uintptr(fds[0]), "inherited")
	nln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer nln.Close()
	nln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second)) // a safety net
	c, err := nln.Accept()
	if err != nil {
		t.Fatalf("the queued connection was not handed over: %v", err)
	}
	if c.RemoteAddr().String() != queued.LocalAddr().String() {
		t.Fatalf("accepted %s, want the queued %s", c.RemoteAddr(), queued.LocalAddr())
	}
	c.Close()
	if n := nb.Untaken(); n != 1 {
		t.Fatalf("%d untaken sockets, want the UDP one", n)
	}
	select {
	case <-retired:
		t.Fatal("retired before the successor asked")
	default:
	}
	if err := pred.Retire(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-retired:
	case <-time.After(10 * time.Second): // a safety net
		t.Fatal("retire did not reach the predecessor")
	}
}

// No process on the path, or a stale socket file from a crash: no
// predecessor, no error.
func TestConnectWithoutAPredecessor(t *testing.T) {
	dir := t.TempDir()
	if p, err := Connect(filepath.Join(dir, "none.sock"), &Broker{}, time.Second); p != nil || err != nil {
		t.Fatalf("missing: %v %v", p, err)
	}
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if p, err := Connect(stale, &Broker{}, time.Second); p != nil || err != nil {
		t.Fatalf("stale: %v %v", p, err)
	}
}
