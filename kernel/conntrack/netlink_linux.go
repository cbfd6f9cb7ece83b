package conntrack

import (
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Netlink is the kernel's conntrack table for one family, through
// NETLINK_NETFILTER.
type Netlink struct {
	IPv6 bool
}

type matcher func(Flow) bool

func (m matcher) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	if c.Forward.Protocol != ProtoUDP && c.Forward.Protocol != ProtoSCTP {
		return false
	}
	ap := func(ip []byte, port uint16) netip.AddrPort {
		a, _ := netip.AddrFromSlice(ip)
		return netip.AddrPortFrom(a.Unmap(), port)
	}
	return m(Flow{
		Proto:    c.Forward.Protocol,
		OrigSrc:  ap(c.Forward.SrcIP, c.Forward.SrcPort),
		OrigDst:  ap(c.Forward.DstIP, c.Forward.DstPort),
		ReplySrc: ap(c.Reverse.SrcIP, c.Reverse.SrcPort),
	})
}

// DeleteMatching lists the table and deletes the matching UDP entries.
func (n Netlink) DeleteMatching(stale func(Flow) bool) (int, error) {
	fam := netlink.FAMILY_V4
	if n.IPv6 {
		fam = netlink.FAMILY_V6
	}
	deleted, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(fam), matcher(stale))
	return int(deleted), err
}
