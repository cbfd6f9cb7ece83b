package config

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

func TestDefaultsMatchKubeProxy(t *testing.T) {
	c, _, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	kp := c.KubeProxy
	checks := map[string][2]any{
		"bind-address":         {kp.BindAddress, "0.0.0.0"},
		"healthz-bind-address": {kp.HealthzBindAddress, "0.0.0.0:10256"},
		"metrics-bind-address": {kp.MetricsBindAddress, "127.0.0.1:10249"},
		"config-sync-period":   {kp.ConfigSyncPeriod.Duration, 15 * time.Minute},
		"iptables-sync-period": {kp.IPTables.SyncPeriod.Duration, 30 * time.Second},
		"iptables-min-sync":    {kp.IPTables.MinSyncPeriod.Duration, time.Second},
		"masquerade-bit":       {*kp.IPTables.MasqueradeBit, int32(14)},
		"oom-score-adj":        {*kp.OOMScoreAdj, int32(-999)},
		"conntrack-max":        {*kp.Conntrack.MaxPerCore, int32(32768)},
		"conntrack-min":        {*kp.Conntrack.Min, int32(131072)},
		"kube-api-qps":         {kp.ClientConnection.QPS, float32(5)},
		"kube-api-burst":       {kp.ClientConnection.Burst, int32(10)},
		"content-type":         {kp.ClientConnection.ContentType, "application/vnd.kubernetes.protobuf"},
		"udp-timeout":          {c.UDPTimeout, 250 * time.Millisecond},
		"mode":                 {c.Mode(), ModeUserspace},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s default = %v, want %v", name, c[0], c[1])
		}
	}
}

func TestInvalidFlagValuesNameTheFlagAndValue(t *testing.T) {
	cases := map[string][]string{
		"--proxy-mode":                      {"--proxy-mode=kernelspace"},
		"--bind-address":                    {"--bind-address=300.1.1.1"},
		"--udp-timeout":                     {"--udp-timeout=soon"},
		"--iptables-masquerade-bit":         {"--iptables-masquerade-bit=40"},
		"--healthz-bind-address":            {"--healthz-bind-address=localhost:x"},
		"--proxy-port-range":                {"--proxy-port-range=10-5"},
		"--cluster-cidr":                    {"--cluster-cidr=10.0.0.0/33"},
		"--oom-score-adj":                   {"--oom-score-adj=5000"},
		"--engine":                          {"--engine=turbo"},
		"--userspace-capture":               {"--userspace-capture=magic"},
		"--iptables-backend":                {"--iptables-backend=ebpf"},
		"--ipvs-scheduler":                  {"--ipvs-scheduler=fastest", "--proxy-mode=ipvs"},
		"--iptables-min-sync-period":        {"--iptables-min-sync-period=1m"},
		"--feature-gates":                   {"--feature-gates=Foo=maybe"},
		"--connect-timeouts":                {"--connect-timeouts=-2s"},
		"--busy-poll":                       {"--busy-poll=2s"},
		"--event-loops":                     {"--event-loops=-1"},
		"--userspace-capture-port":          {"--userspace-capture-port=70000"},
		"--show-hidden-metrics-for-version": {"--show-hidden-metrics-for-version=1.32"},
	}
	for flag, args := range cases {
		_, _, err := Parse(args)
		if err == nil {
			t.Errorf("%v accepted", args)
			continue
		}
		val := strings.SplitN(args[0], "=", 2)[1]
		if !strings.Contains(err.Error(), strings.TrimPrefix(flag, "--")) || !strings.Contains(err.Error(), val) {
			t.Errorf("%v: error %q does not name flag %s and value %q", args, err, flag, val)
		}
	}
	if _, _, err := Parse([]string{"stray"}); err == nil {
		t.Error("positional argument accepted")
	}
	// A capture port needs a capture that redirects, outside the proxy ports.
	for _, tc := range []struct {
		args []string
		why  string
	}{
		{[]string{"--userspace-capture-port=15001", "--userspace-capture=bind"}, "not bind"},
		{[]string{"--userspace-capture-port=30050", "--proxy-port-range=30000-30100"}, "inside --proxy-port-range 30000-30100"},
	} {
		if _, _, err := Parse(tc.args); err == nil || !strings.Contains(err.Error(), "userspace-capture-port") || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%v: %v, want an error naming the flag and %q", tc.args, err, tc.why)
		}
	}
	// The release before kube-proxy's own is the one value taken.
	if c, _, err := Parse([]string{"--show-hidden-metrics-for-version=1.33"}); err != nil || c.KubeProxy.ShowHiddenMetricsForVersion != "1.33" {
		t.Errorf("--show-hidden-metrics-for-version=1.33: %v", err)
	}
	if c, _, err := Parse([]string{"--userspace-capture-port=15001", "--userspace-capture=nftables"}); err != nil || c.UserspaceCapturePort != 15001 {
		t.Errorf("a capture port with the nftables capture: %v", err)
	}
}

