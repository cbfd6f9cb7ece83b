package config

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// helpGroup is one section of --help: the flags whose names match.
type helpGroup struct {
	title string
	match func(name string) bool
}

func named(names ...string) func(string) bool {
	return func(n string) bool {
		for _, x := range names {
			if n == x || (strings.HasSuffix(x, "*") && strings.HasPrefix(n, strings.TrimSuffix(x, "*"))) {
				return true
			}
		}
		return false
	}
}

// helpGroups orders --help by what the flags configure; a flag goes into
// the first group that matches it (a test checks that each one has a
// group).
func helpGroups() []helpGroup {
	return []helpGroup{
		{"Mode and where Services come from", named("proxy-mode", "mode-fallback", "manifests", "manifest-*", "kubeconfig", "master", "kube-api-*",
			"config", "write-config-to", "config-sync-period", "hostname-override", "cleanup", "init-only", "version", "feature-gates", "windows-service",
			"source-vip", "network-name", "enable-dsr", "root-hnsendpoint-name", "forward-healthcheck-vip")},
		{"Userspace mode (sluice's load balancer)", named("engine", "event-loops", "busy-poll", "io-uring", "connect-*", "eject-*", "drain-timeout", "udp-timeout",
			"proxy-port-range", "userspace-capture", "userspace-capture-port", "handover-socket", "bind-address", "bind-address-hard-fail")},
		{"Kernel modes (iptables, nftables, IPVS), as kube-proxy's", named("iptables-*", "ipvs-*", "masquerade-all", "cluster-cidr",
			"detect-local-mode", "pod-*", "nodeport-addresses", "conntrack-*")},
		{"Health, metrics, logging and the process", named("healthz-*", "metrics-*", "logging-format", "v", "vmodule", "log-*",
			"profiling", "show-hidden-metrics-for-version", "oom-score-adj", "boot-id-file", "machine-id-file")},
	}
}

// synopsis opens --help.
const synopsis = `sluice: a drop-in replacement for kube-proxy whose default mode is a userspace
L4 load balancer (round robin, ClientIP affinity, connect retry on another
endpoint); --proxy-mode=iptables|nftables|ipvs programs the kernel as
kube-proxy does. It takes kube-proxy's flags and configuration file.

Usage:
  sluice [flags]                      serve the cluster's Services (in-cluster
                                      credentials, or --kubeconfig / --master)
  sluice --manifests PATH [flags]     serve Services and EndpointSlices from
                                      YAML files (a file or a directory), watched
  sluice --cleanup                    remove what any mode installed, and exit
  sluice status [-o json] [--watch]   what a running sluice serves: service
                                      ports, frontends, endpoints, counters

Examples:
  sluice --manifests examples/demo.yaml
  sluice --config /var/lib/kube-proxy/config.conf --hostname-override=$(hostname)
  sluice --kubeconfig ~/.kube/config --proxy-mode=nftables
`

// usage is the whole --help text: the synopsis, then the flags by group.
func usage(fs *pflag.FlagSet) string {
	var b strings.Builder
	b.WriteString(synopsis)
	done := map[string]bool{}
	for _, g := range helpGroups() {
		sub := pflag.NewFlagSet(g.title, pflag.ContinueOnError)
		fs.VisitAll(func(f *pflag.Flag) {
			if !done[f.Name] && g.match(f.Name) {
				done[f.Name] = true
				sub.AddFlag(f)
			}
		})
		fmt.Fprintf(&b, "\n%s:\n%s", g.title, sub.FlagUsages())
	}
	sub := pflag.NewFlagSet("other", pflag.ContinueOnError)
	fs.VisitAll(func(f *pflag.Flag) {
		if !done[f.Name] {
			sub.AddFlag(f)
		}
	})
	if sub.HasFlags() {
		fmt.Fprintf(&b, "\nOther:\n%s", sub.FlagUsages())
	}
	return b.String()
}
