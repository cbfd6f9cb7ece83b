package main

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"

	"testing"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/kernel/ipvs"
	"github.com/sluice-proxy/sluice/kernel/netnstest"
	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
)

// ipvsBed is an IPVS plane on fakes: its kernel table, its sets, and
// kube-ipvs0, whose addresses the host's address list includes beside
// the node's own (extra).
type ipvsBed struct {
	plane  *ipvsPlane
	kernel *ipvs.Fake
	sets   *ipvs.FakeIPSet
	addrs  *portals.FakeAddrTable
	extra  []netip.Addr
}

func newIPVSBed(t *testing.T) *ipvsBed {
	bed := &ipvsBed{kernel: ipvs.NewFake(), sets: ipvs.NewFakeIPSet(), addrs: portals.NewFakeAddrTable(),
		extra: []netip.Addr{netip.MustParseAddr("192.168.0.2")}}
	bed.restart(t)
	return bed
}

// restart gives the bed a new plane over the same kernel state, as a
// restarted sluice.
func (bed *ipvsBed) restart(t *testing.T) {
	b := &portals.Binder{Table: bed.addrs, Interface: ipvsInterface, DummyOnly: true}
	if _, err := b.Init(); err != nil {
		t.Fatal(err)
	}
	local := &localAddrs{dump: func() ([]net.Addr, error) {
		var out []net.Addr
		for _, a := range slices.Concat(bed.extra, bed.addrs.All(ipvsInterface)) {
			out = append(out, &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
		}
		return out, nil
	}}
	bed.plane = &ipvsPlane{cfg: config.Defaults(), local: local, metrics: admin.NewMetrics(), binder: b,
		log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		loopback: loopbackWarner{mode: "ipvs", log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		proxiers: []*ipvs.Proxier{{Kernel: bed.kernel}},
		filters:  []*ipvs.Netfilter{{Sets: bed.sets, IPTables: iptables.NewFake(), MasqueradeBit: 14}},
		backoff:  syncBackoff{max: 1}}
}

// state is everything the plane programs, as text.
func (bed *ipvsBed) state() string {
	var b strings.Builder
	b.WriteString(bed.kernel.Dump())
	fmt.Fprintln(&b, "kube-ipvs0:", bed.addrs.All(ipvsInterface))
	for _, n := range []string{ipvs.SetClusterIP, ipvs.SetExternalIP, ipvs.SetNodePortTCP, ipvs.SetNodePortUDP, ipvs.SetLoadBalancer, ipvs.SetIPVSIPs, ipvs.SetLoopBack} {
		fmt.Fprintln(&b, n, bed.sets.Entries(n))
	}
	return b.String()
}

// apply is what the applier does per update: refresh the host's
// addresses, then Apply (or the resync's full comparison).
func (bed *ipvsBed) apply(snap *lb.Snapshot, full bool) error {
	bed.plane.local.refresh()
	if full {
		return bed.plane.reapplyNewest(bed.plane.applyLocked)
	}
	return bed.plane.Apply(snap)
}

// IPVS mode's updates, which touch only what changed, leave the virtual
// servers, kube-ipvs0's addresses and the sets that a freshly started
// plane's first sync, which compares everything, leaves: through random changes, skipped snapshots,
// external IPs that become and stop being the host's own, and new node
// addresses. (In a private network namespace: each sync also reconciles
// conntrack.)
func TestIPVSPlaneUpdatesLeaveWhatResyncsLeave(t *testing.T) {
	netnstest.Run(t, func() error {
		rng := rand.New(rand.NewPCG(41, 42))
		eip := netip.MustParseAddr("203.0.113.1")
		for round := range 4 {
			withDelta, compared := newIPVSBed(t), newIPVSBed(t)
			ports := map[lb.ServicePortName]*lb.ServicePort{}
			for j := range 6 {
				sp := tallyPort(rng, j)
				ports[sp.Name] = sp
			}
			cur := lb.NewSnapshot(ports)
			cur.ID = 1
			for step := range 30 {
				cur = randomChange(rng, cur, 3, 4, func() *lb.ServicePort {
					sp := tallyPort(rng, rng.IntN(8))
					if rng.IntN(3) == 0 {
						sp.SetExternalIPs([]netip.Addr{eip})
					}
					return sp
				})
				if rng.IntN(8) == 0 {
					continue
				}
				switch rng.IntN(12) { // the host's own addresses change
				case 0:
					withDelta.extra = append(withDelta.extra, eip)
					compared.extra = append(compared.extra, eip)
				case 1:
					withDelta.extra, compared.extra = withDelta.extra[:1], compared.extra[:1]
				case 2:
					n := netip.MustParseAddr("192.168.0.3")
					withDelta.extra, compared.extra = append(withDelta.extra, n), append(compared.extra, n)
				}
				errd := withDelta.apply(cur, false)
				compared.restart(t) // nothing remembered: compare everything from scratch
				compared.plane.last = &lb.Snapshot{Ports: cur.Ports}
				errc := compared.apply(nil, true)
				if errd != nil || errc != nil {
					return fmt.Errorf("round %d step %d: %v, %v", round, step, errd, errc)
				}
				if got, want := withDelta.state(), compared.state(); got != want {
					return fmt.Errorf("round %d step %d:\n%s\nwant\n%s", round, step, got, want)
				}
			}
		}
		return nil
	})
}
