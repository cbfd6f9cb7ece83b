// Package lb owns the load-balancing model and its decisions: the immutable
// Snapshot of service ports and endpoints that the control plane publishes,
// the Picker that orders endpoints (round robin with ClientIP affinity), the
// RetryPolicy that bounds connect attempts, and passive ejection of failing
// endpoints. It knows nothing about sockets, Kubernetes objects or iptables.
package lb

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocol is an L4 protocol as Kubernetes spells it.
type Protocol string

// The protocols a service port can use.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// DefaultAffinityTimeout is Kubernetes' default ClientIP affinity timeout (10800s).
const DefaultAffinityTimeout = 10800 * time.Second

// ServicePortName identifies one port of one Service, as kube-proxy does.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the port's name; empty for an unnamed single port
	Protocol  Protocol
}

// String is kube-proxy's form: "ns/name:port", or "ns/name" for an unnamed port.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// Endpoint is one backend address of a service port with its conditions.
// It is 24 bytes, the flags together after the address (issue 16's memory
// budget), and holds no pointer: it holds no node name, only whether the
// node is this one (Local), which is all a data plane reads; the sources
// work it out when they parse an object (a string between the address and
// the flags padded it to 64, a node name was 16 bytes of every endpoint,
// and a netip.AddrPort for the address made it 40).
type Endpoint struct {
	Addr    EndpointAddr
	Ready   bool
	Serving bool
	// Terminating is set when the endpoint is shutting down.
	Terminating bool
	// Local is set when the endpoint runs on this node.
	Local bool
}

// Affinity is a service port's session affinity.
type Affinity struct {
	ClientIP bool
	Timeout  time.Duration // meaningful only when ClientIP is set
}

// ServicePort is one port of one Service, with everything a data plane needs.
//
// The ports and flags are together, in one word, and the external
// addresses, which few ports have, behind one pointer: 144 bytes, where
// the three lists in line made 208 (issue 16's memory budget).
type ServicePort struct {
	Name       ServicePortName
	ClusterIPs []netip.Addr
	// External holds the external and load-balancer IPs and the source
	// ranges; nil when all three are empty (NewExternalAddrs), so that
	// ports built alike compare equal. What it points to never changes:
	// the setters make a new one.
	External *ExternalAddrs
	// Endpoints is sorted by address, as kube-proxy sorts them.
	Endpoints []Endpoint
	Affinity  Affinity
	Port      uint16
	NodePort  uint16
	// HealthCheckNodePort is the Service's healthCheckNodePort (0: none),
	// served per Service by the node's health check server.
	HealthCheckNodePort uint16
	// InternalLocal is internalTrafficPolicy Local: traffic to the
	// ClusterIP goes only to local endpoints.
	InternalLocal bool
	// ExternalLocal is externalTrafficPolicy Local on an externally
	// reachable port: NodePort, external and load-balancer traffic goes
	// only to local endpoints.
	ExternalLocal bool
}

// ExternalAddrs is what few service ports have: external IPs, and
// load-balancer IPs with the ranges their clients may come from; and the
// endpoints topology hints keep from this node's cluster traffic. (The
// last is no address of the port's own, but as rare, and kept here so
// that a port without any of them holds one nil pointer: issue 16's
// memory budget.)
type ExternalAddrs struct {
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// SourceRanges is loadBalancerSourceRanges: when set, traffic to the
	// load-balancer IPs is accepted only from these prefixes.
	SourceRanges []netip.Prefix
	// OutOfTopology are the ready endpoints that the EndpointSlices'
	// topology hints (forNodes, forZones) give to other nodes or zones,
	// sorted: cluster traffic from this node does not go to them
	// (kube-proxy's topology-aware routing; see SetOutOfTopology).
	OutOfTopology []EndpointAddr
}

