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

// IP protocol numbers of the flows that are cleaned: UDP and SCTP, as
// kube-proxy cleans them (TCP recovers by itself: a dead endpoint resets).
const (
	ProtoUDP  = 17
	ProtoSCTP = 132
)

func protoNumber(p lb.Protocol) uint8 {
	switch p {
	case lb.UDP:
		return ProtoUDP
	case lb.SCTP:
		return ProtoSCTP
	}
	return 0
}

// Table is what sluice needs of the kernel's conntrack table, for one
// family.
type Table interface {
	// DeleteMatching deletes every UDP and SCTP entry for which stale
	// reports true, and returns how many it deleted.
	DeleteMatching(stale func(Flow) bool) (int, error)
}

type target struct {
	endpoints map[netip.AddrPort]bool
}

type vipKey struct {
	proto uint8
	dst   netip.AddrPort
}

type nodePortKey struct {
	proto uint8
	port  uint16
}

// Stale returns a predicate that says which UDP flows no longer match
// snap: a flow to a service IP:port (ClusterIP, external or load-balancer
// IP) or to a NodePort on an address of this node (isLocal) is stale when
// it was DNATed to an address that is no longer one of the port's usable
// endpoints, or when it was not translated at all (created while the port
// had no endpoints) and the port now has some. Flows to anything else are
// never stale.
func Stale(snap *lb.Snapshot, isLocal func(netip.Addr) bool) func(Flow) bool {
	byVIP := map[vipKey]*target{}
	byNodePort := map[nodePortKey]*target{}
	for _, sp := range snap.Ports.All() {
		proto := protoNumber(sp.Name.Protocol)
		if proto == 0 {
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
			byVIP[vipKey{proto, netip.AddrPortFrom(ip, sp.Port)}] = t
		}
		for _, ip := range sp.ExternalIPs() {
			byVIP[vipKey{proto, netip.AddrPortFrom(ip, sp.Port)}] = t
		}
		for _, ip := range sp.LoadBalancerIPs() {
			byVIP[vipKey{proto, netip.AddrPortFrom(ip, sp.Port)}] = t
		}
		if sp.NodePort != 0 {
			byNodePort[nodePortKey{proto, sp.NodePort}] = t
		}
	}
	return func(f Flow) bool {
		if f.Proto != ProtoUDP && f.Proto != ProtoSCTP {
			return false
		}
		t := byVIP[vipKey{f.Proto, f.OrigDst}]
		if t == nil && isLocal != nil && isLocal(f.OrigDst.Addr()) {
			t = byNodePort[nodePortKey{f.Proto, f.OrigDst.Port()}]
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

// DeleteMatching removes the matching UDP and SCTP flows.
func (f *Fake) DeleteMatching(stale func(Flow) bool) (int, error) {
	kept := f.Flows[:0]
	n := 0
	for _, fl := range f.Flows {
		if (fl.Proto == ProtoUDP || fl.Proto == ProtoSCTP) && stale(fl) {
			n++
			continue
		}
		kept = append(kept, fl)
	}
	f.Flows = kept
	return n, nil
}
