// Package config owns sluice's settings: kube-proxy's KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1) with kube-proxy's defaults, the same
// command-line flags with the same names, types and defaults, sluice's own
// flags, the config file, and validation that names the culprit.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// Proxy modes.
const (
	ModeUserspace = "userspace"
	ModeIPTables  = "iptables"
	ModeIPVS      = "ipvs"
	ModeNFTables  = "nftables"
)

// Modes lists the accepted --proxy-mode values.
var modes = []string{ModeUserspace, ModeIPTables, ModeIPVS, ModeNFTables}

// Config is everything sluice runs with.
type Config struct {
	// KubeProxy is the kube-proxy-compatible part; --config files fill it and
	// --write-config-to writes it (sluice's own settings below go in the
	// file's SluiceConfiguration document).
	KubeProxy kpv1alpha1.KubeProxyConfiguration

	// Process-level flags of kube-proxy that are not in the file.
	ConfigFile string
	// FileMode is the mode the --config file gave, as written ("" when
	// it left it empty, which is userspace here and iptables to
	// kube-proxy); for the start-up log.
	FileMode      string
	WriteConfigTo string
	Cleanup       bool
	InitOnly      bool
	Version       string // "" (not asked), "true" or "raw"
	Master        string
	HealthzPort   int32 // deprecated --healthz-port; 0 means unset
	MetricsPort   int32 // deprecated --metrics-port; 0 means unset

	// Legacy userspace knobs that left KubeProxyConfiguration.
	UDPTimeout time.Duration

	// sluice's own.
	Manifests string
	Engine    string
	// BusyPoll is how long an event loop keeps polling without sleeping
	// after its last event (0: off).
	BusyPoll time.Duration
	// IOUring lets the event loops batch a turn's recvs and sends on an
	// io_uring where the kernel allows it (default true).
	IOUring bool
	// EventLoops is how many event loops the eventloop engine runs; 0 is
	// one per CPU, at most the cgroup CPU limit rounded up (HAProxy's
	// nbthread, nginx's worker_processes).
	EventLoops      int
	ConnectTimeouts []time.Duration
	ConnectAttempts int
	ConnectBudget   time.Duration
	EjectAfter      int
	EjectBackoff    time.Duration
	EjectMaxBackoff time.Duration
	DrainTimeout    time.Duration
	// ManifestCoalesce is how long a burst of manifest edits is gathered
	// into one reload.
	ManifestCoalesce time.Duration
	// ManifestMaxBytes bounds what one load of the manifests reads; a load
	// over it is refused. 0: no limit.
	ManifestMaxBytes int64
	// HandoverSocket is the Unix socket through which a new sluice takes
	// the listening sockets of the running one (hitless restart): "auto"
	// derives it from the command line under /run/sluice; "" turns the
	// hand-over off.
	HandoverSocket string
	// ConfigWarnings are what decoding --config had to say (a file that
	// decoded only leniently), for the log.
	ConfigWarnings []string
	LogFormat      string
	Verbosity      int
	// IPTablesBackend picks the iptables binaries: auto (iptables, as the
	// system's alternatives choose), nft or legacy.
	IPTablesBackend string
	// UserspaceCapture is the userspace VIP capture: auto, iptables, bind
	// or none.
	UserspaceCapture string
	// UserspaceCapturePort, when not 0, is the one TCP port the VIP
	// capture redirects every TCP service port to (each connection's
	// original destination picks the service), instead of a proxy port
	// per service port.
	UserspaceCapturePort int
	// ModeFallback lets an unavailable kernel mode fall back (ipvs to
	// iptables to userspace) instead of failing start-up.
	ModeFallback bool
	// IPVSDrainInterval is how often quiesced IPVS real servers are checked
	// for remaining connections (kube-proxy: one minute).
	IPVSDrainInterval time.Duration

	// Changed lists the flags set on the command line, for the start-up
	// report of flags the chosen mode ignores.
	Changed []string
}

