package config

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// ConfigzGroup is the key kube-proxy's /configz gives its configuration
// under; SluiceConfigzGroup is the one sluice gives its own settings under,
// beside it.
const (
	ConfigzGroup       = "kubeproxy.config.k8s.io"
	SluiceConfigzGroup = "config.sluice-proxy.io"
)

// Configz is what the metrics server's /configz serves, as kube-proxy's
// does: the configuration in effect (defaults, file and flags merged)
// under ConfigzGroup, in the shape kube-proxy v1.34 serves it there (its
// internal configuration type, whose fields have Go's names, not the file's:
// the conntrack settings under Linux, one SyncPeriod and MinSyncPeriod
// taken from the mode's section, --cluster-cidr split into
// DetectLocal.ClusterCIDRs), and sluice's own settings under
// SluiceConfigzGroup, as a SluiceConfiguration document holds them.
func (c *Config) Configz() map[string]any {
	kp := &c.KubeProxy
	sync, minSync := c.SyncPeriods()
	masqueradeAll := kp.IPTables.MasqueradeAll
	if c.Mode() == ModeNFTables {
		masqueradeAll = kp.NFTables.MasqueradeAll
	}
	var clusterCIDRs []string
	if kp.ClusterCIDR != "" {
		clusterCIDRs = strings.Split(kp.ClusterCIDR, ",")
	}
	logging := *kp.Logging.DeepCopy()
	logging.Format, logging.Verbosity = c.LogFormat, logsapi.VerbosityLevel(max(c.Verbosity, 0))
	logsapi.SetRecommendedLoggingConfiguration(&logging)
	d := func(p *metav1.Duration) metav1.Duration {
		if p == nil {
			return metav1.Duration{}
		}
		return *p
	}
	deref := func(p *int32) int32 {
		if p == nil {
			return 0
		}
		return *p
	}
	type conntrack struct {
		MaxPerCore, Min                            int32
		TCPEstablishedTimeout, TCPCloseWaitTimeout metav1.Duration
		TCPBeLiberal                               bool
		UDPTimeout, UDPStreamTimeout               metav1.Duration
	}
	type internal struct {
		Linux struct {
			Conntrack     conntrack
			MasqueradeAll bool
			OOMScoreAdj   *int32
		}
		Windows          struct{ RunAsService bool }
		FeatureGates     map[string]bool
		ClientConnection struct {
			Kubeconfig, AcceptContentTypes, ContentType string
			QPS                                         float32
			Burst                                       int32
		}
		Logging                                logsapi.LoggingConfiguration
		HostnameOverride, BindAddress          string
		HealthzBindAddress, MetricsBindAddress string
		BindAddressHardFail, EnableProfiling   bool
		ShowHiddenMetricsForVersion, Mode      string
		IPTables                               struct {
			MasqueradeBit      *int32
			LocalhostNodePorts *bool
		}
		IPVS struct {
			Scheduler                             string
			ExcludeCIDRs                          []string
			StrictARP                             bool
			TCPTimeout, TCPFinTimeout, UDPTimeout metav1.Duration
		}
		Winkernel struct {
			NetworkName, SourceVip string
			EnableDSR              bool
			RootHnsEndpointName    string
			ForwardHealthCheckVip  bool
		}
		NFTables        struct{ MasqueradeBit *int32 }
		DetectLocalMode string
		DetectLocal     struct {
			BridgeInterface     string
			ClusterCIDRs        []string
			InterfaceNamePrefix string
		}
		NodePortAddresses                           []string
		SyncPeriod, MinSyncPeriod, ConfigSyncPeriod metav1.Duration
	}
	var in internal
	in.Linux.Conntrack = conntrack{deref(kp.Conntrack.MaxPerCore), deref(kp.Conntrack.Min), d(kp.Conntrack.TCPEstablishedTimeout),
		d(kp.Conntrack.TCPCloseWaitTimeout), kp.Conntrack.TCPBeLiberal, kp.Conntrack.UDPTimeout, kp.Conntrack.UDPStreamTimeout}
	in.Linux.MasqueradeAll, in.Linux.OOMScoreAdj = masqueradeAll, kp.OOMScoreAdj
	in.Windows.RunAsService = kp.WindowsRunAsService
	in.FeatureGates = kp.FeatureGates
	cc := &kp.ClientConnection
	in.ClientConnection.Kubeconfig, in.ClientConnection.AcceptContentTypes, in.ClientConnection.ContentType = cc.Kubeconfig, cc.AcceptContentTypes, cc.ContentType
	in.ClientConnection.QPS, in.ClientConnection.Burst = cc.QPS, cc.Burst
	in.Logging = logging
	in.HostnameOverride, in.BindAddress, in.HealthzBindAddress, in.MetricsBindAddress = kp.HostnameOverride, kp.BindAddress, c.HealthzAddress(), c.MetricsAddress()
	in.BindAddressHardFail, in.EnableProfiling = kp.BindAddressHardFail, kp.EnableProfiling
	in.ShowHiddenMetricsForVersion, in.Mode = kp.ShowHiddenMetricsForVersion, c.Mode()
	in.IPTables.MasqueradeBit, in.IPTables.LocalhostNodePorts = kp.IPTables.MasqueradeBit, kp.IPTables.LocalhostNodePorts
	in.IPVS.Scheduler, in.IPVS.ExcludeCIDRs, in.IPVS.StrictARP = kp.IPVS.Scheduler, kp.IPVS.ExcludeCIDRs, kp.IPVS.StrictARP
	in.IPVS.TCPTimeout, in.IPVS.TCPFinTimeout, in.IPVS.UDPTimeout = kp.IPVS.TCPTimeout, kp.IPVS.TCPFinTimeout, kp.IPVS.UDPTimeout
	w := &kp.Winkernel
	in.Winkernel.NetworkName, in.Winkernel.SourceVip, in.Winkernel.EnableDSR = w.NetworkName, w.SourceVip, w.EnableDSR
	in.Winkernel.RootHnsEndpointName, in.Winkernel.ForwardHealthCheckVip = w.RootHnsEndpointName, w.ForwardHealthCheckVip
	in.NFTables.MasqueradeBit = kp.NFTables.MasqueradeBit
	in.DetectLocalMode = string(kp.DetectLocalMode)
	in.DetectLocal.BridgeInterface, in.DetectLocal.ClusterCIDRs, in.DetectLocal.InterfaceNamePrefix = kp.DetectLocal.BridgeInterface, clusterCIDRs, kp.DetectLocal.InterfaceNamePrefix
	in.NodePortAddresses = kp.NodePortAddresses
	in.SyncPeriod, in.MinSyncPeriod, in.ConfigSyncPeriod = metav1.Duration{Duration: sync}, metav1.Duration{Duration: minSync}, kp.ConfigSyncPeriod
	return map[string]any{ConfigzGroup: in, SluiceConfigzGroup: sluiceConfigurationOf(c)}
}
