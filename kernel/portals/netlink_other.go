//go:build !linux

package portals

import (
	"errors"
	"net/netip"
)

// Netlink is the real AddrTable on Linux; elsewhere every call fails.
type Netlink struct{}

var errNotLinux = errors.New("the bind VIP capture needs Linux netlink")

func (Netlink) EnsureDummy(string) (int, error) { return 0, errNotLinux }
func (Netlink) LinkIndex(string) (int, error)   { return 0, errNotLinux }
func (Netlink) DeleteLink(string) error         { return nil }
func (Netlink) Owned(int) ([]netip.Addr, error) { return nil, errNotLinux }
func (Netlink) Addrs(int) ([]netip.Addr, error) { return nil, errNotLinux }
func (Netlink) Add(int, netip.Addr) error       { return errNotLinux }
func (Netlink) Del(int, netip.Addr) error       { return errNotLinux }