func i32(v int32) *int32                  { return &v }
func dur(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

// Defaults returns kube-proxy's v1alpha1 defaults (pkg/proxy/apis/config/v1alpha1)
// with sluice's userspace mode as the default mode.
func Defaults() *Config {
	t := true
	kp := kpv1alpha1.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: kpv1alpha1.SchemeGroupVersion.String(), Kind: "KubeProxyConfiguration"},
		BindAddress:        "0.0.0.0",
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		Mode:               kpv1alpha1.ProxyMode(ModeUserspace),
		FeatureGates:       map[string]bool{},
		ConfigSyncPeriod:   dur(15 * time.Minute),
		OOMScoreAdj:        i32(-999),
		DetectLocalMode:    "ClusterCIDR",
		IPTables: kpv1alpha1.KubeProxyIPTablesConfiguration{
			MasqueradeBit:      i32(14),
			LocalhostNodePorts: &t,
			SyncPeriod:         dur(30 * time.Second),
			MinSyncPeriod:      dur(time.Second),
		},
		IPVS: kpv1alpha1.KubeProxyIPVSConfiguration{
			SyncPeriod: dur(30 * time.Second),
		},
		NFTables: kpv1alpha1.KubeProxyNFTablesConfiguration{
			MasqueradeBit: i32(14),
			SyncPeriod:    dur(30 * time.Second),
			MinSyncPeriod: dur(time.Second),
		},
		Conntrack: kpv1alpha1.KubeProxyConntrackConfiguration{
			MaxPerCore:            i32(32768),
			Min:                   i32(131072),
			TCPEstablishedTimeout: &metav1.Duration{Duration: 24 * time.Hour},
			TCPCloseWaitTimeout:   &metav1.Duration{Duration: time.Hour},
		},
	}
	kp.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	kp.ClientConnection.AcceptContentTypes = ""
	kp.ClientConnection.QPS = 5
	kp.ClientConnection.Burst = 10
	return &Config{
		KubeProxy:         kp,
		UDPTimeout:        250 * time.Millisecond,
		Engine:            defaultEngine(),
		IPTablesBackend:   "auto",
		UserspaceCapture:  "auto",
		ModeFallback:      true,
		IOUring:           true,
		IPVSDrainInterval: time.Minute,
		ConnectTimeouts:   []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second},
		ConnectAttempts:   4,
		ConnectBudget:     3750 * time.Millisecond,
		EjectAfter:        2,
		EjectBackoff:      5 * time.Second,
		EjectMaxBackoff:   time.Minute,
		DrainTimeout:      30 * time.Second,
		ManifestCoalesce:  100 * time.Millisecond,
		ManifestMaxBytes:  64 << 20,
		HandoverSocket:    "auto",
		LogFormat:         "text",
	}
}

func defaultEngine() string {
	if runtime.GOOS == "linux" {
		return "eventloop"
	}
	return "goroutine"
}

// LoadFile reads a --config file over the defaults in into: a
// KubeProxyConfiguration, a SluiceConfiguration, or both as two YAML
// documents (at most one of each, in any order). Unknown fields and a wrong
// apiVersion or kind are errors naming the file and the document's line.
func LoadFile(path string, into *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	docs := splitDocuments(data)
	if len(docs) == 0 {
		return fmt.Errorf("--config %s: empty: want a KubeProxyConfiguration and/or a %s", path, SluiceKind)
	}
	seen := map[string]int{}
	for i, doc := range docs {
		where := fmt.Sprintf("--config %s", path)
		if len(docs) > 1 {
			where = fmt.Sprintf("--config %s:%d (document %d)", path, doc.line, i+1)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc.data, &tm); err != nil {
			return fmt.Errorf("%s: malformed YAML/JSON: %w", where, err)
		}
		switch {
		case tm.APIVersion == kpv1alpha1.SchemeGroupVersion.String() && tm.Kind == "KubeProxyConfiguration":
			err = loadKubeProxyDocument(where, doc.data, into)
		case tm.APIVersion == SluiceAPIVersion && tm.Kind == SluiceKind:
			err = loadSluiceDocument(where, doc.data, into)
			if i == 0 && len(docs) > 1 {
				into.ConfigWarnings = append(into.ConfigWarnings, fmt.Sprintf("%s: kube-proxy reads only the first document of a --config file: put the KubeProxyConfiguration first to keep the file usable by kube-proxy", where))
			}
		default:
			return fmt.Errorf("%s: want apiVersion %s and kind KubeProxyConfiguration, or apiVersion %s and kind %s; got apiVersion %q kind %q",
				where, kpv1alpha1.SchemeGroupVersion, SluiceAPIVersion, SluiceKind, tm.APIVersion, tm.Kind)
		}
		if err != nil {
			return err
		}
		if prev, dup := seen[tm.Kind]; dup {
			return fmt.Errorf("%s: a second %s (the first is document %d): a --config file holds at most one of each kind", where, tm.Kind, prev)
		}
		seen[tm.Kind] = i + 1
	}
	return nil
}

