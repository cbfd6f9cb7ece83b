package listeners

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// soOriginalDst is SO_ORIGINAL_DST (netfilter's, also IP6T_SO_ORIGINAL_DST
// at SOL_IPV6): the destination a connection had before a REDIRECT or
// DNAT rule rewrote it, from conntrack.
const soOriginalDst = 80

// originalDst is the destination the client of a connection accepted on
// a socket of the family v6 says asked for, before the capture's
// redirect: one getsockopt. A connection that was not redirected fails
// (ENOENT).
func originalDst(fd int, v6 bool) (netip.AddrPort, error) {
	var raw unix.RawSockaddrInet6 // large enough for either family
	n := uint32(unsafe.Sizeof(raw))
	level := unix.SOL_IP
	if v6 {
		level = unix.SOL_IPV6
	}
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), soOriginalDst,
		uintptr(unsafe.Pointer(&raw)), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 && v6 {
		// An IPv4 client of a dual-stack socket: conntrack has it as IPv4.
		n = uint32(unsafe.Sizeof(raw))
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_IP, soOriginalDst,
			uintptr(unsafe.Pointer(&raw)), uintptr(unsafe.Pointer(&n)), 0)
	}
	if errno != 0 {
		return netip.AddrPort{}, errno
	}
	// The port is in network order in both families.
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&raw.Port))[:])
	if raw.Family == unix.AF_INET {
		in4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&raw))
		return netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), port), nil
	}
	return netip.AddrPortFrom(netip.AddrFrom16(raw.Addr).Unmap(), port), nil
}
