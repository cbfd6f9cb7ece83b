//go:build linux

package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Backends are the servers every system forwards to, run in the harness
// process (their sockets in the topology's backend namespace). Each kind
// has three instances.
type Backends struct {
	Echo      []netip.AddrPort // TCP echo
	HTTP      []netip.AddrPort // HTTP 204 with X-Backend: <index> and X-Served-At: <Unix ns>
	UDP       []netip.AddrPort // UDP echo
	Push      []netip.AddrPort // TCP: writes without end (slow-reader source)
	HalfClose []netip.AddrPort // TCP: reads to EOF, then replies with the byte count
	Iperf     []netip.AddrPort // one iperf3 -s (its control and data connections must meet)
	Refusing  netip.AddrPort   // nothing listens
	Blackhole netip.AddrPort   // full accept queue: SYNs are dropped

	topo    *Topology
	closers []func()
	wg      sync.WaitGroup
}

// StartBackends starts every backend on t's backend address.
func StartBackends(t *Topology) (*Backends, error) {
	b := &Backends{topo: t}
	for i := 0; i < 3; i++ {
		steps := []func(int) error{b.echo, b.http, b.udp, b.push, b.halfClose}
		for _, f := range steps {
			if err := f(i); err != nil {
				b.Close()
				return nil, err
			}
		}
	}
	var err error
	if err := b.iperf(); err != nil {
		b.Close()
		return nil, err
	}
	if b.Refusing, err = b.refusingAddr(); err != nil {
		b.Close()
		return nil, err
	}
	if b.Blackhole, err = b.blackhole(); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Close stops every backend and waits for their goroutines.
func (b *Backends) Close() {
	for _, c := range b.closers {
		c()
	}
	b.closers = nil
	b.wg.Wait()
}

// listen opens a TCP listener on the backend address, in the backend
// namespace.
func (b *Backends) listen() (*net.TCPListener, error) {
	var ln *net.TCPListener
	err := b.topo.inBackend(func() error {
		var err error
		ln, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(b.topo.Backend, 0)))
		return err
	})
	return ln, err
}

func (b *Backends) serveTCP(handle func(*net.TCPConn)) (netip.AddrPort, error) {
	ln, err := b.listen()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var conns sync.Map
	b.closers = append(b.closers, func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	})
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				// Out of descriptors (EMFILE) at the top of the idle
				// workload: keep serving once some are freed, rather than
				// leave every later workload's connections unanswered.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			conns.Store(c, true)
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer conns.Delete(c)
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

func (b *Backends) echo(int) error {
	a, err := b.serveTCP(func(c *net.TCPConn) {
		// A plain loop, not io.Copy: a socket-to-socket copy splices, and a
		// splice waiting for data holds a pipe (two more descriptors) per
		// idle connection.
		buf := make([]byte, 16<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				break
			}
		}
		c.CloseWrite()
	})
	b.Echo = append(b.Echo, a)
	return err
}

func (b *Backends) push(int) error {
	a, err := b.serveTCP(func(c *net.TCPConn) {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	b.Push = append(b.Push, a)
	return err
}

func (b *Backends) halfClose(int) error {
	a, err := b.serveTCP(func(c *net.TCPConn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d", n)
		c.CloseWrite()
	})
	b.HalfClose = append(b.HalfClose, a)
	return err
}

func (b *Backends) http(i int) error {
	ln, err := b.listen()
	if err != nil {
		return err
	}
	id := fmt.Sprint(i)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Backend", id)
		// When this backend served the request, on the bench's clock: the
		// flips take it as the moment an update was in effect, which the
		// probe that saw it learns only a response later.
		w.Header().Set("X-Served-At", strconv.FormatInt(time.Now().UnixNano(), 10))
		w.WriteHeader(http.StatusNoContent)
	})}
	b.closers = append(b.closers, func() { srv.Close() })
	b.wg.Add(1)
	go func() { defer b.wg.Done(); srv.Serve(ln) }()
	b.HTTP = append(b.HTTP, ln.Addr().(*net.TCPAddr).AddrPort())
	return nil
}

func (b *Backends) udp(int) error {
	var pc *net.UDPConn
	err := b.topo.inBackend(func() error {
		var err error
		pc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.topo.Backend, 0)))
		return err
	})
	if err != nil {
		return err
	}
	pc.SetReadBuffer(4 << 20)
	b.closers = append(b.closers, func() { pc.Close() })
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			pc.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	b.UDP = append(b.UDP, pc.LocalAddr().(*net.UDPAddr).AddrPort())
	return nil
}

// iperf starts `iperf3 -s` on a free backend port, stopped with the rest.
func (b *Backends) iperf() error {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return fmt.Errorf("iperf3 not installed (apt-get install iperf3)")
	}
	port, err := b.topo.FreePort("tcp")
	if err != nil {
		return err
	}
	p, err := StartProc("iperf3", Anywhere(), b.topo.InBackend("iperf3", "-s", "-B", b.topo.Backend.String(), "-p", fmt.Sprint(port))...)
	if err != nil {
		return err
	}
	b.closers = append(b.closers, func() { p.Stop(2 * time.Second) })
	addr := netip.AddrPortFrom(b.topo.Backend, port)
	if !p.WaitFor(10*time.Second, func() bool { return dialOnce(addr) == nil }) {
		return fmt.Errorf("iperf3 -s did not come up: %s", p.Output())
	}
	b.Iperf = []netip.AddrPort{addr}
	return nil
}

// refusingAddr is a backend port nothing listens on: connections to it are
// refused (a RST).
func (b *Backends) refusingAddr() (netip.AddrPort, error) {
	ln, err := b.listen()
	if err != nil {
		return netip.AddrPort{}, err
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a, nil
}

// blackhole is a backend listener with backlog 0 whose queue is filled, so
// the kernel drops further SYNs: a dead pod behind a firewall, without
// touching any firewall.
func (b *Backends) blackhole() (netip.AddrPort, error) {
	var fd int
	err := b.topo.inBackend(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	b.closers = append(b.closers, func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: b.topo.Backend.As4()}); err != nil {
		return netip.AddrPort{}, err
	}
	if err := unix.Listen(fd, 0); err != nil {
		return netip.AddrPort{}, err
	}
	sa, _ := unix.Getsockname(fd)
	a := netip.AddrPortFrom(b.topo.Backend, uint16(sa.(*unix.SockaddrInet4).Port))
	for i := 0; i < 2; i++ {
		if c, err := net.DialTimeout("tcp", a.String(), 200*1e6); err == nil {
			b.closers = append(b.closers, func() { c.Close() })
		}
	}
	return a, nil
}