// loadKubeProxyDocument decodes a KubeProxyConfiguration over into, as
// kube-proxy v1.34 decodes it: strictly first; when that fails only for
// unknown or duplicate fields (files from older releases carry fields
// removed since, such as udpIdleTimeout), leniently, with a warning;
// anything else is an error. Its logging section sets the log format and
// verbosity, as kube-proxy's does.
func loadKubeProxyDocument(where string, data []byte, into *Config) error {
	var kp kpv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict(data, &kp); err != nil {
		if !strictOnly(err) {
			return fmt.Errorf("%s: %w", where, err)
		}
		kp = kpv1alpha1.KubeProxyConfiguration{}
		if lerr := yaml.Unmarshal(data, &kp); lerr != nil {
			return fmt.Errorf("%s: %w", where, lerr)
		}
		into.ConfigWarnings = append(into.ConfigWarnings, fmt.Sprintf("%s: using lenient decoding as strict decoding failed: %v", where, err))
	}
	into.FileMode = string(kp.Mode)
	if kp.Logging.Format != "" {
		into.LogFormat = kp.Logging.Format
	}
	if kp.Logging.Verbosity != 0 {
		into.Verbosity = int(kp.Logging.Verbosity)
	}
	setKubeProxyDefaults(&kp, &into.KubeProxy)
	into.KubeProxy = kp
	return nil
}

// strictOnly reports whether a strict decoding error is only about
// unknown or duplicate fields.
func strictOnly(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "unknown field") || strings.Contains(msg, "already set in map") || strings.Contains(msg, "duplicate field")
}

// setKubeProxyDefaults fills what the file left unset, or zero, as
// kube-proxy's SetDefaults_KubeProxyConfiguration does: kubeadm writes
// every field, with "0s" and null for the ones it leaves to the defaults
// (syncPeriod: 0s means 30s). def holds the defaults. The mode is
// sluice's default (userspace) when the file names none.
func setKubeProxyDefaults(kp, def *kpv1alpha1.KubeProxyConfiguration) {
	kp.TypeMeta = def.TypeMeta
	if kp.BindAddress == "" {
		kp.BindAddress = def.BindAddress
	}
	healthz, metrics := "0.0.0.0", "127.0.0.1"
	if a, err := netip.ParseAddr(kp.BindAddress); err == nil && a.Is6() && !a.Is4In6() {
		healthz, metrics = "[::]", "[::1]"
	}
	kp.HealthzBindAddress = withDefaultPort(kp.HealthzBindAddress, healthz, 10256)
	kp.MetricsBindAddress = withDefaultPort(kp.MetricsBindAddress, metrics, 10249)
	if kp.Mode == "" {
		kp.Mode = def.Mode
	}
	if kp.OOMScoreAdj == nil {
		kp.OOMScoreAdj = def.OOMScoreAdj
	}
	zeroDur := func(d *metav1.Duration, to metav1.Duration) {
		if d.Duration == 0 {
			*d = to
		}
	}
	zeroDur(&kp.ConfigSyncPeriod, def.ConfigSyncPeriod)
	zeroDur(&kp.IPTables.SyncPeriod, def.IPTables.SyncPeriod)
	zeroDur(&kp.IPTables.MinSyncPeriod, def.IPTables.MinSyncPeriod)
	zeroDur(&kp.IPVS.SyncPeriod, def.IPVS.SyncPeriod)
	zeroDur(&kp.NFTables.SyncPeriod, def.NFTables.SyncPeriod)
	zeroDur(&kp.NFTables.MinSyncPeriod, def.NFTables.MinSyncPeriod)
	if kp.IPTables.LocalhostNodePorts == nil {
		kp.IPTables.LocalhostNodePorts = def.IPTables.LocalhostNodePorts
	}
	if kp.IPTables.MasqueradeBit == nil {
		kp.IPTables.MasqueradeBit = def.IPTables.MasqueradeBit
	}
	if kp.NFTables.MasqueradeBit == nil {
		kp.NFTables.MasqueradeBit = def.NFTables.MasqueradeBit
	}
	if kp.Conntrack.MaxPerCore == nil {
		kp.Conntrack.MaxPerCore = def.Conntrack.MaxPerCore
	}
	if kp.Conntrack.Min == nil {
		kp.Conntrack.Min = def.Conntrack.Min
	}
	if kp.Conntrack.TCPEstablishedTimeout == nil {
		kp.Conntrack.TCPEstablishedTimeout = def.Conntrack.TCPEstablishedTimeout
	}
	if kp.Conntrack.TCPCloseWaitTimeout == nil {
		kp.Conntrack.TCPCloseWaitTimeout = def.Conntrack.TCPCloseWaitTimeout
	}
	if kp.ClientConnection.ContentType == "" {
		kp.ClientConnection.ContentType = def.ClientConnection.ContentType
	}
	if kp.ClientConnection.QPS == 0 {
		kp.ClientConnection.QPS = def.ClientConnection.QPS
	}
	if kp.ClientConnection.Burst == 0 {
		kp.ClientConnection.Burst = def.ClientConnection.Burst
	}
	if kp.DetectLocalMode == "" {
		kp.DetectLocalMode = def.DetectLocalMode
	}
	if kp.FeatureGates == nil {
		kp.FeatureGates = map[string]bool{}
	}
}

