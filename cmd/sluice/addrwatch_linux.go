package main

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// netlinkAddrWatch hears of every address added to or removed from this
// network namespace's interfaces (rtnetlink's IPv4 and IPv6 address
// groups), so that the local address set is dumped again only after a
// change instead of before every apply (a dump per update was most of the
// applier's share at 10k service ports; issue 16). The kernel queues the
// notification before the change's own netlink call returns, so a change
// made before an apply is always seen by it.
type netlinkAddrWatch struct {
	mu     sync.Mutex
	fd     int
	buf    []byte
	primed bool // false until the first Changed, which is always true
}

func newAddrWatch() (*netlinkAddrWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("address watch: netlink socket: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("address watch: bind to the address groups: %w", err)
	}
	return &netlinkAddrWatch{fd: fd, buf: make([]byte, 8192)}, nil
}

// Changed drains what the kernel queued since the last call and says
// whether anything was (a lost notification, ENOBUFS, or any other error
// counts as a change: the caller then dumps, as without a watch).
func (w *netlinkAddrWatch) Changed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := !w.primed
	w.primed = true
	for {
		n, _, err := unix.Recvfrom(w.fd, w.buf, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return changed
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			if errors.Is(err, unix.ENOBUFS) {
				changed = true
				continue // the queue overflowed: drain what is left
			}
			return true
		case n > 0:
			changed = true
		}
	}
}

func (w *netlinkAddrWatch) Close() error { return unix.Close(w.fd) }
