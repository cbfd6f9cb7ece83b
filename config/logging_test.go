package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kube-proxy's alpha logging options are refused without the
// LoggingAlphaOptions gate, as kube-proxy refuses them, naming the flag
// (or the config field) and the gate; with it they are taken. The buffer
// sizes are taken and reported unused: sluice's log is not buffered.
func TestAlphaLoggingOptionsNeedTheirFeatureGate(t *testing.T) {
	for _, args := range [][]string{
		{"--log-text-split-stream"},
		{"--log-json-split-stream", "--logging-format=json"},
		{"--log-text-info-buffer-size=64Ki"},
		{"--log-json-info-buffer-size=1M"},
	} {
		flag := strings.SplitN(strings.TrimPrefix(args[0], "--"), "=", 2)[0]
		_, _, err := Parse(args)
		if err == nil || !strings.Contains(err.Error(), "--"+flag) || !strings.Contains(err.Error(), "LoggingAlphaOptions") {
			t.Fatalf("%v without the gate: %v", args, err)
		}
		c, _, err := Parse(append(args, "--feature-gates=LoggingAlphaOptions=true"))
		if err != nil {
			t.Fatalf("%v with the gate: %v", args, err)
		}
		unused := strings.Join(c.UnusedFlags(), ",")
		if strings.Contains(flag, "buffer") != strings.Contains(unused, flag) {
			t.Fatalf("%v: unused flags %q", args, unused)
		}
	}
	if c, _, _ := Parse([]string{"--log-text-split-stream", "--feature-gates=LoggingAlphaOptions=true"}); !c.KubeProxy.Logging.Options.Text.SplitStream {
		t.Fatal("--log-text-split-stream did not set logging.options.text.splitStream")
	}
	// In a config file, kube-proxy v1.34 loses them (its logging flags'
	// registration resets them), gate or no gate: so does sluice, with a
	// warning. The flags still set them over the file.
	dir := t.TempDir()
	file := filepath.Join(dir, "kp.yaml")
	for _, gates := range []string{"", "featureGates:\n  LoggingAlphaOptions: true\n"} {
		os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+gates+"logging:\n  options:\n    text:\n      splitStream: true\n"), 0o644)
		c, _, err := Parse([]string{"--config", file})
		if err != nil || c.KubeProxy.Logging.Options.Text.SplitStream || len(c.ConfigWarnings) != 1 || !strings.Contains(c.ConfigWarnings[0], "logging.options") {
			t.Fatalf("a config file's splitStream (gates %q): %v, warnings %q", gates, err, c.ConfigWarnings)
		}
	}
	if c, _, err := Parse([]string{"--config", file, "--log-text-split-stream"}); err != nil || !c.KubeProxy.Logging.Options.Text.SplitStream {
		t.Fatalf("--log-text-split-stream with a file holding the gate: %v", err)
	}
	os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"), 0o644)
	if _, _, err := Parse([]string{"--config", file, "--log-text-split-stream", "--feature-gates=LoggingAlphaOptions=true"}); err == nil || !strings.Contains(err.Error(), "featureGates") {
		t.Fatalf("--log-text-split-stream with the gate on the command line, ignored with --config: %v", err)
	}
}

// --vmodule takes kube-proxy's pattern=N list into logging.vmodule; it is
// refused with the JSON format and in a malformed item, as kube-proxy
// refuses them; a pattern that is no glob is taken, as by kube-proxy, with
// a warning that it matches nothing.
func TestVModuleIsKubeProxys(t *testing.T) {
	c, _, err := Parse([]string{"--vmodule=proxy*=2,main=1"})
	if err != nil {
		t.Fatal(err)
	}
	vm := c.KubeProxy.Logging.VModule
	if len(vm) != 2 || vm[0].FilePattern != "proxy*" || vm[0].Verbosity != 2 || vm[1].FilePattern != "main" || vm[1].Verbosity != 1 {
		t.Fatalf("logging.vmodule = %+v", vm)
	}
	for _, bad := range [][]string{{"--vmodule=proxy"}, {"--vmodule=proxy=x"}, {"--vmodule=a=1", "--logging-format=json"}} {
		if _, _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "--vmodule") {
			t.Fatalf("%v: %v", bad, err)
		}
	}
	c, _, err = Parse([]string{"--vmodule=[=2"})
	if err != nil || len(c.ConfigWarnings) != 1 || !strings.Contains(c.ConfigWarnings[0], "not a glob pattern") {
		t.Fatalf("--vmodule=[=2: %v, warnings %q", err, c.ConfigWarnings)
	}
}

// cAdvisor's two flags, which kube-proxy's command line carries from a
// library it links, are taken and reported unused in every mode.
func TestCAdvisorFlagsAreTakenAndUnused(t *testing.T) {
	for _, mode := range []string{ModeUserspace, ModeIPTables} {
		c, _, err := Parse([]string{"--proxy-mode=" + mode, "--boot-id-file=/x", "--machine-id-file=/y,/z"})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(c.UnusedFlags(), ","); got != "boot-id-file,machine-id-file" {
			t.Fatalf("%s: unused %q", mode, got)
		}
	}
}