// withDefaultPort is kube-proxy's handling of the healthz and metrics
// addresses: empty means host:port, and an address without a port gets
// the default one.
func withDefaultPort(addr, host string, port int) string {
	if addr == "" {
		return fmt.Sprintf("%s:%d", host, port)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		if a, perr := netip.ParseAddr(addr); perr == nil {
			return netip.AddrPortFrom(a, uint16(port)).String()
		}
	}
	return addr
}

// SyncPeriods are the mode's full-resync period and minimum time between
// syncs, as kube-proxy v1.34 takes them from a v1alpha1 configuration: the
// ipvs section in IPVS mode, the nftables section in nftables mode, the
// iptables section otherwise (userspace mode too).
func (c *Config) SyncPeriods() (sync, minSync time.Duration) {
	kp := &c.KubeProxy
	switch c.Mode() {
	case ModeIPVS:
		return kp.IPVS.SyncPeriod.Duration, kp.IPVS.MinSyncPeriod.Duration
	case ModeNFTables:
		return kp.NFTables.SyncPeriod.Duration, kp.NFTables.MinSyncPeriod.Duration
	}
	return kp.IPTables.SyncPeriod.Duration, kp.IPTables.MinSyncPeriod.Duration
}

// Mode returns the proxy mode.
func (c *Config) Mode() string {
	if c.KubeProxy.Mode == "" {
		return ModeUserspace
	}
	return string(c.KubeProxy.Mode)
}

// problem collects validation errors, each naming the flag (and the config
// file field it maps to) and the value.
type problems []error

func (p *problems) add(flag, field string, value any, format string, a ...any) {
	name := "--" + flag
	if field != "" {
		name += " (config field " + field + ")"
	} else if f, ok := sluiceFields[flag]; ok {
		name += " (" + SluiceKind + " field " + f + ")"
	}
	*p = append(*p, fmt.Errorf("invalid value %q for %s: %s", fmt.Sprint(value), name, fmt.Sprintf(format, a...)))
}

func validIPPort(s string) error {
	if s == "" {
		return nil // disabled
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q is not an IP address", host)
	}
	var n int
	if _, err := fmt.Sscanf(port, "%d", &n); err != nil || n < 0 || n > 65535 || fmt.Sprint(n) != port {
		return fmt.Errorf("%q is not a port 0-65535", port)
	}
	return nil
}

var ipvsSchedulers = []string{"", "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh"}

