package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"

	"github.com/sluice-proxy/sluice/lb"
)

// The chains kube-proxy's iptables mode owns, by table.
const (
	ChainServices         = "KUBE-SERVICES"
	ChainExternalServices = "KUBE-EXTERNAL-SERVICES"
	ChainNodePorts        = "KUBE-NODEPORTS"
	ChainForward          = "KUBE-FORWARD"
	ChainProxyFirewall    = "KUBE-PROXY-FIREWALL"
	ChainPostrouting      = "KUBE-POSTROUTING"
	ChainMarkMasq         = "KUBE-MARK-MASQ"
	ChainCanary           = "KUBE-PROXY-CANARY"
	ChainFirewall         = "KUBE-FIREWALL"
)

// The per-service chain prefixes.
const (
	prefixSVC = "KUBE-SVC-"
	prefixSVL = "KUBE-SVL-"
	prefixEXT = "KUBE-EXT-"
	prefixFW  = "KUBE-FW-"
	prefixSEP = "KUBE-SEP-"
)

// IsServiceChain reports whether a chain is one of the per-service chains
// (SVC, SVL, EXT, FW, SEP): those are garbage-collected when unused and
// removed by --cleanup.
func IsServiceChain(name string) bool {
	for _, p := range []string{prefixSVC, prefixSVL, prefixEXT, prefixFW, prefixSEP} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func portProtoHash(name lb.ServicePortName) string {
	return hash16(name.String() + strings.ToLower(string(name.Protocol)))
}

// ServiceChain is KUBE-SVC-<hash>: cluster-wide load balancing of a port.
func ServiceChain(name lb.ServicePortName) string { return prefixSVC + portProtoHash(name) }

// LocalServiceChain is KUBE-SVL-<hash>: load balancing over local endpoints.
func LocalServiceChain(name lb.ServicePortName) string { return prefixSVL + portProtoHash(name) }

// ExternalChain is KUBE-EXT-<hash>: traffic from outside the cluster.
func ExternalChain(name lb.ServicePortName) string { return prefixEXT + portProtoHash(name) }

// FirewallChain is KUBE-FW-<hash>: loadBalancerSourceRanges.
func FirewallChain(name lb.ServicePortName) string { return prefixFW + portProtoHash(name) }

// EndpointChain is KUBE-SEP-<hash> of one endpoint of a port; the endpoint
// is written as net.JoinHostPort writes it (IPv6 bracketed).
func EndpointChain(name lb.ServicePortName, ep netip.AddrPort) string {
	return prefixSEP + hash16(name.String()+strings.ToLower(string(name.Protocol))+ep.String())
}
