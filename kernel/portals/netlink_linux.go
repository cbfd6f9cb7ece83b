package portals

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// addrProto marks sluice's addresses (IFA_PROTO, Linux 6.3+); 'S'.
const (
	ifaProto  = 11 // IFA_PROTO
	addrProto = 0x53
)

// Netlink is the real AddrTable. Addresses are added and listed with raw
// RTM_NEWADDR/RTM_GETADDR messages, because the netlink library does not
// carry IFA_PROTO; IPv4 addresses on lo also get the label "lo:sluice" as a
// second mark for kernels that ignore IFA_PROTO.
type Netlink struct{}

func (Netlink) EnsureDummy(name string) (int, error) {
	if l, err := netlink.LinkByName(name); err == nil {
		if l.Type() != "dummy" {
			return 0, fmt.Errorf("interface %s exists and is a %s, not sluice's dummy", name, l.Type())
		}
		return l.Attrs().Index, netlink.LinkSetUp(l)
	}
	d := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := netlink.LinkAdd(d); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return 0, fmt.Errorf("add link %s type dummy: %v: %w", name, err, ErrNoDummy)
		}
		return 0, fmt.Errorf("add link %s type dummy: %w", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, netlink.LinkSetUp(l)
}

func (Netlink) LinkIndex(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("interface %s: %w", name, err)
	}
	return l.Attrs().Index, nil
}

func (Netlink) DeleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if l.Type() != "dummy" {
		return fmt.Errorf("interface %s is a %s, not sluice's dummy; left alone", name, l.Type())
	}
	return netlink.LinkDel(l)
}

func (n Netlink) Owned(link int) ([]netip.Addr, error) { return n.list(link, true) }

func (n Netlink) Addrs(link int) ([]netip.Addr, error) { return n.list(link, false) }

// list lists the addresses of an interface, only sluice's with marked.
func (Netlink) list(link int, markedOnly bool) ([]netip.Addr, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfAddrmsg(unix.AF_UNSPEC))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, m := range msgs {
		msg := nl.DeserializeIfAddrmsg(m)
		if int(msg.Index) != link {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[msg.Len():])
		if err != nil {
			return nil, err
		}
		var (
			addr   netip.Addr
			marked bool
		)
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.IFA_LOCAL, unix.IFA_ADDRESS:
				if ip, ok := netip.AddrFromSlice(a.Value); ok && (a.Attr.Type == unix.IFA_LOCAL || !addr.IsValid()) {
					addr = ip.Unmap()
				}
			case ifaProto:
				marked = marked || (len(a.Value) > 0 && a.Value[0] == addrProto)
			case unix.IFA_LABEL:
				marked = marked || string(trimNUL(a.Value)) == "lo:sluice"
			}
		}
		if (marked || !markedOnly) && addr.IsValid() {
			out = append(out, addr)
		}
	}
	return out, nil
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

func (n Netlink) addrMsg(cmd, flags int, link int, a netip.Addr, add bool) error {
	fam, bits := unix.AF_INET, 32
	if a.Is6() {
		fam, bits = unix.AF_INET6, 128
	}
	req := nl.NewNetlinkRequest(cmd, flags|unix.NLM_F_ACK)
	msg := nl.NewIfAddrmsg(fam)
	msg.Index = uint32(link)
	msg.Prefixlen = uint8(bits)
	if a.Is6() && add {
		msg.Flags = unix.IFA_F_NODAD // usable at once
	}
	req.AddData(msg)
	ip := net.IP(a.AsSlice())
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, ip))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, ip))
	if add {
		req.AddData(nl.NewRtAttr(ifaProto, []byte{addrProto}))
		if a.Is4() {
			if l, err := netlink.LinkByIndex(link); err == nil && l.Attrs().Name == "lo" {
				req.AddData(nl.NewRtAttr(unix.IFA_LABEL, nl.ZeroTerminated("lo:sluice")))
			}
		}
	}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

func (n Netlink) Add(link int, a netip.Addr) error {
	err := n.addrMsg(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, link, a, true)
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%s: %w", a, ErrExists)
	}
	return err
}

func (n Netlink) Del(link int, a netip.Addr) error {
	return n.addrMsg(unix.RTM_DELADDR, 0, link, a, false)
}
