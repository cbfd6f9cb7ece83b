package main

import (
	"net/netip"
	"strings"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/localtraffic"
)

// localMatch is kube-proxy's getLocalDetectors for one family: what
// --detect-local-mode says marks traffic from pods. ClusterCIDR takes the
// family's --cluster-cidr, NodeCIDR the family's CIDR of the Node's
// spec.podCIDRs (podCIDRs), the interface modes their interface for both
// families. A mode with nothing for the family matches nothing, and the
// rules that need a match are left out, as kube-proxy's no-op detector.
func localMatch(cfg *config.Config, v6 bool, podCIDRs []string) localtraffic.Match {
	kp := &cfg.KubeProxy
	byCIDR := func(list []string) localtraffic.Match {
		for _, s := range list {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() == v6 {
				return localtraffic.ByCIDR(p.Masked())
			}
		}
		return localtraffic.Match{}
	}
	switch kp.DetectLocalMode {
	case "ClusterCIDR", "":
		return byCIDR(strings.Split(kp.ClusterCIDR, ","))
	case "NodeCIDR":
		return byCIDR(podCIDRs)
	case "BridgeInterface":
		return localtraffic.ByInterface(kp.DetectLocal.BridgeInterface)
	case "InterfaceNamePrefix":
		return localtraffic.ByInterfacePrefix(kp.DetectLocal.InterfaceNamePrefix)
	}
	return localtraffic.Match{}
}
