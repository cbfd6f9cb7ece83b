package nfacct

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// nfnetlink_acct's message types and attributes (linux/netfilter/nfnetlink_acct.h).
const (
	subsysAcct = 7 // NFNL_SUBSYS_ACCT
	msgNew     = 0 // NFNL_MSG_ACCT_NEW
	msgGet     = 1 // NFNL_MSG_ACCT_GET
	attrName   = 1 // NFACCT_NAME
	attrPkts   = 2 // NFACCT_PKTS
)

// Netlink is the kernel's table, over NETLINK_NETFILTER.
type Netlink struct{}

func request(msg, flags int, name string) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(subsysAcct<<8|msg, flags|unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(attrName, nl.ZeroTerminated(name)))
	return req
}

func (Netlink) Ensure(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := request(msgNew, unix.NLM_F_CREATE, name).Execute(unix.NETLINK_NETFILTER, 0)
	if errors.Is(err, unix.EBUSY) {
		return nil // it exists (the kernel answers EBUSY unless asked to replace it)
	}
	if err != nil {
		return fmt.Errorf("nfacct: create %s: %w (is nfnetlink_acct available?)", name, err)
	}
	return nil
}

func (Netlink) Packets(name string) (uint64, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	msgs, err := request(msgGet, 0, name).Execute(unix.NETLINK_NETFILTER, subsysAcct<<8|msgNew)
	if errors.Is(err, unix.ENOENT) {
		return 0, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("nfacct: read %s: %w", name, err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return 0, fmt.Errorf("nfacct: read %s: %w", name, err)
		}
		for _, a := range attrs {
			if a.Attr.Type&^unix.NLA_F_NESTED == attrPkts && len(a.Value) == 8 {
				return binary.BigEndian.Uint64(a.Value), nil
			}
		}
	}
	return 0, fmt.Errorf("nfacct: read %s: no packet count in the kernel's answer", name)
}
