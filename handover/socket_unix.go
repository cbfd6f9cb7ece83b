//go:build unix

package handover

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The conversation, over a SOCK_SEQPACKET Unix socket (one message each):
//
//	successor:   hello
//	predecessor: one message per listening socket: a JSON header
//	             {"network","addr"} with the descriptor (SCM_RIGHTS)
//	predecessor: end
//	successor:   retire          (once it serves: the predecessor drains)
//
// If the successor goes away before "retire", the predecessor carries on
// as if nothing happened.
const (
	msgHello  = "hello"
	msgEnd    = "end"
	msgRetire = "retire"
)

type header struct {
	Network string `json:"network"`
	Addr    string `json:"addr"`
}

func closeFD(fd int) error { return unix.Close(fd) }

// Predecessor is the running sluice a new one takes over from.
type Predecessor struct {
	conn *net.UnixConn
}

// Connect asks the process serving path for its listening sockets and
// puts them in b. It returns nil, nil when no process serves path (none
// runs, or the socket file is stale from a crash).
func Connect(path string, b *Broker, timeout time.Duration) (*Predecessor, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ECONNREFUSED) {
			return nil, nil
		}
		return nil, fmt.Errorf("hand-over socket %s: %w", path, err)
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msgHello)); err != nil {
		c.Close()
		return nil, fmt.Errorf("hand-over socket %s: %w", path, err)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			c.Close()
			b.Untaken()
			return nil, fmt.Errorf("hand-over from %s: %w", path, err)
		}
		if string(buf[:n]) == msgEnd {
			break
		}
		fds, err := parseRights(oob[:oobn])
		if err != nil || len(fds) != 1 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			c.Close()
			b.Untaken()
			return nil, fmt.Errorf("hand-over from %s: a socket message without its descriptor (%v)", path, err)
		}
		var h header
		var addr netip.AddrPort
		perr := json.Unmarshal(buf[:n], &h)
		if perr == nil {
			addr, perr = netip.ParseAddrPort(h.Addr)
		}
		if perr != nil {
			unix.Close(fds[0])
			continue
		}
		unix.CloseOnExec(fds[0])
		b.inherit(h.Network, addr, fds[0])
	}
	c.SetDeadline(time.Time{})
	return &Predecessor{conn: c}, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, r...)
	}
	return fds, nil
}

// Retire tells the predecessor to stop accepting and drain: this process
// serves every socket now.
func (p *Predecessor) Retire() error {
	if p == nil {
		return nil
	}
	defer p.conn.Close()
	p.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := p.conn.Write([]byte(msgRetire))
	return err
}

// Offer serves this process's held sockets to a successor on path.
type Offer struct {
	ln   *net.UnixListener
	wg   sync.WaitGroup
	once sync.Once

	mu     sync.Mutex
	active *net.UnixConn // the successor being answered
	closed bool

	path string
	file os.FileInfo // the socket file as bound, to know it is still ours at Close
}

// Serve listens on path (replacing what is there: a predecessor that has
// handed over, or a stale file) and answers successors: each gets b's
// held sockets, and retire is called when one asks this process to
// retire.
func Serve(path string, b *Broker, retire func()) (*Offer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("hand-over socket: %w", err)
	}
	os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("hand-over socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // a successor may own the path by then
	os.Chmod(path, 0o600)
	o := &Offer{ln: ln, path: path}
	o.file, _ = os.Stat(path)
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			if o.answer(c, b) {
				o.once.Do(retire)
			}
		}
	}()
	return o, nil
}

// answer serves one successor; true when it asked this process to retire.
func (o *Offer) answer(c *net.UnixConn, b *Broker) bool {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		c.Close()
		return false
	}
	o.active = c
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.active = nil
		o.mu.Unlock()
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != msgHello {
		return false
	}
	err = b.eachHeld(func(s socket) error {
		h, _ := json.Marshal(header{Network: s.network, Addr: s.addr.String()})
		_, _, err := c.WriteMsgUnix(h, unix.UnixRights(s.fd), nil)
		return err
	})
	if err != nil {
		return false
	}
	if _, err := c.Write([]byte(msgEnd)); err != nil {
		return false
	}
	// The successor now binds the rest, gets the state and serves; that
	// may take as long as its first sync does.
	c.SetDeadline(time.Time{})
	n, err = c.Read(buf)
	return err == nil && string(buf[:n]) == msgRetire
}

// Close stops answering successors, and removes the socket file unless a
// successor has replaced it.
func (o *Offer) Close() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.closed = true
	if o.active != nil {
		o.active.Close()
	}
	o.mu.Unlock()
	o.ln.Close()
	o.wg.Wait()
	if now, err := os.Stat(o.path); err == nil && o.file != nil && os.SameFile(now, o.file) {
		os.Remove(o.path)
	}
}

// boundAddr is the address fd's socket is bound to, as the kernel gives it
// (an IPv4 socket's as IPv4, an IPv6 socket's as IPv6 with no zone); the
// zero value when fd is not a bound IP socket.
func boundAddr(fd int) netip.AddrPort {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		if sa.ZoneId != 0 {
			return netip.AddrPort{} // a zone: the caller's name for it is kept instead
		}
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}
