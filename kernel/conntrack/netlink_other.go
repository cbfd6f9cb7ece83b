//go:build !linux

package conntrack

import "errors"

// Netlink is the kernel's conntrack table on Linux; elsewhere it fails.
type Netlink struct {
	IPv6 bool
}

// DeleteMatching fails: there is no conntrack here.
func (Netlink) DeleteMatching(func(Flow) bool) (int, error) {
	return 0, errors.New("conntrack needs Linux")
}
