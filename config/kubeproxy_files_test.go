package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Real-world KubeProxyConfiguration files decode as kube-proxy v1.34
// decodes them: kubeadm's output (every field written, "0s" and null for
// the defaults) is accepted with kube-proxy's defaults; fields removed
// since (udpIdleTimeout, conntrack.max) or never there, and duplicate
// keys, are accepted leniently with a warning; an unknown apiVersion or a
// wrong type is refused. kubeadm's files were refused outright before
// ("0s" is not a valid sync period), which made a kubeadm cluster's
// ConfigMap unusable.
func TestKubeProxyConfigFilesDecodeAsKubeProxyDoes(t *testing.T) {
	cases := []struct {
		file    string
		refused string // part of the error; "" when accepted
		warns   []string
		check   func(t *testing.T, c *Config)
	}{
		{file: "kubeadm-v1.29.yaml", check: func(t *testing.T, c *Config) {
			kp := c.KubeProxy
			if kp.IPTables.SyncPeriod.Duration != 30*time.Second || kp.IPTables.MinSyncPeriod.Duration != time.Second ||
				kp.IPVS.SyncPeriod.Duration != 30*time.Second || kp.ConfigSyncPeriod.Duration != 15*time.Minute {
				t.Fatalf("zero durations not defaulted: %+v %+v %s", kp.IPTables, kp.IPVS, kp.ConfigSyncPeriod)
			}
			if kp.HealthzBindAddress != "0.0.0.0:10256" || kp.MetricsBindAddress != "127.0.0.1:10249" {
				t.Fatalf("addresses: %s %s", kp.HealthzBindAddress, kp.MetricsBindAddress)
			}
			if kp.ClientConnection.QPS != 5 || kp.ClientConnection.Burst != 10 || kp.ClientConnection.ContentType != "application/vnd.kubernetes.protobuf" ||
				kp.ClientConnection.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" {
				t.Fatalf("client connection: %+v", kp.ClientConnection)
			}
			if *kp.IPTables.MasqueradeBit != 14 || *kp.OOMScoreAdj != -999 || *kp.Conntrack.MaxPerCore != 32768 || kp.Conntrack.TCPCloseWaitTimeout.Duration != time.Hour {
				t.Fatalf("nil pointers not defaulted")
			}
			if kp.ClusterCIDR != "10.244.0.0/16" || c.Mode() != ModeUserspace {
				t.Fatalf("clusterCIDR %q mode %q", kp.ClusterCIDR, c.Mode())
			}
		}},
		{file: "kubeadm-v1.20.yaml", warns: []string{"udpIdleTimeout"}, check: func(t *testing.T, c *Config) {
			if c.KubeProxy.IPTables.SyncPeriod.Duration != 30*time.Second || c.KubeProxy.ClusterCIDR != "192.168.0.0/16" {
				t.Fatalf("%+v", c.KubeProxy.IPTables)
			}
		}},
		{file: "hand-written-ipvs.yaml", warns: []string{"unknown field"}, check: func(t *testing.T, c *Config) {
			kp := c.KubeProxy
			if c.Mode() != ModeIPVS || kp.IPVS.MinSyncPeriod.Duration != 5*time.Second || kp.IPTables.MinSyncPeriod.Duration != time.Second {
				t.Fatalf("mode %s ipvs %+v iptables %+v", c.Mode(), kp.IPVS, kp.IPTables)
			}
			if kp.MetricsBindAddress != "127.0.0.1:10249" || kp.BindAddress != "10.0.0.7" || kp.HostnameOverride != "node-7" {
				t.Fatalf("metrics %s bind %s host %s", kp.MetricsBindAddress, kp.BindAddress, kp.HostnameOverride)
			}
		}},
		{file: "duplicate-key.yaml", warns: []string{"already set"}, check: func(t *testing.T, c *Config) {
			if c.Mode() != ModeIPVS {
				t.Fatalf("mode %s, want the last one (ipvs)", c.Mode())
			}
		}},
		{file: "ipv6-node.yaml", check: func(t *testing.T, c *Config) {
			if c.KubeProxy.HealthzBindAddress != "[::]:10256" || c.KubeProxy.MetricsBindAddress != "[::1]:10249" {
				t.Fatalf("IPv6 addresses: %s %s", c.KubeProxy.HealthzBindAddress, c.KubeProxy.MetricsBindAddress)
			}
		}},
		{file: "componentconfig-v1alpha1.yaml", refused: "componentconfig/v1alpha1"},
		{file: "wrong-type.yaml", refused: "qps"},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join("testdata", "kube-proxy", tc.file)
			c, _, err := Parse([]string{"--config", path})
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), path) {
					t.Fatalf("error %v, want one naming %s and %q", err, path, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if len(tc.warns) == 0 && len(c.ConfigWarnings) > 0 {
				t.Fatalf("warnings for a file kube-proxy decodes strictly: %v", c.ConfigWarnings)
			}
			for _, w := range tc.warns {
				if len(c.ConfigWarnings) != 1 || !strings.Contains(c.ConfigWarnings[0], w) || !strings.Contains(c.ConfigWarnings[0], "lenient") {
					t.Fatalf("warnings %v, want one on lenient decoding naming %q", c.ConfigWarnings, w)
				}
			}
			tc.check(t, c)
		})
	}
}
