package config

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// mapStringBool is kube-proxy's --feature-gates type: "A=true,B=false".
type mapStringBool struct{ m *map[string]bool }

func (v mapStringBool) String() string {
	if v.m == nil || *v.m == nil {
		return ""
	}
	var parts []string
	for k, b := range *v.m {
		parts = append(parts, fmt.Sprintf("%s=%t", k, b))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (v mapStringBool) Set(s string) error {
	if *v.m == nil {
		*v.m = map[string]bool{}
	}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q is not key=true|false", kv)
		}
		b, err := strconv.ParseBool(val)
		if err != nil {
			return fmt.Errorf("%q: value must be true or false", kv)
		}
		(*v.m)[k] = b
	}
	return nil
}

func (mapStringBool) Type() string { return "mapStringBool" }

// durationList is a comma-separated list of durations.
type durationList struct{ d *[]time.Duration }

func (v durationList) String() string {
	var parts []string
	for _, d := range *v.d {
		parts = append(parts, d.String())
	}
	return strings.Join(parts, ",")
}

func (v durationList) Set(s string) error {
	var out []time.Duration
	for _, part := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		out = append(out, d)
	}
	*v.d = out
	return nil
}

func (durationList) Type() string { return "durations" }

// proxyMode accepts "" as kube-proxy does ("best available" = userspace here).
type proxyMode struct{ m *kpv1alpha1.ProxyMode }

func (v proxyMode) String() string { return string(*v.m) }
func (v proxyMode) Set(s string) error {
	if s == "" {
		s = ModeUserspace
	}
	*v.m = kpv1alpha1.ProxyMode(s)
	return nil
}
func (proxyMode) Type() string { return "ProxyMode" }

// quantity is kube-proxy's quantity flag type (512, 1K, 2Ki, 3M), whose
// String does not change the value: a Quantity's own String caches its
// text in it, which made a configuration differ from an equal one.
type quantity struct{ q *resource.QuantityValue }

func (v quantity) String() string {
	q := v.q.Quantity
	return q.String()
}
func (v quantity) Set(s string) error { return v.q.Set(s) }
func (quantity) Type() string         { return "quantity" }

type localMode struct{ m *kpv1alpha1.LocalMode }

func (v localMode) String() string     { return string(*v.m) }
func (v localMode) Set(s string) error { *v.m = kpv1alpha1.LocalMode(s); return nil }
func (localMode) Type() string         { return "LocalMode" }

// flagUse says which modes use a flag; flags not listed are used by all.
var kernelModes = []string{ModeIPTables, ModeIPVS, ModeNFTables}

var flagModes = map[string][]string{
	"proxy-port-range":             {ModeUserspace},
	"udp-timeout":                  {ModeUserspace},
	"engine":                       {ModeUserspace},
	"busy-poll":                    {ModeUserspace},
	"io-uring":                     {ModeUserspace},
	"event-loops":                  {ModeUserspace},
	"iptables-backend":             {ModeIPTables, ModeUserspace, ModeIPVS},
	"userspace-capture":            {ModeUserspace},
	"userspace-capture-port":       {ModeUserspace},
	"mode-fallback":                {ModeIPVS, ModeIPTables, ModeNFTables, ModeKernelspace},
	"ipvs-drain-interval":          {ModeIPVS},
	"connect-timeouts":             {ModeUserspace},
	"connect-attempts":             {ModeUserspace},
	"connect-budget":               {ModeUserspace},
	"eject-after":                  {ModeUserspace},
	"eject-backoff":                {ModeUserspace},
	"eject-max-backoff":            {ModeUserspace},
	"drain-timeout":                {ModeUserspace},
	"iptables-masquerade-bit":      kernelModes,
	"iptables-localhost-nodeports": {ModeIPTables},
	// Userspace mode uses them too: the healthz timeout is twice the sync
	// period, and the min sync period bounds how often the API source builds.
	"iptables-sync-period":              {ModeIPTables, ModeNFTables, ModeUserspace},
	"iptables-min-sync-period":          {ModeIPTables, ModeNFTables, ModeUserspace},
	"masquerade-all":                    kernelModes,
	"cluster-cidr":                      kernelModes,
	"detect-local-mode":                 kernelModes,
	"pod-bridge-interface":              kernelModes,
	"pod-interface-name-prefix":         kernelModes,
	"conntrack-max-per-core":            kernelModes,
	"conntrack-min":                     kernelModes,
	"conntrack-tcp-timeout-established": kernelModes,
	"conntrack-tcp-timeout-close-wait":  kernelModes,
	"conntrack-tcp-be-liberal":          kernelModes,
	"conntrack-udp-timeout":             kernelModes,
	"conntrack-udp-timeout-stream":      kernelModes,
	"ipvs-scheduler":                    {ModeIPVS},
	"ipvs-sync-period":                  {ModeIPVS},
	"ipvs-min-sync-period":              {ModeIPVS},
	"ipvs-exclude-cidrs":                {ModeIPVS},
	"ipvs-strict-arp":                   {ModeIPVS},
	"ipvs-tcp-timeout":                  {ModeIPVS},
	"ipvs-tcpfin-timeout":               {ModeIPVS},
	"ipvs-udp-timeout":                  {ModeIPVS},
	"show-hidden-metrics-for-version":   {},
	"log-flush-frequency":               {},
	"log-text-info-buffer-size":         {},
	"log-json-info-buffer-size":         {},
	"boot-id-file":                      {},
	"machine-id-file":                   {},
	"windows-service":                   {},
	"source-vip":                        {},
	"network-name":                      {},
	"enable-dsr":                        {},
	"root-hnsendpoint-name":             {},
	"forward-healthcheck-vip":           {},
}

