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

// appendHash16 appends kube-proxy's chain-name hash of b to dst: the first
// 16 characters of the base32 of its SHA-256.
func appendHash16(dst, b []byte) []byte {
	sum := sha256.Sum256(b)
	var enc [56]byte
	base32.StdEncoding.Encode(enc[:], sum[:])
	return append(dst, enc[:16]...)
}

// chainName is prefix followed by the hash of b, made with one allocation.
func chainName(prefix string, b []byte) string {
	var buf [32]byte
	return string(appendHash16(append(buf[:0], prefix...), b))
}

// appendPortProto appends what a port's chain names hash: its name as
// ServicePortName.String writes it, then its protocol in lower case.
func appendPortProto(b []byte, name lb.ServicePortName) []byte {
	b = append(b, name.Namespace...)
	b = append(b, '/')
	b = append(b, name.Name...)
	if name.Port != "" {
		b = append(b, ':')
		b = append(b, name.Port...)
	}
	for _, c := range []byte(name.Protocol) {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// portChain is one of a port's own chains: prefix and the port's hash.
func portChain(prefix string, name lb.ServicePortName) string {
	var buf [128]byte
	return chainName(prefix, appendPortProto(buf[:0], name))
}

// ServiceChain is KUBE-SVC-<hash>: cluster-wide load balancing of a port.
func ServiceChain(name lb.ServicePortName) string { return portChain(prefixSVC, name) }

// LocalServiceChain is KUBE-SVL-<hash>: load balancing over local endpoints.
func LocalServiceChain(name lb.ServicePortName) string { return portChain(prefixSVL, name) }

// ExternalChain is KUBE-EXT-<hash>: traffic from outside the cluster.
func ExternalChain(name lb.ServicePortName) string { return portChain(prefixEXT, name) }

// FirewallChain is KUBE-FW-<hash>: loadBalancerSourceRanges.
func FirewallChain(name lb.ServicePortName) string { return portChain(prefixFW, name) }

// EndpointChain is KUBE-SEP-<hash> of one endpoint of a port; the endpoint
// is written as net.JoinHostPort writes it (IPv6 bracketed).
func EndpointChain(name lb.ServicePortName, ep netip.AddrPort) string {
	var buf [128]byte
	return endpointChain(appendPortProto(buf[:0], name), ep)
}

// endpointChain is EndpointChain from the port's appendPortProto.
func endpointChain(portProto []byte, ep netip.AddrPort) string {
	var buf [192]byte
	b := append(buf[:0], portProto...)
	return chainName(prefixSEP, ep.AppendTo(b))
}