// NewExternalAddrs holds the three lists, or is nil when all are empty.
func NewExternalAddrs(externalIPs, loadBalancerIPs []netip.Addr, sourceRanges []netip.Prefix) *ExternalAddrs {
	return newRare(externalIPs, loadBalancerIPs, sourceRanges, nil)
}

func newRare(externalIPs, loadBalancerIPs []netip.Addr, sourceRanges []netip.Prefix, out []EndpointAddr) *ExternalAddrs {
	if len(externalIPs) == 0 && len(loadBalancerIPs) == 0 && len(sourceRanges) == 0 && len(out) == 0 {
		return nil
	}
	return &ExternalAddrs{ExternalIPs: externalIPs, LoadBalancerIPs: loadBalancerIPs, SourceRanges: sourceRanges, OutOfTopology: out}
}

// ExternalIPs are the Service's externalIPs.
func (sp *ServicePort) ExternalIPs() []netip.Addr {
	if sp.External == nil {
		return nil
	}
	return sp.External.ExternalIPs
}

// LoadBalancerIPs are the load-balancer ingress IPs.
func (sp *ServicePort) LoadBalancerIPs() []netip.Addr {
	if sp.External == nil {
		return nil
	}
	return sp.External.LoadBalancerIPs
}

// SourceRanges is loadBalancerSourceRanges (see ExternalAddrs).
func (sp *ServicePort) SourceRanges() []netip.Prefix {
	if sp.External == nil {
		return nil
	}
	return sp.External.SourceRanges
}

// OutOfTopology are the endpoints topology hints keep from this node's
// cluster traffic (see ExternalAddrs).
func (sp *ServicePort) OutOfTopology() []EndpointAddr {
	if sp.External == nil {
		return nil
	}
	return sp.External.OutOfTopology
}

// SetExternalIPs, SetLoadBalancerIPs, SetSourceRanges and SetOutOfTopology
// replace one of External's lists, with a new External.
func (sp *ServicePort) SetExternalIPs(ips []netip.Addr) {
	sp.External = newRare(ips, sp.LoadBalancerIPs(), sp.SourceRanges(), sp.OutOfTopology())
}

func (sp *ServicePort) SetLoadBalancerIPs(ips []netip.Addr) {
	sp.External = newRare(sp.ExternalIPs(), ips, sp.SourceRanges(), sp.OutOfTopology())
}

func (sp *ServicePort) SetSourceRanges(ranges []netip.Prefix) {
	sp.External = newRare(sp.ExternalIPs(), sp.LoadBalancerIPs(), ranges, sp.OutOfTopology())
}

// SetOutOfTopology sets the endpoints, sorted, that cluster traffic from
// this node does not go to: those topology hints give to other nodes or
// zones. Local traffic policies and the fallback to serving terminating
// endpoints ignore it, as kube-proxy's CategorizeEndpoints does.
func (sp *ServicePort) SetOutOfTopology(addrs []EndpointAddr) {
	sp.External = newRare(sp.ExternalIPs(), sp.LoadBalancerIPs(), sp.SourceRanges(), addrs)
}

// InTopology reports whether cluster traffic from this node may go to ep
// under the topology hints: false when they give it to other nodes or
// zones.
func (sp *ServicePort) InTopology(ep Endpoint) bool {
	out := sp.OutOfTopology()
	if len(out) == 0 {
		return true
	}
	_, found := slices.BinarySearchFunc(out, ep.Addr, compareEndpointAddr)
	return !found
}

// Usable returns the endpoints cluster (ClusterIP) traffic may go to: the
// ready ones, or, when none is ready, the ones that are serving and
// terminating (kube-proxy's fallback); with InternalLocal, only local ones.
// The result is sorted by address.
func (sp *ServicePort) Usable() []netip.AddrPort { return sp.usable(sp.InternalLocal) }

// UsableExternal is Usable for traffic from outside the cluster (NodePort,
// external and load-balancer IPs), under the external traffic policy.
func (sp *ServicePort) UsableExternal() []netip.AddrPort { return sp.usable(sp.ExternalLocal) }