// Validate checks every setting and reports all problems at once.
func (c *Config) Validate() error {
	var p problems
	kp := &c.KubeProxy
	if !slices.Contains(modes, c.Mode()) {
		p.add("proxy-mode", "mode", kp.Mode, "want one of %s", strings.Join(modes, ", "))
	}
	if _, err := netip.ParseAddr(kp.BindAddress); err != nil {
		p.add("bind-address", "bindAddress", kp.BindAddress, "not an IP address")
	}
	if err := validIPPort(kp.HealthzBindAddress); err != nil {
		p.add("healthz-bind-address", "healthzBindAddress", kp.HealthzBindAddress, "%v (want IP:port, or empty to disable)", err)
	}
	if err := validIPPort(kp.MetricsBindAddress); err != nil {
		p.add("metrics-bind-address", "metricsBindAddress", kp.MetricsBindAddress, "%v (want IP:port, or empty to disable)", err)
	}
	for _, d := range []struct {
		flag, field string
		v           time.Duration
		zeroOK      bool
	}{
		{"config-sync-period", "configSyncPeriod", kp.ConfigSyncPeriod.Duration, false},
		{"iptables-sync-period", "iptables.syncPeriod", kp.IPTables.SyncPeriod.Duration, false},
		{"iptables-min-sync-period", "iptables.minSyncPeriod", kp.IPTables.MinSyncPeriod.Duration, true},
		{"ipvs-sync-period", "ipvs.syncPeriod", kp.IPVS.SyncPeriod.Duration, false},
		{"ipvs-min-sync-period", "ipvs.minSyncPeriod", kp.IPVS.MinSyncPeriod.Duration, true},
		{"ipvs-tcp-timeout", "ipvs.tcpTimeout", kp.IPVS.TCPTimeout.Duration, true},
		{"ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout", kp.IPVS.TCPFinTimeout.Duration, true},
		{"ipvs-udp-timeout", "ipvs.udpTimeout", kp.IPVS.UDPTimeout.Duration, true},
		{"conntrack-udp-timeout", "conntrack.udpTimeout", kp.Conntrack.UDPTimeout.Duration, true},
		{"conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", kp.Conntrack.UDPStreamTimeout.Duration, true},
		{"udp-timeout", "", c.UDPTimeout, false},
		{"connect-budget", "", c.ConnectBudget, false},
		{"eject-backoff", "", c.EjectBackoff, true},
		{"eject-max-backoff", "", c.EjectMaxBackoff, true},
		{"drain-timeout", "", c.DrainTimeout, true},
		{"manifest-coalesce", "", c.ManifestCoalesce, false},
	} {
		if d.v < 0 || (d.v == 0 && !d.zeroOK) {
			want := "must be greater than 0"
			if d.zeroOK {
				want = "must not be negative"
			}
			p.add(d.flag, d.field, d.v, "%s", want)
		}
	}
	if kp.IPTables.MinSyncPeriod.Duration > kp.IPTables.SyncPeriod.Duration {
		p.add("iptables-min-sync-period", "iptables.minSyncPeriod", kp.IPTables.MinSyncPeriod.Duration, "must not exceed --iptables-sync-period (%s)", kp.IPTables.SyncPeriod.Duration)
	}
	if b := kp.IPTables.MasqueradeBit; b != nil && (*b < 0 || *b > 31) {
		p.add("iptables-masquerade-bit", "iptables.masqueradeBit", *b, "must be within [0, 31]")
	}
	if o := kp.OOMScoreAdj; o != nil && (*o < -1000 || *o > 1000) {
		p.add("oom-score-adj", "oomScoreAdj", *o, "must be within [-1000, 1000]")
	}
	if v := kp.Conntrack.MaxPerCore; v != nil && *v < 0 {
		p.add("conntrack-max-per-core", "conntrack.maxPerCore", *v, "must not be negative")
	}
	if v := kp.Conntrack.Min; v != nil && *v < 0 {
		p.add("conntrack-min", "conntrack.min", *v, "must not be negative")
	}
	if c.ManifestMaxBytes < 0 {
		p.add("manifest-max-bytes", "", c.ManifestMaxBytes, "must not be negative (0: no limit)")
	}
	if kp.ClientConnection.QPS < 0 {
		p.add("kube-api-qps", "clientConnection.qps", kp.ClientConnection.QPS, "must not be negative")
	}
	if kp.ClientConnection.Burst < 0 {
		p.add("kube-api-burst", "clientConnection.burst", kp.ClientConnection.Burst, "must not be negative")
	}
	if kp.ClusterCIDR != "" {
		cidrs := strings.Split(kp.ClusterCIDR, ",")
		for _, s := range cidrs {
			if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
				p.add("cluster-cidr", "clusterCIDR", kp.ClusterCIDR, "%q is not a CIDR", s)
			}
		}
		if len(cidrs) > 2 {
			p.add("cluster-cidr", "clusterCIDR", kp.ClusterCIDR, "at most one CIDR per IP family")
		}
	}
	for _, s := range kp.NodePortAddresses {
		if s == "primary" {
			continue
		}
		if _, err := netip.ParsePrefix(s); err != nil {
			p.add("nodeport-addresses", "nodePortAddresses", s, "not a CIDR or \"primary\"")
		}
	}
	for _, s := range kp.IPVS.ExcludeCIDRs {
		if _, err := netip.ParsePrefix(s); err != nil {
			p.add("ipvs-exclude-cidrs", "ipvs.excludeCIDRs", s, "not a CIDR")
		}
	}
	if !slices.Contains(ipvsSchedulers, kp.IPVS.Scheduler) {
		p.add("ipvs-scheduler", "ipvs.scheduler", kp.IPVS.Scheduler, "want one of %s", strings.Join(ipvsSchedulers[1:], ", "))
	}
	switch kp.DetectLocalMode {
	case "", "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix":
	default:
		p.add("detect-local-mode", "detectLocalMode", kp.DetectLocalMode, "want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix")
	}
	if kp.DetectLocalMode == "BridgeInterface" && kp.DetectLocal.BridgeInterface == "" {
		p.add("pod-bridge-interface", "detectLocal.bridgeInterface", "", "required when --detect-local-mode is BridgeInterface")
	}
	if kp.DetectLocalMode == "InterfaceNamePrefix" && kp.DetectLocal.InterfaceNamePrefix == "" {
		p.add("pod-interface-name-prefix", "detectLocal.interfaceNamePrefix", "", "required when --detect-local-mode is InterfaceNamePrefix")
	}
	if _, err := ParsePortRange(kp.PortRange); err != nil {
		p.add("proxy-port-range", "portRange", kp.PortRange, "%v", err)
	}
	if c.HealthzPort < 0 || c.HealthzPort > 65535 {
		p.add("healthz-port", "", c.HealthzPort, "must be 0-65535")
	}
	if c.MetricsPort < 0 || c.MetricsPort > 65535 {
		p.add("metrics-port", "", c.MetricsPort, "must be 0-65535")
	}
	switch c.IPTablesBackend {
	case "", "auto", "nft", "legacy":
	default:
		p.add("iptables-backend", "", c.IPTablesBackend, "want auto, nft or legacy")
	}
	switch c.UserspaceCapture {
	case "", "auto", "nftables", "iptables", "bind", "none":
	default:
		p.add("userspace-capture", "", c.UserspaceCapture, "want auto, nftables, iptables, bind or none")
	}
	if c.UserspaceCapturePort < 0 || c.UserspaceCapturePort > 65535 {
		p.add("userspace-capture-port", "", c.UserspaceCapturePort, "must be 0-65535")
	} else if c.UserspaceCapturePort != 0 {
		switch c.UserspaceCapture {
		case "bind", "none":
			p.add("userspace-capture-port", "", c.UserspaceCapturePort, "needs a redirecting capture (--userspace-capture=nftables, iptables or auto), not %s", c.UserspaceCapture)
		}
		if r, err := ParsePortRange(kp.PortRange); err == nil && r.Base != 0 && c.UserspaceCapturePort >= r.Base && c.UserspaceCapturePort < r.Base+r.Size {
			p.add("userspace-capture-port", "", c.UserspaceCapturePort, "is inside --proxy-port-range %s, whose ports are handed to proxy ports", kp.PortRange)
		}
	}
	switch c.Engine {
	case "eventloop":
		if runtime.GOOS != "linux" {
			p.add("engine", "", c.Engine, "the eventloop engine needs Linux (epoll); use goroutine")
		}
	case "goroutine":
		if c.BusyPoll != 0 {
			p.add("busy-poll", "", c.BusyPoll, "only the eventloop engine busy-polls")
		}
	default:
		p.add("engine", "", c.Engine, "want eventloop or goroutine")
	}
	if c.EventLoops < 0 || c.EventLoops > 1024 {
		p.add("event-loops", "", c.EventLoops, "want 0 (one per CPU) up to 1024")
	} else if c.EventLoops != 0 && c.Engine == "goroutine" {
		p.add("event-loops", "", c.EventLoops, "only the eventloop engine has event loops")
	}
	if c.BusyPoll < 0 || c.BusyPoll > time.Second {
		p.add("busy-poll", "", c.BusyPoll, "want 0 (off) up to 1s")
	}
	if c.IPVSDrainInterval <= 0 {
		p.add("ipvs-drain-interval", "", c.IPVSDrainInterval, "must be greater than 0")
	}
	if c.ConnectAttempts < 1 {
		p.add("connect-attempts", "", c.ConnectAttempts, "must be at least 1")
	}
	if len(c.ConnectTimeouts) == 0 {
		p.add("connect-timeouts", "", "", "at least one per-try timeout is required")
	}
	for _, t := range c.ConnectTimeouts {
		if t <= 0 {
			p.add("connect-timeouts", "", t, "every per-try timeout must be greater than 0")
		}
	}
	if c.EjectAfter < 0 {
		p.add("eject-after", "", c.EjectAfter, "must not be negative (0 turns ejection off)")
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		p.add("logging-format", "", c.LogFormat, "want text or json")
	}
	c.validateLogging(&p)
	if c.Version != "" && c.Version != "true" && c.Version != "raw" && c.Version != "false" {
		p.add("version", "", c.Version, "want true, raw or false")
	}
	return errors.Join(p...)
}

