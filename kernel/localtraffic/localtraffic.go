// Package localtraffic owns kube-proxy's --detect-local-mode: the match
// that tells traffic from this cluster's (or this node's) pods apart from
// the rest, which the kernel modes use twice per service: to masquerade
// traffic to a cluster IP that comes from outside the pods, and to let pod
// traffic to an external-policy-Local service's external IPs take the
// cluster path. kube-proxy's four modes give one of three matches: a
// source CIDR (ClusterCIDR, from --cluster-cidr; NodeCIDR, from the
// Node's spec.podCIDRs), an input interface (BridgeInterface), or an input
// interface name prefix (InterfaceNamePrefix). The words are kube-proxy's
// (pkg/proxy/util/localdetector.go), so rule dumps compare line for line.
package localtraffic

import "net/netip"

// Match is what makes a packet local: set at most one of CIDR and
// Interface. The zero Match matches nothing, and the rules that need one
// are left out (kube-proxy's no-op detector).
type Match struct {
	// CIDR is the pods' source range, for one IP family.
	CIDR netip.Prefix
	// Interface is the input interface's name, or with Prefix the start
	// of the names of the pods' interfaces.
	Interface string
	Prefix    bool
}

// ByCIDR matches the source range p.
func ByCIDR(p netip.Prefix) Match { return Match{CIDR: p} }

// ByInterface matches packets that came in on the interface name.
func ByInterface(name string) Match { return Match{Interface: name} }

// ByInterfacePrefix matches packets that came in on an interface whose
// name starts with prefix.
func ByInterfacePrefix(prefix string) Match { return Match{Interface: prefix, Prefix: true} }

// IsSet reports whether m matches anything.
func (m Match) IsSet() bool { return m.CIDR.IsValid() || m.Interface != "" }

// IPTables returns the iptables match: -s CIDR, -i NAME or -i PREFIX+,
// preceded by "!" when negated.
func (m Match) IPTables(negate bool) []string {
	var out []string
	if negate {
		out = append(out, "!")
	}
	switch {
	case m.CIDR.IsValid():
		return append(out, "-s", m.CIDR.String())
	case m.Prefix:
		return append(out, "-i", m.Interface+"+")
	case m.Interface != "":
		return append(out, "-i", m.Interface)
	}
	return nil
}

// NFT returns the nftables match as kube-proxy writes it: "ip saddr CIDR"
// (ip6 for IPv6), "iifname NAME" or "iifname PREFIX*", with "!=" before
// the value when negated.
func (m Match) NFT(negate bool) string {
	var key, value string
	switch {
	case m.CIDR.IsValid():
		key, value = "ip saddr", m.CIDR.String()
		if m.CIDR.Addr().Is6() {
			key = "ip6 saddr"
		}
	case m.Prefix:
		key, value = "iifname", m.Interface+"*"
	case m.Interface != "":
		key, value = "iifname", m.Interface
	default:
		return ""
	}
	if negate {
		return key + " != " + value
	}
	return key + " " + value
}

// String describes m for logs and errors.
func (m Match) String() string {
	switch {
	case m.CIDR.IsValid():
		return "source " + m.CIDR.String()
	case m.Prefix:
		return "input interface " + m.Interface + "*"
	case m.Interface != "":
		return "input interface " + m.Interface
	}
	return "none"
}