// SplitPolicy reports whether cluster and external traffic use different
// endpoint sets, which then need pickers of their own.
func (sp *ServicePort) SplitPolicy() bool { return sp.InternalLocal != sp.ExternalLocal }

// Select is kube-proxy's CategorizeEndpoints for one set: with localOnly,
// the local ready endpoints (else the local serving terminating ones);
// otherwise all ready ones (else all serving terminating ones).
func (sp *ServicePort) Select(localOnly bool) []netip.AddrPort { return sp.usable(localOnly) }

// HasUsable reports whether Select(localOnly) would return any endpoint,
// without building the list.
func (sp *ServicePort) HasUsable(localOnly bool) bool {
	for _, ep := range sp.Endpoints {
		if localOnly && ep.Local && (ep.Ready || ep.Serving && ep.Terminating) {
			return true
		}
		if !localOnly && (ep.Ready && sp.InTopology(ep) || ep.Serving && ep.Terminating) {
			return true
		}
	}
	return false
}

// selectEndpoints is Select's endpoints: sp.Endpoints itself when every one
// of them is selected, else a copy of those that are, sized exactly.
func (sp *ServicePort) selectEndpoints(localOnly bool) []Endpoint {
	// Cluster traffic takes the ready endpoints the topology hints leave
	// it (kube-proxy's availableForTopology); local traffic ignores them.
	ready := func(ep Endpoint) bool {
		if localOnly {
			return ep.Ready && ep.Local
		}
		return ep.Ready && sp.InTopology(ep)
	}
	anyReady := false
	for _, ep := range sp.Endpoints {
		anyReady = anyReady || ready(ep)
	}
	// kube-proxy's rule: the ready ones, else the serving terminating ones.
	selected := func(ep Endpoint) bool {
		return ready(ep) || !anyReady && (!localOnly || ep.Local) && ep.Serving && ep.Terminating
	}
	n := 0
	for _, ep := range sp.Endpoints {
		if selected(ep) {
			n++
		}
	}
	switch n {
	case len(sp.Endpoints):
		return sp.Endpoints
	case 0:
		return nil
	}
	out := make([]Endpoint, 0, n)
	for _, ep := range sp.Endpoints {
		if selected(ep) {
			out = append(out, ep)
		}
	}
	return out
}

func (sp *ServicePort) usable(localOnly bool) []netip.AddrPort {
	eps := sp.selectEndpoints(localOnly)
	if len(eps) == 0 {
		return nil
	}
	out := make([]netip.AddrPort, len(eps))
	for i, ep := range eps {
		out[i] = ep.Addr.AddrPort()
	}
	return out
}

// SameFrontend reports whether two service ports listen in the same places,
// so that a listener can be kept across an update.
func (sp *ServicePort) SameFrontend(o *ServicePort) bool {
	return sp.Name == o.Name && sp.Port == o.Port && sp.NodePort == o.NodePort && sp.SplitPolicy() == o.SplitPolicy() &&
		slices.Equal(sp.ClusterIPs, o.ClusterIPs) &&
		slices.Equal(sp.ExternalIPs(), o.ExternalIPs()) &&
		slices.Equal(sp.LoadBalancerIPs(), o.LoadBalancerIPs()) &&
		slices.Equal(sp.SourceRanges(), o.SourceRanges()) // the LB listeners' source check is set at open
}

// Snapshot is one immutable view of every service port. It is published by
// pointer swap; readers never lock and never mutate it.
type Snapshot struct {
	Ports PortMap
	// ID names this snapshot among its source's (0: unnamed). When Base
	// is not 0, this snapshot is the one whose ID is Base with the ports
	// named in Changed added, replaced or removed, and nothing else: a
	// consumer that applied Base may apply only those (issue 16). Changed
	// is sorted by name, each once, and read-only. A full comparison
	// stays correct whatever these say.
	ID, Base uint64
	Changed  []ServicePortName
}

