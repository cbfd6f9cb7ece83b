//go:build !linux

package listeners

import (
	"errors"
	"net/netip"
)

// originalDst needs netfilter's SO_ORIGINAL_DST: Linux only.
func originalDst(int, bool) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("the original destination of a redirected connection is read on Linux only")
}
