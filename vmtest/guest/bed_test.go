//go:build linux && vmguest

package guest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ishidawataru/sctp"
	"github.com/sluice-proxy/sluice/listeners"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The VM's own namespace is the node. Each test builds a client and a
// backend namespace joined to it by veths (192.168.10.0/24 and
// 10.244.0.0/24), and deletes them when it ends.

type bed struct {
	t               *testing.T
	client, backend netns.NsHandle
	root            netns.NsHandle
}

// inNS runs fn on a locked thread switched into ns; sockets fn creates
// belong to ns.
func inNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		err = fn()
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		} // else the thread dies with the goroutine, still locked
		errc <- err
	}()
	return <-errc
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func newNS(t *testing.T) netns.NsHandle {
	var h netns.NsHandle
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread ends in the new namespace: never unlocked
		orig, _ := netns.Get()
		defer orig.Close()
		n, err := netns.New()
		if err == nil {
			h = n
			netns.Set(orig)
		}
		errc <- err
	}()
	must(t, <-errc)
	t.Cleanup(func() { h.Close() })
	return h
}

func link(t *testing.T, local, peer string, ns netns.NsHandle, localAddr, peerAddr string, peerAddrs ...string) {
	t.Helper()
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: local}, PeerName: peer}))
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(local); err == nil {
			netlink.LinkDel(l)
		}
	})
	l, err := netlink.LinkByName(local)
	must(t, err)
	p, err := netlink.LinkByName(peer)
	must(t, err)
	must(t, netlink.LinkSetNsFd(p, int(ns)))
	a, _ := netlink.ParseAddr(localAddr)
	must(t, netlink.AddrAdd(l, a))
	must(t, netlink.LinkSetUp(l))
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE) // only route: this kernel has no xfrm
	must(t, err)
	defer h.Close()
	pl, err := h.LinkByName(peer)
	must(t, err)
	for _, pa := range append([]string{peerAddr}, peerAddrs...) {
		a, _ := netlink.ParseAddr(pa)
		must(t, h.AddrAdd(pl, a))
	}
	must(t, h.LinkSetUp(pl))
	lo, err := h.LinkByName("lo")
	must(t, err)
	must(t, h.LinkSetUp(lo))
	gw := net.ParseIP(strings.Split(localAddr, "/")[0])
	must(t, h.RouteAdd(&netlink.Route{Gw: gw}))
}

func newBed(t *testing.T) *bed {
	root, err := netns.Get()
	must(t, err)
	b := &bed{t: t, root: root, client: newNS(t), backend: newNS(t)}
	link(t, "c0", "c1", b.client, "192.168.10.1/24", "192.168.10.2/24")
	link(t, "b0", "b1", b.backend, "10.244.0.1/24", "10.244.0.5/24", "10.244.0.6/24")
	must(t, os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644))
	// Service addresses lead into the backend namespace, which does not
	// forward: an undecided packet dies there (as in the host's bed).
	b0, err := netlink.LinkByName("b0")
	must(t, err)
	_, svcNet, _ := net.ParseCIDR("10.96.0.0/16")
	must(t, netlink.RouteAdd(&netlink.Route{LinkIndex: b0.Attrs().Index, Dst: svcNet, Gw: net.ParseIP("10.244.0.5")}))
	return b
}

// backends serves, on each backend address, TCP and SCTP that answer
// "name@ip" and close, and UDP that answers "name@ip" to each datagram.
func (b *bed) backends(name string, port int, ips ...string) {
	for _, ip := range ips {
		ip := ip
		answer := name + "@" + ip
		var tl net.Listener
		var ul net.PacketConn
		var sl *sctp.SCTPListener
		must(b.t, inNS(b.backend, func() error {
			var err error
			if tl, err = net.Listen("tcp", fmt.Sprintf("%s:%d", ip, port)); err != nil {
				return fmt.Errorf("backend tcp %s: %w", ip, err)
			}
			if ul, err = net.ListenPacket("udp", fmt.Sprintf("%s:%d", ip, port)); err != nil {
				return fmt.Errorf("backend udp %s: %w", ip, err)
			}
			if sl, err = sctp.ListenSCTP("sctp4", &sctp.SCTPAddr{IPAddrs: []net.IPAddr{{IP: net.ParseIP(ip).To4()}}, Port: port}); err != nil {
				return fmt.Errorf("backend sctp %s: %w", ip, err)
			}
			return nil
		}))
		var src, hold net.Listener // port+1: answers the source address it sees; port+2: holds connections open
		must(b.t, inNS(b.backend, func() error {
			var err error
			if src, err = net.Listen("tcp", fmt.Sprintf("%s:%d", ip, port+1)); err != nil {
				return err
			}
			hold, err = net.Listen("tcp", fmt.Sprintf("%s:%d", ip, port+2))
			return err
		}))
		b.t.Cleanup(func() { tl.Close(); ul.Close(); sl.Close(); src.Close(); hold.Close() })
		go func() {
			for {
				c, err := hold.Accept()
				if err != nil {
					return
				}
				c.Write([]byte(answer))
				go func() { io.Copy(io.Discard, c); c.Close() }()
			}
		}()
		go func() {
			for {
				c, err := src.Accept()
				if err != nil {
					return
				}
				c.Write([]byte(c.RemoteAddr().(*net.TCPAddr).IP.String()))
				c.Close()
			}
		}()
		go func() {
			for {
				c, err := tl.Accept()
				if err != nil {
					return
				}
				c.Write([]byte(answer))
				c.Close()
			}
		}()
		go func() {
			buf := make([]byte, 2048)
			for {
				_, from, err := ul.ReadFrom(buf)
				if err != nil {
					return
				}
				ul.WriteTo([]byte(answer), from)
			}
		}()
		go func() {
			for {
				c, err := sl.Accept()
				if err != nil {
					return
				}
				c.Write([]byte(answer))
				time.AfterFunc(200*time.Millisecond, func() { c.Close() }) // let the reply leave first
			}
		}()
	}
}

