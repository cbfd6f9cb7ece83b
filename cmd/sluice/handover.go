package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sluice-proxy/sluice/handover"
)

// handoverDir is where the hand-over sockets live by default; a
// DaemonSet mounts it from the host so that a new pod finds the old one's.
const handoverDir = "/run/sluice"

// handoverPath is --handover-socket: given, or derived from the command
// line, so that a sluice started with the same command line finds its
// predecessor and one with another (another test, another instance on the
// node) never does.
func handoverPath(flag string, args []string) string {
	if flag != "auto" {
		return flag
	}
	var kept []string
	for _, a := range args {
		if !strings.HasPrefix(a, "--handover-socket") {
			kept = append(kept, a)
		}
	}
	sum := sha256.Sum256([]byte(strings.Join(kept, "\x00")))
	return filepath.Join(handoverDir, "handover-"+hex.EncodeToString(sum[:6])+".sock")
}

// heldListener is a listener whose socket is held in the broker for a
// successor; Close releases it first.
type heldListener struct {
	net.Listener
	b  *handover.Broker
	fd int
}

func (l heldListener) Close() error {
	l.b.Release(l.fd)
	return l.Listener.Close()
}

// brokerListen is net.Listen through the broker: a predecessor's socket
// for the address if there is one, else a new one; either way held for a
// successor.
func brokerListen(b *handover.Broker) func(network, addr string) (net.Listener, error) {
	return func(network, addr string) (net.Listener, error) {
		ap, perr := netip.ParseAddrPort(addr)
		if perr == nil {
			var got net.Listener
			for _, fd := range b.Take("tcp", ap) {
				ln, err := fileListener(fd)
				switch {
				case err != nil:
				case got == nil:
					got = ln
				default:
					ln.Close() // one admin socket per address is all there is
				}
			}
			if got != nil {
				return hold(b, ap, got), nil
			}
		}
		ln, err := net.Listen(network, addr)
		if err != nil || perr != nil {
			return ln, err
		}
		return hold(b, ap, ln), nil
	}
}

func hold(b *handover.Broker, ap netip.AddrPort, ln net.Listener) net.Listener {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return ln
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return ln
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	b.Hold("tcp", ap, fd)
	return heldListener{Listener: ln, b: b, fd: fd}
}
