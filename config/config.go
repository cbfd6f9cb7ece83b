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
	"strconv"
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
	// ModeKernelspace is kube-proxy's one mode on Windows (HNS load
	// balancers, its default there). sluice takes it on Windows, as
	// kube-proxy does, and serves it in userspace mode with one log line
	// saying so, or refuses it with --mode-fallback=false.
	ModeKernelspace = "kernelspace"
)

// validModes lists the --proxy-mode values taken on goos: kernelspace
// only on Windows, where kube-proxy takes it and nothing else.
func validModes(goos string) []string {
	modes := []string{ModeUserspace, ModeIPTables, ModeIPVS, ModeNFTables}
	if goos == "windows" {
		modes = append(modes, ModeKernelspace)
	}
	return modes
}

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
	// HealthzPort and MetricsPort are the deprecated --healthz-port and
	// --metrics-port (kube-proxy's defaults, 10256 and 10249): without
	// --config, the port of a bind address given as an IP alone, and 0
	// turns the server off.
	HealthzPort int32
	MetricsPort int32

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
	// FlagValues is every flag's value as the command line left it over
	// its default (not what --config set), for /flagz, as kube-proxy shows
	// its flags there.
	FlagValues map[string]string
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
		// kube-proxy's command line gives IPVS mode the same minimum as
		// the others (its flag defaults to the one internal period, 1s); a
		// file's ipvs section is not defaulted (setKubeProxyDefaults).
		IPVS: kpv1alpha1.KubeProxyIPVSConfiguration{
			SyncPeriod:    dur(30 * time.Second),
			MinSyncPeriod: dur(time.Second),
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
	kp.Logging.FlushFrequency = logsapi.TimeOrMetaDuration{Duration: dur(5 * time.Second), SerializeAsString: true}
	kp.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	kp.ClientConnection.AcceptContentTypes = ""
	kp.ClientConnection.QPS = 5
	kp.ClientConnection.Burst = 10
	return &Config{
		KubeProxy:         kp,
		HealthzPort:       10256,
		MetricsPort:       10249,
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
	if kp.Logging.FlushFrequency.Duration.Duration == 0 {
		kp.Logging.FlushFrequency = def.Logging.FlushFrequency
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

// validIPPort is kube-proxy's validateHostPort (an IP as kube-proxy parses
// it, and a port), except that sluice also takes "" (the server off) and
// port 0 (an ephemeral one), which kube-proxy refuses.
func validIPPort(s string) error {
	if s == "" {
		return nil // disabled
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if _, ok := parseIPSloppy(host); !ok {
		return fmt.Errorf("%q is not an IP address", host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q is not a port 0-65535", port)
	}
	return nil
}

// NodePortAddressesPrimary is the --nodeport-addresses value for the
// node's primary addresses.
const NodePortAddressesPrimary = "primary"

var ipvsSchedulers = []string{"", "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh"}

// Validate checks every setting and reports all problems at once.
// showHiddenMetricsVersion is the one value kube-proxy v1.34 takes for
// --show-hidden-metrics-for-version: the minor release before its own.
const showHiddenMetricsVersion = "1.33"

func (c *Config) Validate() error {
	var p problems
	kp := &c.KubeProxy
	if modes := validModes(runtime.GOOS); !slices.Contains(modes, c.Mode()) {
		hint := ""
		if c.Mode() == ModeKernelspace {
			hint = " (kernelspace is kube-proxy's Windows mode)"
		}
		p.add("proxy-mode", "mode", kp.Mode, "want one of %s%s", strings.Join(modes, ", "), hint)
	}
	if _, ok := parseIPSloppy(kp.BindAddress); !ok {
		p.add("bind-address", "bindAddress", kp.BindAddress, "not an IP address")
	}
	if err := validIPPort(kp.HealthzBindAddress); err != nil {
		p.add("healthz-bind-address", "healthzBindAddress", kp.HealthzBindAddress, "%v (want IP:port, or empty to disable)", err)
	}
	if err := validIPPort(kp.MetricsBindAddress); err != nil {
		p.add("metrics-bind-address", "metricsBindAddress", kp.MetricsBindAddress, "%v (want IP:port, or empty to disable)", err)
	}
	// As in kube-proxy, a section is checked only in the mode that uses
	// it: the sync periods of the mode's own section, the IPVS settings in
	// IPVS mode, the nftables masquerade bit in nftables mode.
	type period struct {
		flag, field string
		v           time.Duration
		zeroOK      bool
	}
	syncFlag, syncField, minFlag, minField := "iptables-sync-period", "iptables.syncPeriod", "iptables-min-sync-period", "iptables.minSyncPeriod"
	switch c.Mode() {
	case ModeIPVS:
		syncFlag, syncField, minFlag, minField = "ipvs-sync-period", "ipvs.syncPeriod", "ipvs-min-sync-period", "ipvs.minSyncPeriod"
	case ModeNFTables:
		syncField, minField = "nftables.syncPeriod", "nftables.minSyncPeriod"
	}
	sync, minSync := c.SyncPeriods()
	periods := []period{
		{"config-sync-period", "configSyncPeriod", kp.ConfigSyncPeriod.Duration, false},
		{syncFlag, syncField, sync, false},
		{minFlag, minField, minSync, true},
		{"conntrack-udp-timeout", "conntrack.udpTimeout", kp.Conntrack.UDPTimeout.Duration, true},
		{"conntrack-udp-timeout-stream", "conntrack.udpStreamTimeout", kp.Conntrack.UDPStreamTimeout.Duration, true},
		{"udp-timeout", "", c.UDPTimeout, false},
		{"connect-budget", "", c.ConnectBudget, false},
		{"eject-backoff", "", c.EjectBackoff, true},
		{"eject-max-backoff", "", c.EjectMaxBackoff, true},
		{"drain-timeout", "", c.DrainTimeout, true},
		{"manifest-coalesce", "", c.ManifestCoalesce, false},
	}
	if d := kp.Conntrack.TCPEstablishedTimeout; d != nil {
		periods = append(periods, period{"conntrack-tcp-timeout-established", "conntrack.tcpEstablishedTimeout", d.Duration, true})
	}
	if d := kp.Conntrack.TCPCloseWaitTimeout; d != nil {
		periods = append(periods, period{"conntrack-tcp-timeout-close-wait", "conntrack.tcpCloseWaitTimeout", d.Duration, true})
	}
	if c.Mode() == ModeIPVS {
		periods = append(periods,
			period{"ipvs-tcp-timeout", "ipvs.tcpTimeout", kp.IPVS.TCPTimeout.Duration, true},
			period{"ipvs-tcpfin-timeout", "ipvs.tcpFinTimeout", kp.IPVS.TCPFinTimeout.Duration, true},
			period{"ipvs-udp-timeout", "ipvs.udpTimeout", kp.IPVS.UDPTimeout.Duration, true})
	}
	for _, d := range periods {
		if d.v < 0 || (d.v == 0 && !d.zeroOK) {
			want := "must be greater than 0"
			if d.zeroOK {
				want = "must not be negative"
			}
			p.add(d.flag, d.field, d.v, "%s", want)
		}
	}
	if minSync > sync {
		p.add(minFlag, minField, minSync, "must not exceed the sync period, --%s (config field %s): %s", syncFlag, syncField, sync)
	}
	if b := kp.IPTables.MasqueradeBit; b != nil && (*b < 0 || *b > 31) {
		p.add("iptables-masquerade-bit", "iptables.masqueradeBit", *b, "must be within [0, 31]")
	}
	if b := kp.NFTables.MasqueradeBit; c.Mode() == ModeNFTables && b != nil && (*b < 0 || *b > 31) {
		p.add("iptables-masquerade-bit", "nftables.masqueradeBit", *b, "must be within [0, 31]")
	}
	if o := kp.OOMScoreAdj; o != nil && (*o < -1000 || *o > 1000) {
		p.add("oom-score-adj", "oomScoreAdj", *o, "must be within [-1000, 1000]")
	}
	// kube-proxy takes only the release before its own here
	// (component-base's ValidateShowHiddenMetricsVersion), in a flag or a
	// file; v1.34 has no hidden metrics, so that is all the value does.
	if v := kp.ShowHiddenMetricsForVersion; v != "" && v != showHiddenMetricsVersion {
		p.add("show-hidden-metrics-for-version", "showHiddenMetricsForVersion", v, "must be omitted or have the value '%s': only the previous minor version is allowed", showHiddenMetricsVersion)
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
	if kp.ClientConnection.Burst < 0 {
		p.add("kube-api-burst", "clientConnection.burst", kp.ClientConnection.Burst, "must not be negative")
	}
	// kube-proxy checks the cluster CIDRs only where it uses them, in
	// ClusterCIDR mode: one CIDR, or a pair of two families.
	if (kp.ClusterCIDR != "" || slices.Contains(c.Changed, "cluster-cidr")) && kp.DetectLocalMode == "ClusterCIDR" {
		cidrs := strings.Split(kp.ClusterCIDR, ",")
		var v4, v6 int
		for _, s := range cidrs {
			if c, ok := parseCIDRSloppy(s); !ok {
				p.add("cluster-cidr", "clusterCIDR", kp.ClusterCIDR, "%q is not a CIDR", s)
			} else if c.Addr().Is4() {
				v4++
			} else {
				v6++
			}
		}
		if len(cidrs) > 2 || v4 > 1 || v6 > 1 {
			p.add("cluster-cidr", "clusterCIDR", kp.ClusterCIDR, "want one CIDR, or a dual-stack pair (one per IP family)")
		}
	}
	for i, s := range kp.NodePortAddresses {
		if s == NodePortAddressesPrimary {
			if len(kp.NodePortAddresses) > 1 {
				p.add("nodeport-addresses", fmt.Sprintf("nodePortAddresses[%d]", i), s, "\"primary\" cannot be listed with CIDRs")
			}
			continue
		}
		if _, ok := parseCIDRSloppy(s); !ok {
			p.add("nodeport-addresses", fmt.Sprintf("nodePortAddresses[%d]", i), s, "not a CIDR or \"primary\"")
		}
	}
	if c.Mode() == ModeIPVS {
		for i, s := range kp.IPVS.ExcludeCIDRs {
			if _, ok := parseCIDRSloppy(s); !ok {
				p.add("ipvs-exclude-cidrs", fmt.Sprintf("ipvs.excludeCIDRs[%d]", i), s, "not a CIDR")
			}
		}
		// kube-proxy takes any name here, and then fails at start-up when
		// the kernel refuses a virtual server with it (CanUseIPVSProxier).
		if !slices.Contains(ipvsSchedulers, kp.IPVS.Scheduler) {
			p.add("ipvs-scheduler", "ipvs.scheduler", kp.IPVS.Scheduler, "want one of %s", strings.Join(ipvsSchedulers[1:], ", "))
		}
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
	// kube-proxy v1.34 has no use for portRange and takes anything there;
	// userspace mode's proxy ports use it.
	if _, err := ParsePortRange(kp.PortRange); err != nil && c.Mode() == ModeUserspace {
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
	c.validateFeatureGates(&p)
	c.validateLogging(&p)
	if c.Version != "" && c.Version != "true" && c.Version != "raw" && c.Version != "false" {
		p.add("version", "", c.Version, "want true, raw or false")
	}
	return errors.Join(p...)
}

// canonicalise rewrites the addresses and CIDRs that only kube-proxy's
// sloppy parsers take (010.0.0.1) into the text the rest of sluice reads.
func (c *Config) canonicalise() {
	kp := &c.KubeProxy
	kp.BindAddress = canonicalIP(kp.BindAddress)
	if kp.HealthzBindAddress != "" {
		kp.HealthzBindAddress = canonicalHostPort(kp.HealthzBindAddress)
	}
	if kp.MetricsBindAddress != "" {
		kp.MetricsBindAddress = canonicalHostPort(kp.MetricsBindAddress)
	}
	for i, s := range kp.NodePortAddresses {
		kp.NodePortAddresses[i] = canonicalCIDR(s)
	}
	for i, s := range kp.IPVS.ExcludeCIDRs {
		kp.IPVS.ExcludeCIDRs[i] = canonicalCIDR(s)
	}
	if kp.ClusterCIDR != "" {
		cidrs := strings.Split(kp.ClusterCIDR, ",")
		for i, s := range cidrs {
			cidrs[i] = canonicalCIDR(s)
		}
		kp.ClusterCIDR = strings.Join(cidrs, ",")
	}
}

// HealthzAddress is where the health check server listens ("" for off).
func (c *Config) HealthzAddress() string { return c.KubeProxy.HealthzBindAddress }

// MetricsAddress is where the metrics server listens ("" for off).
func (c *Config) MetricsAddress() string { return c.KubeProxy.MetricsBindAddress }

// addressFromDeprecatedFlags is kube-proxy's: port 0 turns the server off,
// and an address given as an IP alone gets the port; an address with a
// port keeps it (so --healthz-port=N alone changes nothing, as in
// kube-proxy).
func addressFromDeprecatedFlags(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	if _, ok := parseIPSloppy(addr); !ok {
		return addr // validation names it
	}
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}

// featureGate is what kube-proxy knows of one of its feature gates
// (featuregates.go, generated from its binary).
type featureGate struct {
	stage       string // ALPHA, BETA, GA or DEPRECATED
	def, locked bool   // its default, and whether it may be set otherwise
}

// KubeProxyGates lists the feature gates kube-proxy v1.34.2 knows, sorted.
func KubeProxyGates() []string { return kubeProxyGateNames() }

// KubeProxyGate is what kube-proxy v1.34.2 knows of the gate: its stage
// (ALPHA, BETA, GA or DEPRECATED), its default, and whether it is locked
// to it; known is false for a gate it does not know.
func KubeProxyGate(name string) (stage string, def, locked, known bool) {
	g, known := kubeProxyGate(name)
	return g.stage, g.def, g.locked, known
}

// validateFeatureGates refuses, as kube-proxy v1.34.2 does, a gate it
// does not know and a locked gate set against its lock. sluice uses one
// gate (LoggingAlphaOptions); the others are taken and have no effect.
func (c *Config) validateFeatureGates(p *problems) {
	names := make([]string, 0, len(c.KubeProxy.FeatureGates))
	for name := range c.KubeProxy.FeatureGates {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		v := c.KubeProxy.FeatureGates[name]
		value := fmt.Sprintf("%s=%t", name, v)
		switch g, known := kubeProxyGate(name); {
		case !known:
			p.add("feature-gates", "featureGates", value, "unrecognized feature gate: %s (not one of kube-proxy v1.34.2's)", name)
		case g.locked && v != g.def:
			p.add("feature-gates", "featureGates", value, "cannot set feature gate %s to %t, feature is locked to %t", name, v, g.def)
		}
	}
}

// GateEnabled reports whether kube-proxy's feature gate name is on: as
// set (on the command line, or in --config's featureGates), else its
// default in kube-proxy v1.34.2 (false for a gate it does not know).
func (c *Config) GateEnabled(name string) bool {
	if v, set := c.KubeProxy.FeatureGates[name]; set {
		return v
	}
	_, def, _, _ := KubeProxyGate(name)
	return def
}

// LoggingAlphaOptions is the feature gate kube-proxy requires for its
// alpha logging options (split streams, info buffers); sluice requires it
// too, so that a command line one refuses the other refuses as well.
const LoggingAlphaOptions = "LoggingAlphaOptions"

// validateLogging checks the logging section (its flags, or a config
// file's logging:) as kube-proxy's logsapi.Validate does.
func (c *Config) validateLogging(p *problems) {
	l := &c.KubeProxy.Logging
	alpha := c.GateEnabled(LoggingAlphaOptions)
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
	enable := fmt.Sprintf("--feature-gates=%s=true", LoggingAlphaOptions)
	if c.ConfigFile != "" {
		enable = fmt.Sprintf("featureGates: {%s: true} in --config %s (kube-proxy ignores --feature-gates with --config)", LoggingAlphaOptions, c.ConfigFile)
	}
	for _, g := range gated {
		if g.set && !alpha {
			p.add(g.flag, g.field, g.value, "feature %s is disabled: set %s, as kube-proxy requires", LoggingAlphaOptions, enable)
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
