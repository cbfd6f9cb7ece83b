//go:build linux

package listeners

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// enablePktinfo asks the kernel to report each datagram's destination
// address, so that a wildcard UDP listener can reply from the address the
// client sent to.
func enablePktinfo(fd uintptr, v6 bool) error {
	if v6 {
		return unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
	}
	return unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
}

const oobSize = 64

// pktinfoDst extracts the destination address from a received control message.
func pktinfoDst(oob []byte) netip.Addr {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			var a [4]byte
			copy(a[:], m.Data[8:12]) // struct in_pktinfo { ifindex; spec_dst; addr }: addr is the header destination
			return netip.AddrFrom4(a)
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			var a [16]byte
			copy(a[:], m.Data[0:16])
			return netip.AddrFrom16(a)
		}
	}
	return netip.Addr{}
}

// pktinfoSrc builds the control message that makes a reply leave from src.
func pktinfoSrc(src netip.Addr) []byte {
	if !src.IsValid() {
		return nil
	}
	if src.Is4() {
		return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: src.As4()})
	}
	return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: src.As16()})
}

// disableGRO undoes enableGRO on a socket a predecessor may have set it on
// (the event loop does): a listener that reads a datagram at a time must
// not be handed a burst merged into one.
func disableGRO(fd uintptr) {
	unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 0)
}
