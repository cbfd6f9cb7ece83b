package iptables

import (
	"net/netip"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// The vectors of kernel-modes.md §A.2, which match upstream kube-proxy.
func TestChainNamesHashAsKubeProxyDoes(t *testing.T) {
	spn := lb.ServicePortName{Namespace: "ns1", Name: "svc1", Port: "p80", Protocol: lb.TCP}
	for _, tc := range []struct{ got, want string }{
		{ServiceChain(spn), "KUBE-SVC-XPGD46QRK7WJZT7O"},
		{EndpointChain(spn, netip.MustParseAddrPort("10.180.0.1:80")), "KUBE-SEP-SXIVWICOYRO3J4NJ"},
		{EndpointChain(spn, netip.MustParseAddrPort("10.180.0.2:80")), "KUBE-SEP-LXVODXWDISEETFEF"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	if ServiceChain(spn)[9:] != ExternalChain(spn)[9:] || len(LocalServiceChain(spn)) != 25 || len(FirewallChain(spn)) != 24 {
		t.Error("SVC/SVL/EXT/FW share the port hash")
	}
	if !IsServiceChain("KUBE-SEP-X") || IsServiceChain("KUBE-SERVICES") {
		t.Error("IsServiceChain")
	}
}
