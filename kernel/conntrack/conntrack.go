// Package conntrack owns the removal of stale UDP conntrack entries in the
// kernel modes. A UDP "connection" to a service is a conntrack entry that
// keeps its DNAT until it idles out, so a client that keeps sending keeps
// reaching an endpoint that is gone, or keeps missing endpoints that came
// after its first packet was rejected. After each sync, the entries whose
// translation no longer matches the snapshot are deleted through netlink,
// as kube-proxy's conntrack reconciler does.
package conntrack

import (
	"net/netip"

	"github.com/sluice-proxy/sluice/lb"
)

// Flow is what matters of one conntrack entry: the packet's original
// source and destination, and the source of replies (the endpoint it was
// DNATed to, or the original destination when it was not translated).
type Flow struct {
	Proto    uint8 // 17 for UDP
	OrigSrc  netip.AddrPort
	OrigDst  netip.AddrPort
	ReplySrc netip.AddrPort
}

// ProtoUDP is UDP's IP protocol number.
const ProtoUDP = 17

// Table is what sluice needs of the kernel's conntrack table, for one
// family.
type Table interface {
	// DeleteMatching deletes every UDP entry for which stale reports true,
	// and returns how many it deleted.
	DeleteMatching(stale func(Flow) bool) (int, error)
}

type target struct {
	endpoints map[netip.AddrPort]bool
}

// Stale returns a predicate that says which UDP flows no longer match
// snap: a flow to a service IP:port (ClusterIP, external or load-balancer
// IP) or to a NodePort on an address of this node (isLocal) is stale when
// it was DNATed to an address that is no longer one of the port's usable
// endpoints, or when it was not translated at all (created while the port
// had no endpoints) and the port now has some. Flows to anything else are
// never stale.
func Stale(snap *lb.Snapshot, isLocal func(netip.Addr) bool) func(Flow) bool {
	byVIP := map[netip.AddrPort]*target{}
	byNodePort := map[uint16]*target{}
	for _, sp := range snap.Ports {
		if sp.Name.Protocol != lb.UDP {
			continue
		}
		t := &target{endpoints: map[netip.AddrPort]bool{}}
		for _, ep := range sp.Usable() {
			t.endpoints[ep] = true
		}
		for _, ep := range sp.UsableExternal() {
			t.endpoints[ep] = true
		}
		for _, ip := range sp.ClusterIPs {
			byVIP[netip.AddrPortFrom(ip, sp.Port)] = t
		}
		for _, ip := range sp.ExternalIPs {
			byVIP[netip.AddrPortFrom(ip, sp.Port)] = t
		}
		for _, ip := range sp.LoadBalancerIPs {
			byVIP[netip.AddrPortFrom(ip, sp.Port)] = t
		}
		if sp.NodePort != 0 {
			byNodePort[sp.NodePort] = t
		}
	}
	return func(f Flow) bool {
		if f.Proto != ProtoUDP {
			return false
		}
		t := byVIP[f.OrigDst]
		if t == nil && isLocal != nil && isLocal(f.OrigDst.Addr()) {
			t = byNodePort[f.OrigDst.Port()]
		}
		if t == nil {
			return false
		}
		if f.ReplySrc == f.OrigDst {
			return len(t.endpoints) > 0 // blackholed or rejected before endpoints came
		}
		return !t.endpoints[f.ReplySrc]
	}
}

// Fake is a conntrack table in memory.
type Fake struct {
	Flows []Flow
}

// DeleteMatching removes the matching UDP flows.
func (f *Fake) DeleteMatching(stale func(Flow) bool) (int, error) {
	kept := f.Flows[:0]
	n := 0
	for _, fl := range f.Flows {
		if fl.Proto == ProtoUDP && stale(fl) {
			n++
			continue
		}
		kept = append(kept, fl)
	}
	f.Flows = kept
	return n, nil
}
