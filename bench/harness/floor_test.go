//go:build linux

package harness

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFloorRelayRelays builds floor-relay and checks that it is a proxy,
// so its cost figures are a proxy's: request/response on kept and fresh
// connections, both backends taken in turn, a half-close passed on with
// the reply still coming back, megabytes each way at once (short writes),
// and a client whose backend refuses is closed. Loopback only.
func TestFloorRelayRelays(t *testing.T) {
	bin, err := BuildFloorRelay(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Two echo backends that name themselves before echoing.
	var backends []string
	for _, name := range []string{"A", "B"} {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		backends = append(backends, ln.Addr().String())
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					if _, err := c.Write([]byte(name)); err != nil {
						return
					}
					io.Copy(c, c)
				}()
			}
		}()
	}
	// A port nothing listens on.
	dead, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	free := func() netip.AddrPort {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return netip.MustParseAddrPort(ln.Addr().String())
	}
	front, refusing := free(), free()
	args := floorArgs(bin, 2, netip.MustParseAddr("127.0.0.1"), []Service{
		{Port: front.Port(), Backends: []netip.AddrPort{netip.MustParseAddrPort(backends[0]), netip.MustParseAddrPort(backends[1])}},
		{Port: refusing.Port(), Backends: []netip.AddrPort{netip.MustParseAddrPort(deadAddr)}},
	})
	cmd := exec.Command(args[0], args[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// It says so once every listener is bound.
	line := make([]byte, 64)
	if n, err := out.Read(line); err != nil || !strings.Contains(string(line[:n]), "2 services") {
		t.Fatalf("floor-relay did not start: %q %v", line[:n], err)
	}

	dial := func(a netip.AddrPort) net.Conn {
		c, err := net.DialTimeout("tcp4", a.String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		return c
	}
	served := map[string]int{}
	for i := 0; i < 20; i++ { // fresh connections, a request/response each
		c := dial(front)
		who := make([]byte, 1)
		if _, err := io.ReadFull(c, who); err != nil {
			t.Fatal(err)
		}
		served[string(who)]++
		for j := 0; j < 5; j++ { // kept: several exchanges on one
			msg := []byte{byte(i), byte(j), 1, 2, 3}
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("exchange %d/%d: %v %v", i, j, got, err)
			}
		}
		c.Close()
	}
	if served["A"] != 10 || served["B"] != 10 {
		t.Fatalf("round-robin over two backends: %v", served)
	}

	// Half-close: the client's FIN reaches the backend, whose echo of all
	// that came before it still comes back, then EOF.
	c := dial(front)
	payload := make([]byte, 300<<10)
	rand.Read(payload)
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || len(got) != 1+len(payload) || !bytes.Equal(got[1:], payload) {
		t.Fatalf("half-close: %d bytes back of %d, %v", len(got), 1+len(payload), err)
	}
	c.Close()

	// Megabytes both ways at once on several connections.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for k := 0; k < 4; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp4", front.String(), 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			big := make([]byte, 8<<20)
			rand.Read(big)
			go func() { c.Write(big); c.(*net.TCPConn).CloseWrite() }()
			back, err := io.ReadAll(c)
			if err != nil || len(back) != 1+len(big) || !bytes.Equal(back[1:], big) {
				errs <- errors.New("bulk echo came back wrong")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// A refused backend: the client is closed, not left hanging.
	c = dial(refusing)
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("refused backend: read %d bytes", n)
	}
	c.Close()
}
