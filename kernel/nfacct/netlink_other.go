//go:build !linux

package nfacct

import "errors"

// Netlink is the kernel's table; only Linux has one.
type Netlink struct{}

var errNotLinux = errors.New("nfacct needs Linux")

func (Netlink) Ensure(string) error            { return errNotLinux }
func (Netlink) Packets(string) (uint64, error) { return 0, errNotLinux }