// answerWithin bounds a request that should be answered. It covers one
// retransmission of a lost SYN (1 s) or SCTP INIT (RTO.Initial, 3 s):
// under emulation on a busy host a handshake packet can be late or lost,
// and a real client would retry it.
const answerWithin = 10 * time.Second

// ask sends one request from the client namespace and returns the answer
// or "error: ...".
func (b *bed) ask(proto, addr string) string { return b.askWithin(proto, addr, answerWithin) }

// askWithin is ask with a deadline: a short one where the request is
// expected to be dropped.
func (b *bed) askWithin(proto, addr string, d time.Duration) string {
	var out string
	err := inNS(b.client, func() error {
		switch proto {
		case "tcp":
			c, err := net.DialTimeout("tcp", addr, d)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(d))
			bs, err := io.ReadAll(c)
			out = string(bs)
			return err
		case "udp":
			c, err := net.Dial("udp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(d))
			c.Write([]byte("ping"))
			buf := make([]byte, 2048)
			n, err := c.Read(buf)
			out = string(buf[:n])
			return err
		case "sctp":
			// listeners.DialSCTP: a poller-driven connect with a real deadline
			// (the library's own connect retries after EINTR into EISCONN).
			c, err := listeners.DialSCTP(netip.MustParseAddrPort(addr), d)
			if err != nil {
				return err
			}
			defer c.Close()
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 2048)
				n, err := c.Read(buf)
				out = string(buf[:n])
				done <- err
			}()
			select { // the library has no read deadlines: bound it with a timer
			case err := <-done:
				return err
			case <-time.After(d):
				return fmt.Errorf("sctp %s: no answer in %s", addr, d)
			}
		}
		return fmt.Errorf("unknown protocol %s", proto)
	})
	if err != nil && out == "" {
		return "error: " + err.Error()
	}
	return out
}

// holdTCP opens a connection from the client namespace that the backend
// keeps open, and returns it with the backend's name.
func (b *bed) holdTCP(addr string) (*net.TCPConn, string) {
	var c net.Conn
	must(b.t, inNS(b.client, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, answerWithin)
		return err
	}))
	buf := make([]byte, 64)
	c.SetReadDeadline(time.Now().Add(answerWithin))
	n, err := c.Read(buf)
	must(b.t, err)
	return c.(*net.TCPConn), string(buf[:n])
}

func (b *bed) tally(proto, addr string, n int) map[string]int {
	m := map[string]int{}
	for i := 0; i < n; i++ {
		a := b.ask(proto, addr)
		if strings.HasPrefix(a, "error: ") {
			conns, _ := os.ReadFile("/proc/net/ip_vs_conn") // empty without IPVS
			b.t.Logf("%s %s: %s\nIPVS connections:\n%s", proto, addr, a, conns)
			a = "error"
		}
		m[a]++
	}
	return m
}

// proc is a sluice process whose log lines are scanned.
type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	lines chan string

	mu  sync.Mutex
	all []string // every line, for dump
}

func startSluice(t *testing.T, args ...string) *proc {
	cmd := exec.Command(os.Getenv("SLUICE_BIN"), args...)
	stderr, _ := cmd.StderrPipe()
	cmd.Stdout = io.Discard
	must(t, cmd.Start())
	p := &proc{t: t, cmd: cmd, lines: make(chan string, 10000)}
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			p.mu.Lock()
			p.all = append(p.all, s.Text())
			p.mu.Unlock()
			p.lines <- s.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			p.dump() // every failure shows what sluice logged
		}
	})
	return p
}

func (p *proc) waitLog(subs ...string) {
	p.t.Helper()
	deadline := time.After(60 * time.Second) // a safety net, never a synchronisation
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("sluice exited before logging %q", subs)
			}
			match := true
			for _, s := range subs {
				match = match && strings.Contains(l, s)
			}
			if match {
				return
			}
		case <-deadline:
			p.t.Fatalf("no log line with %q in 60s", subs)
		}
	}
}

// logged is every line sluice has printed so far.
func (p *proc) logged() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.all)
}

// dump logs what sluice has printed so far (for a failure's context).
func (p *proc) dump() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.all {
		p.t.Log("sluice| " + l)
	}
}

// stop sends SIGINT and waits for the exit; a sluice that has not exited
// after 45 s (its drain timeout is 30 s) is made to dump its goroutines
// (SIGQUIT) into the test log, and the test fails.
func (p *proc) stop() {
	p.t.Helper()
	p.cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
		return
	case <-time.After(45 * time.Second):
	}
	p.cmd.Process.Signal(syscall.SIGQUIT)
	<-done
	for l := range p.lines {
		p.t.Log("sluice| " + l)
	}
	p.t.Fatal("sluice did not exit within 45 s of SIGINT")
}

func sh(t *testing.T, dir, name, content string) string {
	f := dir + "/" + name
	must(t, os.WriteFile(f, []byte(content), 0o644))
	return f
}
