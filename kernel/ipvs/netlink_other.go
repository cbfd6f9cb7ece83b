//go:build !linux

package ipvs

import (
	"errors"
	"net/netip"
	"time"
)

// Netlink is the kernel's IPVS table on Linux; elsewhere there is none.
type Netlink struct{}

var errNotLinux = errors.New("IPVS needs Linux")

// NewNetlink fails: IPVS is Linux's.
func NewNetlink() (*Netlink, error) { return nil, errNotLinux }

func (*Netlink) Close()                                   {}
func (*Netlink) Services() ([]Service, error)             { return nil, errNotLinux }
func (*Netlink) AddService(Service) error                 { return errNotLinux }
func (*Netlink) UpdateService(Service) error              { return errNotLinux }
func (*Netlink) DeleteService(Key) error                  { return errNotLinux }
func (*Netlink) Reals(Key) ([]Real, error)                { return nil, errNotLinux }
func (*Netlink) AddReal(Key, Real) error                  { return errNotLinux }
func (*Netlink) UpdateReal(Key, Real) error               { return errNotLinux }
func (*Netlink) DeleteReal(Key, netip.AddrPort) error     { return errNotLinux }
func (*Netlink) SetTimeouts(tcp, tcpfin, udp int64) error { return errNotLinux }

// Timeouts fails: IPVS is Linux's.
func (*Netlink) Timeouts() (tcp, tcpfin, udp time.Duration, err error) { return 0, 0, 0, errNotLinux }