// NewSnapshot returns a snapshot of the ports in m.
func NewSnapshot(m map[ServicePortName]*ServicePort) *Snapshot {
	return &Snapshot{Ports: NewPortMap(m)}
}

// With returns the snapshot that is s with the ports in set added or
// replaced and those in del removed (a name in both is replaced), saying
// so: Base is s's ID and Changed names every port set or removed. The
// caller gives it its ID. Unchanged ports are shared with s.
func (s *Snapshot) With(set map[ServicePortName]*ServicePort, del []ServicePortName) *Snapshot {
	changed := make([]ServicePortName, 0, len(set)+len(del))
	for name := range set {
		changed = append(changed, name)
	}
	for _, name := range del {
		if _, ok := set[name]; !ok {
			changed = append(changed, name)
		}
	}
	// Sorted once here, for every consumer's stable output (each sorted
	// its own copy).
	slices.SortFunc(changed, ServicePortName.Compare)
	changed = slices.Compact(changed) // del may name a port twice
	return &Snapshot{Ports: s.Ports.With(set, del), Base: s.ID, Changed: changed}
}

// DeltaSince returns the names of the ports that differ between the
// snapshot whose ID is id and s (added, replaced or removed; sorted,
// each once, not to be changed), and true,
// when s says it is that snapshot with those changes; false when it does
// not (then compare the whole maps).
func (s *Snapshot) DeltaSince(id uint64) ([]ServicePortName, bool) {
	if s.Base == 0 || id != s.Base {
		return nil, false
	}
	return s.Changed, true
}

// Sorted returns the service ports ordered by name, for stable output.
func (s *Snapshot) Sorted() []*ServicePort {
	out := make([]*ServicePort, 0, s.Ports.Len())
	for _, sp := range s.Ports.All() {
		out = append(out, sp)
	}
	return SortPorts(out)
}

// SortPorts orders ports by name (then protocol) in place and returns them.
func SortPorts(out []*ServicePort) []*ServicePort {
	slices.SortFunc(out, func(a, b *ServicePort) int { return a.Name.Compare(b.Name) })
	return out
}

// Compare orders names as their String forms compare, then by protocol,
// without building the strings (a sort of 10k ports built some 280k).
func (n ServicePortName) Compare(o ServicePortName) int {
	a, b := n.parts(), o.parts()
	i, j := 0, 0 // part indexes
	x, y := 0, 0 // byte offsets in the current parts
	for {
		for i < len(a) && x == len(a[i]) {
			i, x = i+1, 0
		}
		for j < len(b) && y == len(b[j]) {
			j, y = j+1, 0
		}
		switch {
		case i == len(a) && j == len(b):
			return strings.Compare(string(n.Protocol), string(o.Protocol))
		case i == len(a):
			return -1
		case j == len(b):
			return 1
		}
		if c, d := a[i][x], b[j][y]; c != d {
			if c < d {
				return -1
			}
			return 1
		}
		x, y = x+1, y+1
	}
}

// parts are the pieces String joins.
func (n ServicePortName) parts() [5]string {
	if n.Port == "" {
		return [5]string{n.Namespace, "/", n.Name}
	}
	return [5]string{n.Namespace, "/", n.Name, ":", n.Port}
}

// Validate checks the invariants every consumer relies on.
func (sp *ServicePort) Validate() error {
	switch sp.Name.Protocol {
	case TCP, UDP, SCTP:
	default:
		return fmt.Errorf("%s: unsupported protocol %q", sp.Name, sp.Name.Protocol)
	}
	if sp.Port == 0 {
		return fmt.Errorf("%s: port must be 1-65535", sp.Name)
	}
	if sp.Affinity.ClientIP && sp.Affinity.Timeout <= 0 {
		return fmt.Errorf("%s: affinity timeout must be positive", sp.Name)
	}
	return nil
}