// newFlagSet binds every flag to c, so the values already in c (defaults,
// or a config file) are the flags' defaults.
func newFlagSet(c *Config) *pflag.FlagSet {
	fs := pflag.NewFlagSet("sluice", pflag.ContinueOnError)
	fs.SortFlags = true
	// The caller prints usage once, to stdout, for --help; pflag's own
	// print (to stderr) doubled it.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	kp := &c.KubeProxy
	if kp.IPTables.MasqueradeBit == nil {
		kp.IPTables.MasqueradeBit = i32(14)
	}
	if kp.OOMScoreAdj == nil {
		kp.OOMScoreAdj = i32(-999)
	}
	if kp.Conntrack.MaxPerCore == nil {
		kp.Conntrack.MaxPerCore = i32(32768)
	}
	if kp.Conntrack.Min == nil {
		kp.Conntrack.Min = i32(131072)
	}
	if kp.Conntrack.TCPEstablishedTimeout == nil {
		kp.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if kp.Conntrack.TCPCloseWaitTimeout == nil {
		kp.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	if kp.IPTables.LocalhostNodePorts == nil {
		t := true
		kp.IPTables.LocalhostNodePorts = &t
	}

	// kube-proxy's flags: same names, types and defaults.
	fs.StringVar(&kp.BindAddress, "bind-address", kp.BindAddress, "The IP address NodePorts and proxy ports listen on (0.0.0.0 for all IPv4 interfaces, :: for all IPv6 interfaces).")
	fs.BoolVar(&kp.BindAddressHardFail, "bind-address-hard-fail", kp.BindAddressHardFail, "If true, a port that cannot be opened is fatal.")
	fs.String("boot-id-file", "/proc/sys/kernel/random/boot_id", "Accepted for kube-proxy's command lines, and unused: kube-proxy takes it from a library it links (cAdvisor) and does not use it either.")
	fs.BoolVar(&c.Cleanup, "cleanup", c.Cleanup, "If true, remove everything any sluice mode installed in the kernel and exit.")
	fs.StringVar(&kp.ClusterCIDR, "cluster-cidr", kp.ClusterCIDR, "The CIDR range of the pods in the cluster (a comma-separated dual-stack pair allowed).")
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "The path to a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) file, optionally followed by a SluiceConfiguration (config.sluice-proxy.io/v1alpha1) document with sluice's own settings. As in kube-proxy, the file's settings replace those of kube-proxy's flags (which are then ignored, with a warning), except the logging flags and --hostname-override and --master; sluice's own flags override the file.")
	fs.DurationVar(&kp.ConfigSyncPeriod.Duration, "config-sync-period", kp.ConfigSyncPeriod.Duration, "How often configuration is re-read from its source. Must be greater than 0.")
	fs.Int32Var(kp.Conntrack.MaxPerCore, "conntrack-max-per-core", *kp.Conntrack.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(kp.Conntrack.Min, "conntrack-min", *kp.Conntrack.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.")
	fs.BoolVar(&kp.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", kp.Conntrack.TCPBeLiberal, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1.")
	fs.DurationVar(&kp.Conntrack.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", kp.Conntrack.TCPCloseWaitTimeout.Duration, "NAT timeout for TCP connections in the CLOSE_WAIT state.")
	fs.DurationVar(&kp.Conntrack.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", kp.Conntrack.TCPEstablishedTimeout.Duration, "Idle timeout for established TCP connections (0 to leave as-is).")
	fs.DurationVar(&kp.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", kp.Conntrack.UDPTimeout.Duration, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is).")
	fs.DurationVar(&kp.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", kp.Conntrack.UDPStreamTimeout.Duration, "Idle timeout for ASSURED UDP connections (0 to leave as-is).")
	fs.Var(localMode{&kp.DetectLocalMode}, "detect-local-mode", "Mode to use to detect local traffic: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix.")
	fs.Var(mapStringBool{&kp.FeatureGates}, "feature-gates", "A set of key=value pairs that describe feature gates.")
	fs.StringVar(&kp.HealthzBindAddress, "healthz-bind-address", kp.HealthzBindAddress, "The IP address with port for the health check server (empty to disable).")
	fs.Int32Var(&c.HealthzPort, "healthz-port", c.HealthzPort, "The port of the health check server when --healthz-bind-address is an IP alone; 0 turns it off. Ignored with --config, as by kube-proxy. Deprecated: use --healthz-bind-address.")
	fs.StringVar(&kp.HostnameOverride, "hostname-override", kp.HostnameOverride, "If non-empty, this string identifies the node instead of the hostname.")
	fs.BoolVar(&c.InitOnly, "init-only", c.InitOnly, "If true, perform any initialization steps that must be done with full root privileges, and then exit.")
	fs.BoolVar(kp.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *kp.IPTables.LocalhostNodePorts, "If false, NodePort services are not reachable on localhost (iptables mode).")
	fs.Int32Var(kp.IPTables.MasqueradeBit, "iptables-masquerade-bit", *kp.IPTables.MasqueradeBit, "The bit of the fwmark space to mark packets requiring SNAT with. Must be within [0, 31].")
	fs.DurationVar(&kp.IPTables.MinSyncPeriod.Duration, "iptables-min-sync-period", kp.IPTables.MinSyncPeriod.Duration, "The minimum period between iptables rule resyncs.")
	fs.DurationVar(&kp.IPTables.SyncPeriod.Duration, "iptables-sync-period", kp.IPTables.SyncPeriod.Duration, "An interval indicating how frequently re-synchronizing operations are performed. Must be greater than 0.")
	fs.StringSliceVar(&kp.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", kp.IPVS.ExcludeCIDRs, "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.")
	fs.DurationVar(&kp.IPVS.MinSyncPeriod.Duration, "ipvs-min-sync-period", kp.IPVS.MinSyncPeriod.Duration, "The minimum period between IPVS rule resyncs.")
	fs.StringVar(&kp.IPVS.Scheduler, "ipvs-scheduler", kp.IPVS.Scheduler, "The ipvs scheduler type when proxy mode is ipvs.")
	fs.BoolVar(&kp.IPVS.StrictARP, "ipvs-strict-arp", kp.IPVS.StrictARP, "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2.")
	fs.DurationVar(&kp.IPVS.SyncPeriod.Duration, "ipvs-sync-period", kp.IPVS.SyncPeriod.Duration, "How frequently IPVS rules are re-synchronized. Must be greater than 0.")
	fs.DurationVar(&kp.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", kp.IPVS.TCPTimeout.Duration, "The timeout for idle IPVS TCP connections, 0 to leave as-is.")
	fs.DurationVar(&kp.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", kp.IPVS.TCPFinTimeout.Duration, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is.")
	fs.DurationVar(&kp.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", kp.IPVS.UDPTimeout.Duration, "The timeout for IPVS UDP packets, 0 to leave as-is.")
	fs.Int32Var(&kp.ClientConnection.Burst, "kube-api-burst", kp.ClientConnection.Burst, "Burst to use while talking with kubernetes apiserver.")
	fs.StringVar(&kp.ClientConnection.ContentType, "kube-api-content-type", kp.ClientConnection.ContentType, "Content type of requests sent to apiserver.")
	fs.Float32Var(&kp.ClientConnection.QPS, "kube-api-qps", kp.ClientConnection.QPS, "QPS to use while talking with kubernetes apiserver.")
	fs.StringVar(&kp.ClientConnection.Kubeconfig, "kubeconfig", kp.ClientConnection.Kubeconfig, "Path to kubeconfig file with authorization information.")
	fs.DurationVar(&kp.Logging.FlushFrequency.Duration.Duration, "log-flush-frequency", kp.Logging.FlushFrequency.Duration.Duration, "Maximum number of seconds between log flushes (logging.flushFrequency; taken and unused: sluice's log is unbuffered).")
	fs.BoolVar(&kp.Logging.Options.JSON.SplitStream, "log-json-split-stream", kp.Logging.Options.JSON.SplitStream, "[Alpha] In JSON format, write error messages to stderr and the others to stdout. The default is one stream, on stderr. Enable the LoggingAlphaOptions feature gate to use this.")
	fs.Var(quantity{&kp.Logging.Options.JSON.InfoBufferSize}, "log-json-info-buffer-size", "[Alpha] Accepted for kube-proxy's command lines (a quantity such as 64Ki); sluice does not buffer its log. Enable the LoggingAlphaOptions feature gate to use this.")
	fs.BoolVar(&kp.Logging.Options.Text.SplitStream, "log-text-split-stream", kp.Logging.Options.Text.SplitStream, "[Alpha] In text format, write error messages to stderr and the others to stdout. The default is one stream, on stderr. Enable the LoggingAlphaOptions feature gate to use this.")
	fs.Var(quantity{&kp.Logging.Options.Text.InfoBufferSize}, "log-text-info-buffer-size", "[Alpha] Accepted for kube-proxy's command lines (a quantity such as 64Ki); sluice does not buffer its log. Enable the LoggingAlphaOptions feature gate to use this.")
	fs.StringVar(&c.LogFormat, "logging-format", c.LogFormat, "Log format: text or json.")
	fs.String("machine-id-file", "/etc/machine-id,/var/lib/dbus/machine-id", "Accepted for kube-proxy's command lines, and unused: kube-proxy takes it from a library it links (cAdvisor) and does not use it either.")
	fs.BoolVar(&kp.IPTables.MasqueradeAll, "masquerade-all", kp.IPTables.MasqueradeAll, "SNAT all traffic sent via Service cluster IPs (kernel modes).")
	fs.StringVar(&c.Master, "master", c.Master, "The address of the Kubernetes API server (overrides any value in kubeconfig).")
	fs.StringVar(&kp.MetricsBindAddress, "metrics-bind-address", kp.MetricsBindAddress, "The IP address with port for the metrics server (empty to disable).")
	fs.Int32Var(&c.MetricsPort, "metrics-port", c.MetricsPort, "The port of the metrics server when --metrics-bind-address is an IP alone; 0 turns it off (kube-proxy refuses 0). Ignored with --config, as by kube-proxy. Deprecated: use --metrics-bind-address.")
	fs.StringSliceVar(&kp.NodePortAddresses, "nodeport-addresses", kp.NodePortAddresses, "A list of CIDR ranges that contain valid node IPs, or \"primary\". Empty means all local addresses.")
	fs.Int32Var(kp.OOMScoreAdj, "oom-score-adj", *kp.OOMScoreAdj, "The oom-score-adj value for the process. Must be within [-1000, 1000].")
	fs.StringVar(&kp.DetectLocal.BridgeInterface, "pod-bridge-interface", kp.DetectLocal.BridgeInterface, "A bridge interface name, used with --detect-local-mode=BridgeInterface.")
	fs.StringVar(&kp.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", kp.DetectLocal.InterfaceNamePrefix, "An interface name prefix, used with --detect-local-mode=InterfaceNamePrefix.")
	fs.BoolVar(&kp.EnableProfiling, "profiling", kp.EnableProfiling, "If true, serve /debug/pprof on the metrics server.")
	fs.Var(proxyMode{&kp.Mode}, "proxy-mode", "Which proxy mode to use: userspace (default), iptables, ipvs or nftables; on Windows also kernelspace, kube-proxy's mode there, which sluice serves in userspace mode.")
	fs.StringVar(&kp.PortRange, "proxy-port-range", kp.PortRange, "Range of host ports (beginPort-endPort, single port or beginPort+offset, inclusive) for proxy ports. Empty, 0 or 0-0 means random.")
	fs.StringVar(&kp.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", kp.ShowHiddenMetricsForVersion, "The previous version for which to show hidden metrics.")
	fs.DurationVar(&c.UDPTimeout, "udp-timeout", c.UDPTimeout, "How long an idle UDP flow is kept (userspace mode). Must be greater than 0.")
	fs.IntVarP(&c.Verbosity, "v", "v", c.Verbosity, "Log verbosity: 0 info, 1 and more debug.")
	fs.Var(logsapi.VModuleConfigurationPflag(&kp.Logging.VModule), "vmodule", "Comma-separated list of pattern=N settings for file-filtered logging (text format only): log lines from sluice's own source files whose names without .go match the glob pattern are logged at verbosity N where that is above --v, as klog's. sluice's files are not kube-proxy's, so a pattern written for kube-proxy's (proxier=4) matches none of them.")
	fs.StringVar(&c.Version, "version", c.Version, "Print version information and exit (--version or --version=raw).")
	fs.Lookup("version").NoOptDefVal = "true"
	fs.BoolVar(&kp.WindowsRunAsService, "windows-service", kp.WindowsRunAsService, "On Windows, run as a service of the Service Control Manager (sc create ... --windows-service): a stop or shutdown drains as SIGTERM does. Ignored elsewhere, as by kube-proxy.")
	fs.StringVar(&c.WriteConfigTo, "write-config-to", c.WriteConfigTo, "If set, write the effective configuration to this file and exit: the KubeProxyConfiguration, then a SluiceConfiguration document.")

	// sluice's own flags.
	fs.StringVar(&c.Manifests, "manifests", c.Manifests, "A file or directory of Service, EndpointSlice and Endpoints manifests (YAML or JSON, as kubectl apply -f takes them), watched for changes.")
	fs.StringVar(&c.IPTablesBackend, "iptables-backend", c.IPTablesBackend, "iptables mode and --cleanup: auto (the iptables command, as the system's alternatives choose), nft (iptables-nft) or legacy (iptables-legacy).")
	fs.IntVar(&c.UserspaceCapturePort, "userspace-capture-port", c.UserspaceCapturePort, "One TCP port (on --bind-address) that the nftables or iptables VIP capture redirects every TCP service port to; each connection's original destination (SO_ORIGINAL_DST) picks its service. 0 (the default): a proxy port and a listener per service port, as kube-proxy's userspace mode. Set it for tens of thousands of Services, where a listener each would exceed the descriptor limit. UDP and SCTP keep their proxy ports.")
	fs.StringVar(&c.UserspaceCapture, "userspace-capture", c.UserspaceCapture, "How userspace mode captures traffic to ClusterIPs and non-local external IPs: nftables (redirects in sluice's own table, sluice-portals; no iptables binaries needed), iptables (REDIRECT rules in KUBE-PORTALS-CONTAINER/HOST), bind (the VIPs are assigned to a dummy interface, or lo, and listened on directly), none, or auto (nftables if nft works, else iptables, else bind, else none; the choice is logged).")
	fs.BoolVar(&c.ModeFallback, "mode-fallback", c.ModeFallback, "When the kernel lacks what --proxy-mode needs, fall back (ipvs to iptables to userspace) with one log line saying why; false makes it a start-up error.")
	fs.DurationVar(&c.IPVSDrainInterval, "ipvs-drain-interval", c.IPVSDrainInterval, "IPVS mode: how often a removed TCP real server (weight 0) is checked for remaining connections before it is deleted.")
	fs.StringVar(&c.Engine, "engine", c.Engine, "Userspace engine: eventloop (epoll, Linux) or goroutine (standard library, every OS).")
	fs.IntVar(&c.EventLoops, "event-loops", c.EventLoops, "eventloop engine: how many event loops (threads) serve connections; 0, the default, is one per CPU, and no more than the cgroup CPU limit (a container's limits.cpu) rounded up. Fewer than the CPUs leaves cores to the backends on a small shared box.")
	fs.BoolVar(&c.IOUring, "io-uring", c.IOUring, "eventloop engine: batch each turn's socket reads and writes into one io_uring_enter, where the kernel allows io_uring (the choice is logged); false makes a syscall per read and write.")
	fs.DurationVar(&c.BusyPoll, "busy-poll", c.BusyPoll, "eventloop engine: after its last event, a loop keeps polling without sleeping for this long (e.g. 50us), trading CPU for latency on hosts where waking a parked CPU is slow (VMs); 0, the default, is off.")
	fs.Var(durationList{&c.ConnectTimeouts}, "connect-timeouts", "Per-try connect timeouts, comma-separated; the last repeats.")
	fs.IntVar(&c.ConnectAttempts, "connect-attempts", c.ConnectAttempts, "Most endpoints one connection tries.")
	fs.DurationVar(&c.ConnectBudget, "connect-budget", c.ConnectBudget, "Total time one connection may spend connecting.")
	fs.IntVar(&c.EjectAfter, "eject-after", c.EjectAfter, "Consecutive connect failures that eject an endpoint (0 disables passive ejection).")
	fs.DurationVar(&c.EjectBackoff, "eject-backoff", c.EjectBackoff, "How long an ejected endpoint is skipped before it is probed again; doubles on each failed probe.")
	fs.DurationVar(&c.EjectMaxBackoff, "eject-max-backoff", c.EjectMaxBackoff, "Upper bound of the ejection back-off.")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "On SIGTERM, how long open connections may drain before they are cut.")
	fs.DurationVar(&c.ManifestCoalesce, "manifest-coalesce", c.ManifestCoalesce, "How long a burst of --manifests edits is gathered into one reload.")
	fs.StringVar(&c.HandoverSocket, "handover-socket", c.HandoverSocket, "Unix socket through which a new sluice started with the same command line takes the running one's listening sockets (hitless restart); auto: derived from the command line under /run/sluice; empty: off.")
	fs.Int64Var(&c.ManifestMaxBytes, "manifest-max-bytes", c.ManifestMaxBytes, "Largest total size of the --manifests files one load reads; a larger load is refused (0: no limit).")
	addOSFlags(fs, kp, runtime.GOOS)
	return fs
}

// addOSFlags adds the flags kube-proxy has on goos alone: on Windows its
// kernelspace mode's, which sluice takes there and does not use (it
// serves kernelspace in userspace mode), so that a Windows node's
// kube-proxy command line starts as it is. Elsewhere they are unknown, as
// to kube-proxy.
func addOSFlags(fs *pflag.FlagSet, kp *kpv1alpha1.KubeProxyConfiguration, goos string) {
	if goos != "windows" {
		return
	}
	w := &kp.Winkernel
	if w.RootHnsEndpointName == "" {
		w.RootHnsEndpointName = "cbr0" // kube-proxy's default on Windows
	}
	const unused = " kernelspace mode (HNS); taken and unused: sluice serves kernelspace in userspace mode."
	fs.StringVar(&w.SourceVip, "source-vip", w.SourceVip, "The IP address of the source VIP for non-DSR."+unused)
	fs.StringVar(&w.NetworkName, "network-name", w.NetworkName, "The name of the cluster network."+unused)
	fs.BoolVar(&w.EnableDSR, "enable-dsr", w.EnableDSR, "Apply DSR policies for service VIPs."+unused)
	fs.StringVar(&w.RootHnsEndpointName, "root-hnsendpoint-name", w.RootHnsEndpointName, "The name of the HNS endpoint for the root namespace attached to l2bridge."+unused)
	fs.BoolVar(&w.ForwardHealthCheckVip, "forward-healthcheck-vip", w.ForwardHealthCheckVip, "Forward the service VIP for the health check port."+unused)
}

// fileHoldsFlag lists kube-proxy's flags whose settings a --config file
// holds: given with --config, kube-proxy v1.34 ignores them (its Complete
// replaces the configuration the flags filled with the file's). The flags
// it still applies are the logging ones (copied over the file's logging
// section), --hostname-override, --master, and the ones that act
// (--cleanup, --init-only, --write-config-to, --version). sluice's own
// flags are not kube-proxy's and override the SluiceConfiguration
// document. TestFlagsAKubeProxyConfigFileHolds checks the list against
// upstream's binary, flag by flag.
var fileHoldsFlag = map[string]bool{
	"bind-address": true, "bind-address-hard-fail": true, "cluster-cidr": true, "config-sync-period": true,
	"conntrack-max-per-core": true, "conntrack-min": true, "conntrack-tcp-be-liberal": true,
	"conntrack-tcp-timeout-close-wait": true, "conntrack-tcp-timeout-established": true,
	"conntrack-udp-timeout": true, "conntrack-udp-timeout-stream": true, "detect-local-mode": true,
	"feature-gates": true, "healthz-bind-address": true, "healthz-port": true,
	"iptables-localhost-nodeports": true, "iptables-masquerade-bit": true, "iptables-min-sync-period": true,
	"iptables-sync-period": true, "ipvs-exclude-cidrs": true, "ipvs-min-sync-period": true,
	"ipvs-scheduler": true, "ipvs-strict-arp": true, "ipvs-sync-period": true, "ipvs-tcp-timeout": true,
	"ipvs-tcpfin-timeout": true, "ipvs-udp-timeout": true, "kube-api-burst": true,
	"kube-api-content-type": true, "kube-api-qps": true, "kubeconfig": true, "masquerade-all": true,
	"metrics-bind-address": true, "metrics-port": true, "nodeport-addresses": true, "oom-score-adj": true,
	"pod-bridge-interface": true, "pod-interface-name-prefix": true, "profiling": true, "proxy-mode": true,
	"show-hidden-metrics-for-version": true,
	// Windows only (kube-proxy's source: its Complete replaces the
	// configuration these filled, o.config.Winkernel, with the file's).
	"source-vip": true, "network-name": true, "enable-dsr": true, "root-hnsendpoint-name": true, "forward-healthcheck-vip": true,
}

// FileHoldsFlag reports whether a --config file replaces the flag's
// setting, as in kube-proxy (see fileHoldsFlag).
func FileHoldsFlag(name string) bool { return fileHoldsFlag[name] }

// Parse reads the command line (and the --config file it names) into a
// validated Config. With --config, kube-proxy's flags whose settings the
// file holds are ignored, as kube-proxy v1.34 ignores them, and named in a
// warning; the others (logging, --hostname-override, --master, sluice's
// own) apply over the file. usage receives the flag help text.
func Parse(args []string) (*Config, string, error) {
	cfg := Defaults()
	fs := newFlagSet(cfg)
	usage := usage(fs)
	type given struct{ name, value string }
	var flags []given
	err := fs.ParseAll(args, func(f *pflag.Flag, value string) error {
		flags = append(flags, given{f.Name, value})
		return fs.Set(f.Name, value)
	})
	if err != nil {
		return nil, usage, suggest(fs, err)
	}
	if fs.NArg() > 0 {
		return nil, usage, fmt.Errorf("unexpected argument %q: sluice takes only flags", fs.Arg(0))
	}
	// The flags as parsed, over the first configuration: kube-proxy's
	// /flagz reads its flags' values from the configuration they were
	// parsed into, and with --config that is not the file's.
	first := fs
	if cfg.ConfigFile != "" {
		base := Defaults()
		if err := LoadFile(cfg.ConfigFile, base); err != nil {
			return nil, usage, err
		}
		// kube-proxy v1.34 copies its logging flags over the file's logging
		// section by registering them on it, and their registration sets
		// the split-stream and info-buffer options to the flags' defaults:
		// the file's are lost. sluice does the same, and says so.
		if opts := &base.KubeProxy.Logging.Options; opts.Text.SplitStream || opts.JSON.SplitStream ||
			!opts.Text.InfoBufferSize.IsZero() || !opts.JSON.InfoBufferSize.IsZero() {
			base.ConfigWarnings = append(base.ConfigWarnings, fmt.Sprintf("--config %s: logging.options (split streams, info buffers) ignored, as kube-proxy v1.34 ignores them in a file: use the --log-*-split-stream flags", cfg.ConfigFile))
			*opts = logsapi.FormatOptions{}
		}
		fs = newFlagSet(base)
		var ignored []string
		for _, f := range flags {
			if fileHoldsFlag[f.name] {
				if !slices.Contains(ignored, "--"+f.name) {
					ignored = append(ignored, "--"+f.name)
				}
				continue
			}
			if err := fs.Set(f.name, f.value); err != nil {
				return nil, usage, fmt.Errorf("invalid argument %q for --%s: %w", f.value, f.name, err)
			}
		}
		if len(ignored) > 0 {
			base.ConfigWarnings = append(base.ConfigWarnings, fmt.Sprintf("%s: ignored, as kube-proxy ignores them: --config %s holds these settings (set them in the file)",
				strings.Join(ignored, ", "), cfg.ConfigFile))
		}
		cfg = base
	}
	fs.Visit(func(f *pflag.Flag) { cfg.Changed = append(cfg.Changed, f.Name) })
	kp := &cfg.KubeProxy
	// kube-proxy v1.34 takes --iptables-(min-)sync-period in every mode but
	// IPVS: in nftables mode they set the nftables section's periods.
	if cfg.Mode() == ModeNFTables {
		if fs.Changed("iptables-sync-period") {
			kp.NFTables.SyncPeriod = kp.IPTables.SyncPeriod
		}
		if fs.Changed("iptables-min-sync-period") {
			kp.NFTables.MinSyncPeriod = kp.IPTables.MinSyncPeriod
		}
	}
	if fs.Changed("masquerade-all") {
		kp.NFTables.MasqueradeAll = kp.IPTables.MasqueradeAll
	}
	if cfg.ConfigFile == "" {
		kp.HealthzBindAddress = addressFromDeprecatedFlags(kp.HealthzBindAddress, cfg.HealthzPort)
		kp.MetricsBindAddress = addressFromDeprecatedFlags(kp.MetricsBindAddress, cfg.MetricsPort)
	}
	if fs.Changed("hostname-override") {
		// kube-proxy's processHostnameOverrideFlag.
		name := strings.TrimSpace(kp.HostnameOverride)
		if name == "" {
			return nil, usage, fmt.Errorf("invalid value %q for --hostname-override: empty hostname-override is invalid (as kube-proxy says)", kp.HostnameOverride)
		}
		kp.HostnameOverride = strings.ToLower(name)
	}
	// kube-proxy's platformApplyDefaults: in nftables mode NodePorts answer
	// on the node's primary addresses unless told otherwise.
	if cfg.Mode() == ModeNFTables && len(kp.NodePortAddresses) == 0 {
		kp.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	cfg.FlagValues = flagValues(first)
	if err := cfg.Validate(); err != nil {
		return cfg, usage, err
	}
	cfg.canonicalise()
	return cfg, usage, nil
}

// flagValues is every flag's value, as kube-proxy's /flagz lists its
// own: after the defaults a configuration takes from its mode (parsed
// into the same configuration, as kube-proxy's platform defaults are),
// with its --help (cobra's) and its --version as they read when unset.
func flagValues(fs *pflag.FlagSet) map[string]string {
	values := map[string]string{"help": "false"}
	fs.VisitAll(func(f *pflag.Flag) { values[f.Name] = f.Value.String() })
	if values["version"] == "" {
		values["version"] = "false"
	}
	return values
}

// suggest adds "did you mean --x?" to an unknown-flag error, naming the
// closest flag (by edit distance: at most 2, or a third of the length), as
// kubectl and cobra do.
func suggest(fs *pflag.FlagSet, err error) error {
	msg := err.Error()
	const prefix = "unknown flag: --"
	if !strings.HasPrefix(msg, prefix) {
		return err
	}
	typed := strings.SplitN(strings.TrimPrefix(msg, prefix), "=", 2)[0]
	best, bestD := "", max(2, len(typed)/3)+1
	fs.VisitAll(func(f *pflag.Flag) {
		if d := editDistance(typed, f.Name); d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" {
		return err
	}
	return fmt.Errorf("%w (did you mean --%s?)", err, best)
}

// editDistance is Levenshtein's distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// UnusedFlags returns the flags set on the command line that the chosen mode
// does not use, sorted, so they can be reported once at start-up.
func (c *Config) UnusedFlags() []string {
	var out []string
	for _, f := range c.Changed {
		ms, ok := flagModes[f]
		if ok && !slices.Contains(ms, c.Mode()) && !(c.Mode() == ModeKernelspace && slices.Contains(ms, ModeUserspace)) {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// IsHelp reports whether err is a request for help.
func IsHelp(err error) bool { return errors.Is(err, pflag.ErrHelp) }
