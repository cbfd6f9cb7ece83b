package portals

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sluice-proxy/sluice/kernel/netnstest"
)

// The real netlink table: addresses are marked, listed back, pruned, and
// an unmarked address another tool added is never listed or removed.
func TestNetlinkBinderInPrivateNetns(t *testing.T) {
	netnstest.Run(t, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		foreign := netip.MustParseAddr("192.0.2.77")
		a, _ := netlink.ParseAddr(foreign.String() + "/32")
		if err := netlink.AddrAdd(lo, a); err != nil {
			return err
		}
		tbl := Netlink{}
		b := &Binder{Table: tbl}
		why, err := b.Init()
		if err != nil {
			return err
		}
		t.Logf("bind capture interface: %s", why)
		want := []netip.Addr{vip, vip6, foreign}
		if err := b.Ensure(want); err != nil {
			return err
		}
		if err := b.Ensure(want); err != nil { // idempotent
			return err
		}
		owned, err := tbl.Owned(b.link)
		if err != nil {
			return err
		}
		slices.SortFunc(owned, netip.Addr.Compare)
		if !slices.Equal(owned, []netip.Addr{vip, vip6}) {
			t.Errorf("owned %v, want the two VIPs and not the foreign address", owned)
		}
		if err := b.Prune([]netip.Addr{vip}); err != nil {
			return err
		}
		if owned, _ := tbl.Owned(b.link); !slices.Equal(owned, []netip.Addr{vip}) {
			t.Errorf("after prune owned %v", owned)
		}
		for i := 0; i < 2; i++ {
			if err := CleanupAddrs(tbl, ""); err != nil {
				return err
			}
		}
		if owned, _ := tbl.Owned(lo.Attrs().Index); len(owned) != 0 {
			t.Errorf("cleanup left %v on lo", owned)
		}
		addrs, err := netlink.AddrList(lo, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		found := false
		for _, a := range addrs {
			if a.IP.Equal(foreign.AsSlice()) {
				found = true
			}
		}
		if !found {
			t.Errorf("cleanup removed the foreign address %s", foreign)
		}
		return nil
	})
}
