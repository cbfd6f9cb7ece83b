//go:build !linux

package listeners

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"
)

// SCTPSupported reports that SCTP is served on Linux only.
func SCTPSupported() error { return errors.New("SCTP is served on Linux only") }

// SCTPDialFunc connects to an SCTP endpoint within timeout.
type SCTPDialFunc func(ep netip.AddrPort, timeout time.Duration) (net.Conn, error)

// SCTP is the Linux SCTP engine; elsewhere it serves nothing.
type SCTP struct{}

// NewSCTP returns an engine whose Listen always fails.
func NewSCTP(Options, SCTPDialFunc) *SCTP { return &SCTP{} }

// Listen fails: SCTP is Linux's here.
func (*SCTP) Listen(netip.AddrPort, *Target) (Listener, error) { return nil, ErrUnsupportedProtocol }

// Shutdown does nothing.
func (*SCTP) Shutdown(context.Context) error { return nil }