func TestConfigFileAndTheFlagsItHolds(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kp.yaml")
	os.WriteFile(file, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 127.0.0.1
mode: userspace
portRange: 30000-30100
metricsBindAddress: 127.0.0.1:19249
iptables:
  syncPeriod: 45s
`), 0o644)
	c, _, err := Parse([]string{"--config", file, "--metrics-bind-address=127.0.0.1:29249"})
	if err != nil {
		t.Fatal(err)
	}
	if c.KubeProxy.BindAddress != "127.0.0.1" || c.KubeProxy.PortRange != "30000-30100" || c.KubeProxy.IPTables.SyncPeriod.Duration != 45*time.Second {
		t.Fatalf("file values not applied: %+v", c.KubeProxy)
	}
	// As in kube-proxy, a flag whose setting the file holds is ignored,
	// with a warning naming it.
	if c.KubeProxy.MetricsBindAddress != "127.0.0.1:19249" {
		t.Fatalf("a flag the file holds overrode it: %s", c.KubeProxy.MetricsBindAddress)
	}
	if len(c.ConfigWarnings) != 1 || !strings.Contains(c.ConfigWarnings[0], "--metrics-bind-address: ignored") || !strings.Contains(c.ConfigWarnings[0], file) {
		t.Fatalf("warnings %q, want one naming --metrics-bind-address and the file", c.ConfigWarnings)
	}
	if c.KubeProxy.HealthzBindAddress != "0.0.0.0:10256" {
		t.Fatalf("default lost: %s", c.KubeProxy.HealthzBindAddress)
	}

	// --write-config-to round-trips through --config.
	out := filepath.Join(dir, "out.yaml")
	if err := c.WriteFile(out); err != nil {
		t.Fatal(err)
	}
	again, _, err := Parse([]string{"--config", out})
	if err != nil {
		t.Fatalf("written config does not load: %v", err)
	}
	if again.KubeProxy.MetricsBindAddress != "127.0.0.1:19249" || again.KubeProxy.PortRange != "30000-30100" {
		t.Fatalf("round trip lost values: %+v", again.KubeProxy)
	}

	// An unknown field is accepted with a warning naming it, as kube-proxy
	// decodes leniently when only unknown or duplicate fields fail.
	os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAdress: 1.2.3.4\n"), 0o644)
	if c, _, err := Parse([]string{"--config", file}); err != nil || len(c.ConfigWarnings) != 1 || !strings.Contains(c.ConfigWarnings[0], "bindAdress") || !strings.Contains(c.ConfigWarnings[0], file) {
		t.Fatalf("unknown field: %v, warnings %v", err, c.ConfigWarnings)
	}
	os.WriteFile(file, []byte("apiVersion: v1\nkind: ConfigMap\n"), 0o644)
	if _, _, err := Parse([]string{"--config", file}); err == nil || !strings.Contains(err.Error(), "KubeProxyConfiguration") {
		t.Fatalf("wrong kind: %v", err)
	}
	os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: warp\n"), 0o644)
	if _, _, err := Parse([]string{"--config", file}); err == nil || !strings.Contains(err.Error(), "config field mode") {
		t.Fatalf("bad mode in file: %v", err)
	}
}

func TestUnusedFlagsAreReportedPerMode(t *testing.T) {
	c, _, err := Parse([]string{"--ipvs-scheduler=lc", "--udp-timeout=1s", "--masquerade-all"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.UnusedFlags(), ","); got != "ipvs-scheduler,masquerade-all" {
		t.Fatalf("unused in userspace = %q", got)
	}
	c, _, _ = Parse([]string{"--proxy-mode=ipvs", "--ipvs-scheduler=lc", "--udp-timeout=1s"})
	if got := strings.Join(c.UnusedFlags(), ","); got != "udp-timeout" {
		t.Fatalf("unused in ipvs = %q", got)
	}
}

// --healthz-port and --metrics-port are kube-proxy's: a port for a bind
// address given as an IP alone, 0 for off, and nothing for an address
// with a port (the default ones included).
func TestDeprecatedPortsApply(t *testing.T) {
	for _, tc := range []struct {
		args             []string
		healthz, metrics string
	}{
		{[]string{"--healthz-port=12345", "--metrics-port=23456"}, "0.0.0.0:10256", "127.0.0.1:10249"},
		{[]string{"--healthz-bind-address=10.0.0.1", "--metrics-bind-address=::1", "--healthz-port=12345", "--metrics-port=23456"}, "10.0.0.1:12345", "[::1]:23456"},
		{[]string{"--healthz-bind-address=10.0.0.1", "--metrics-bind-address=::1"}, "10.0.0.1:10256", "[::1]:10249"},
		{[]string{"--healthz-port=0", "--metrics-port=0"}, "", ""},
	} {
		c, _, err := Parse(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.HealthzAddress() != tc.healthz || c.MetricsAddress() != tc.metrics {
			t.Errorf("%v: %q %q, want %q %q", tc.args, c.HealthzAddress(), c.MetricsAddress(), tc.healthz, tc.metrics)
		}
	}
}

// A mistyped flag gets the closest real one suggested; a far-off one none.
func TestUnknownFlagSuggestsTheClosest(t *testing.T) {
	for typed, want := range map[string]string{
		"--proxy-mod=iptables":       "did you mean --proxy-mode?",
		"--helthz-bind-address=:1":   "did you mean --healthz-bind-address?",
		"--conntrack-max-per-cor=10": "did you mean --conntrack-max-per-core?",
		"--zzzzzz":                   "",
	} {
		_, _, err := Parse([]string{typed})
		if err == nil || !strings.Contains(err.Error(), "unknown flag") {
			t.Fatalf("%s: %v", typed, err)
		}
		if want == "" && strings.Contains(err.Error(), "did you mean") || want != "" && !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %q, want %q", typed, err, want)
		}
	}
}

// A feature gate kube-proxy v1.34.2 does not know is refused, as is a
// locked one set against its lock; known ones are taken, from the flag
// or the file, and the error names the gate.
func TestFeatureGatesAreValidatedAsKubeProxyDoes(t *testing.T) {
	for _, tc := range []struct {
		gates string
		err   string
	}{
		{"LoggingAlphaOptions=true,AllAlpha=false,APIServerIdentity=false", ""},
		{"APIServerTracing=true", ""},
		{"NoSuchGate=true", "unrecognized feature gate: NoSuchGate"},
		{"APIServerTracing=false", "cannot set feature gate APIServerTracing to false, feature is locked to true"},
	} {
		_, _, err := Parse([]string{"--feature-gates=" + tc.gates})
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--feature-gates")) {
			t.Errorf("%s: %v, want %q", tc.gates, err, tc.err)
		}
	}
	file := filepath.Join(t.TempDir(), "kp.yaml")
	os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfeatureGates:\n  NoSuchGate: true\n"), 0o644)
	if _, _, err := Parse([]string{"--config", file}); err == nil || !strings.Contains(err.Error(), "featureGates") || !strings.Contains(err.Error(), "NoSuchGate") {
		t.Errorf("a file's unknown gate: %v", err)
	}
}

// kernelspace is kube-proxy's Windows mode: taken there (and served in
// userspace mode, cmd/sluice), refused elsewhere as kube-proxy refuses it,
// with a word on why. The flags userspace mode reads are in use in it.
func TestKernelspaceIsTakenOnWindowsOnly(t *testing.T) {
	if !slices.Contains(validModes("windows"), ModeKernelspace) {
		t.Errorf("windows modes %v lack kernelspace", validModes("windows"))
	}
	for _, goos := range []string{"linux", "darwin"} {
		if slices.Contains(validModes(goos), ModeKernelspace) {
			t.Errorf("%s modes %v hold kernelspace", goos, validModes(goos))
		}
	}
	_, _, err := Parse([]string{"--proxy-mode=kernelspace"})
	if runtime.GOOS == "windows" {
		if err != nil {
			t.Fatalf("kernelspace on Windows: %v", err)
		}
	} else if err == nil || !strings.Contains(err.Error(), "kernelspace is kube-proxy's Windows mode") {
		t.Fatalf("kernelspace on %s: %v", runtime.GOOS, err)
	}
	c := &Config{KubeProxy: kpv1alpha1.KubeProxyConfiguration{Mode: ModeKernelspace}, Changed: []string{"udp-timeout", "engine", "mode-fallback", "ipvs-scheduler", "masquerade-all"}}
	if got := strings.Join(c.UnusedFlags(), ","); got != "ipvs-scheduler,masquerade-all" {
		t.Errorf("unused in kernelspace = %q, want ipvs-scheduler,masquerade-all", got)
	}
}

// On Windows kube-proxy has five flags of its kernelspace mode; sluice
// takes them there (a Windows node's command line starts as it is), and
// reports them unused. Elsewhere they are unknown, as to kube-proxy.
func TestWinkernelFlagsAreTakenOnWindowsOnly(t *testing.T) {
	names := []string{"source-vip", "network-name", "enable-dsr", "root-hnsendpoint-name", "forward-healthcheck-vip"}
	for _, goos := range []string{"linux", "darwin"} {
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		addOSFlags(fs, &kpv1alpha1.KubeProxyConfiguration{}, goos)
		fs.VisitAll(func(f *pflag.Flag) { t.Errorf("%s has --%s", goos, f.Name) })
	}
	if runtime.GOOS != "windows" {
		if _, _, err := Parse([]string{"--source-vip=10.0.0.5"}); err == nil || !strings.Contains(err.Error(), "unknown flag: --source-vip") {
			t.Errorf("--source-vip on %s: %v", runtime.GOOS, err)
		}
	}
	kp := &kpv1alpha1.KubeProxyConfiguration{}
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	addOSFlags(fs, kp, "windows")
	if kp.Winkernel.RootHnsEndpointName != "cbr0" {
		t.Errorf("root HNS endpoint default %q, want kube-proxy's cbr0", kp.Winkernel.RootHnsEndpointName)
	}
	if err := fs.Parse([]string{"--source-vip=10.0.0.5", "--network-name=vxlan0", "--enable-dsr", "--root-hnsendpoint-name=ep0", "--forward-healthcheck-vip"}); err != nil {
		t.Fatal(err)
	}
	w := kp.Winkernel
	if w.SourceVip != "10.0.0.5" || w.NetworkName != "vxlan0" || !w.EnableDSR || w.RootHnsEndpointName != "ep0" || !w.ForwardHealthCheckVip {
		t.Errorf("winkernel settings %+v", w)
	}
	c := &Config{Changed: names}
	if got := c.UnusedFlags(); len(got) != len(names) {
		t.Errorf("unused %v, want all of %v", got, names)
	}
	for _, n := range names {
		if fs.Lookup(n) == nil {
			t.Errorf("no --%s on Windows", n)
		}
		if !FileHoldsFlag(n) {
			t.Errorf("--%s: a --config file holds it in kube-proxy", n)
		}
		if g := slices.IndexFunc(helpGroups(), func(g helpGroup) bool { return g.match(n) }); g < 0 {
			t.Errorf("--%s is in no --help group", n)
		}
	}
}

// FlagValues, for /flagz, are the flags as kube-proxy lists its own: the
// command line over the defaults, the mode's defaults included (nftables
// mode's "primary" NodePort addresses), --help and --version unset; with
// --config, not the file's settings, which kube-proxy's flags never hold.
func TestFlagValuesAreTheCommandLinesOverTheDefaults(t *testing.T) {
	cfg, _, err := Parse([]string{"--proxy-mode=nftables", "--v=3", "--hostname-override=Node-A"})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"proxy-mode": "nftables", "v": "3", "hostname-override": "node-a", "nodeport-addresses": "[primary]",
		"help": "false", "version": "false", "bind-address": "0.0.0.0", "iptables-sync-period": "30s", "manifests": ""} {
		if got, ok := cfg.FlagValues[name]; !ok || got != want {
			t.Errorf("--%s: %q (listed: %t), want %q", name, got, ok, want)
		}
	}
	file := filepath.Join(t.TempDir(), "kp.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nbindAddress: 10.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err = Parse([]string{"--config=" + file, "--v=4"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KubeProxy.BindAddress != "10.0.0.1" || cfg.FlagValues["bind-address"] != "0.0.0.0" || cfg.FlagValues["config"] != file || cfg.FlagValues["v"] != "4" {
		t.Errorf("with --config: bind address %q in effect, --bind-address %q, --config %q, --v %q", cfg.KubeProxy.BindAddress, cfg.FlagValues["bind-address"], cfg.FlagValues["config"], cfg.FlagValues["v"])
	}
}