// HealthzAddress is --healthz-bind-address with the deprecated --healthz-port applied.
func (c *Config) HealthzAddress() string {
	return withPort(c.KubeProxy.HealthzBindAddress, c.HealthzPort)
}

// MetricsAddress is --metrics-bind-address with the deprecated --metrics-port applied.
func (c *Config) MetricsAddress() string {
	return withPort(c.KubeProxy.MetricsBindAddress, c.MetricsPort)
}

func withPort(addr string, port int32) string {
	if addr == "" || port == 0 {
		return addr
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(host, fmt.Sprint(port))
}

// LoggingAlphaOptions is the feature gate kube-proxy requires for its
// alpha logging options (split streams, info buffers); sluice requires it
// too, so that a command line one refuses the other refuses as well.
const LoggingAlphaOptions = "LoggingAlphaOptions"

// validateLogging checks the logging section (its flags, or a config
// file's logging:) as kube-proxy's logsapi.Validate does.
func (c *Config) validateLogging(p *problems) {
	l := &c.KubeProxy.Logging
	alpha := c.KubeProxy.FeatureGates[LoggingAlphaOptions]
	gated := []struct {
		flag, field string
		set         bool
		value       any
	}{
		{"log-text-split-stream", "logging.options.text.splitStream", l.Options.Text.SplitStream, l.Options.Text.SplitStream},
		{"log-text-info-buffer-size", "logging.options.text.infoBufferSize", l.Options.Text.InfoBufferSize.Value() != 0, quantity{&l.Options.Text.InfoBufferSize}},
		{"log-json-split-stream", "logging.options.json.splitStream", l.Options.JSON.SplitStream, l.Options.JSON.SplitStream},
		{"log-json-info-buffer-size", "logging.options.json.infoBufferSize", l.Options.JSON.InfoBufferSize.Value() != 0, quantity{&l.Options.JSON.InfoBufferSize}},
	}
	for _, g := range gated {
		if g.set && !alpha {
			p.add(g.flag, g.field, g.value, "feature %s is disabled: set --feature-gates=%s=true, as kube-proxy requires", LoggingAlphaOptions, LoggingAlphaOptions)
		}
	}
	if len(l.VModule) > 0 && c.LogFormat != "text" {
		p.add("vmodule", "logging.vmodule", logsapi.VModuleConfigurationPflag(&l.VModule).String(), "only supported for the text log format (--logging-format=%s)", c.LogFormat)
	}
	for i, item := range l.VModule {
		if item.FilePattern == "" || strings.ContainsAny(item.FilePattern, "=,") {
			p.add("vmodule", fmt.Sprintf("logging.vmodule[%d]", i), item.FilePattern, "a file pattern must be non-empty and have no = or ,")
		} else if _, err := filepath.Match(item.FilePattern, ""); err != nil {
			// kube-proxy (klog) takes it, and it matches nothing.
			c.ConfigWarnings = append(c.ConfigWarnings, fmt.Sprintf("--vmodule (config field logging.vmodule[%d]): %q is not a glob pattern (%v): it matches no file", i, item.FilePattern, err))
		}
		if item.Verbosity > math.MaxInt32 {
			p.add("vmodule", fmt.Sprintf("logging.vmodule[%d]", i), item.Verbosity, "must be at most %d", math.MaxInt32)
		}
	}
}
