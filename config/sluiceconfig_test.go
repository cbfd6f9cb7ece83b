package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// comparable drops what describes how a Config was obtained rather than
// what it says, and the KubeProxyConfiguration's logging section, which
// sluice reads into LogFormat and Verbosity (compared there) and otherwise
// only carries through.
func comparable(c *Config) Config {
	out := *c
	out.ConfigFile, out.WriteConfigTo, out.FileMode, out.Changed, out.ConfigWarnings, out.FlagValues = "", "", "", nil, nil, nil
	out.KubeProxy.Logging = logsapi.LoggingConfiguration{}
	return out
}

// --write-config-to writes every setting, kube-proxy's and sluice's own,
// and --config reads it back to the same Config: the defaults, and a
// command line that changes every sluice setting, explicit zeros included
// (--eject-after 0 turns ejection off; --handover-socket "" turns the
// hand-over off: an absent field must not be confused with them).
func TestWriteConfigRoundTripsSluiceSettings(t *testing.T) {
	for name, args := range map[string][]string{
		"defaults": nil,
		"every sluice flag": {"--manifests=/etc/sluice/services", "--manifest-coalesce=250ms", "--manifest-max-bytes=0",
			"--engine=goroutine", "--udp-timeout=3s", "--userspace-capture=bind", "--iptables-backend=legacy",
			"--mode-fallback=false", "--ipvs-drain-interval=2m", "--connect-timeouts=100ms,1s", "--connect-attempts=2",
			"--connect-budget=5s", "--eject-after=0", "--eject-backoff=1s", "--eject-max-backoff=10s",
			"--drain-timeout=0s", "--handover-socket=", "--logging-format=json", "-v=3", "--proxy-mode=iptables",
			"--cluster-cidr=10.244.0.0/16"},
		"event loops": {"--event-loops=3", "--busy-poll=50us"},
	} {
		t.Run(name, func(t *testing.T) {
			want, _, err := Parse(args)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "config.yaml")
			if err := want.WriteFile(file); err != nil {
				t.Fatal(err)
			}
			got, _, err := Parse([]string{"--config", file})
			if err != nil {
				data, _ := os.ReadFile(file)
				t.Fatalf("written file does not load: %v\n%s", err, data)
			}
			if len(got.ConfigWarnings) > 0 {
				t.Fatalf("warnings on a file sluice wrote: %v", got.ConfigWarnings)
			}
			if w, g := comparable(want), comparable(got); !reflect.DeepEqual(w, g) {
				data, _ := os.ReadFile(file)
				t.Fatalf("round trip changed the config:\nwant %+v\ngot  %+v\nfile:\n%s", w, g, data)
			}
			if len(args) > 0 && reflect.DeepEqual(comparable(got), comparable(Defaults())) {
				t.Fatal("the flags changed nothing: the test proves nothing")
			}
		})
	}
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

const kubeProxyDoc = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n"

// A SluiceConfiguration document sets sluice's settings; an absent field
// keeps its default; flags override the file; alone (no
// KubeProxyConfiguration) it leaves kube-proxy's settings at their
// defaults.
func TestSluiceConfigurationDocument(t *testing.T) {
	file := writeConfig(t, kubeProxyDoc+`---
# sluice's own
apiVersion: config.sluice-proxy.io/v1alpha1
kind: SluiceConfiguration
engine: goroutine
connect:
  timeouts: [100ms, 300ms]
ejection:
  after: 0
handoverSocket: ""
`)
	c, _, err := Parse([]string{"--config", file, "--connect-attempts=7"})
	if err != nil {
		t.Fatal(err)
	}
	def := Defaults()
	if c.Mode() != ModeIPTables || c.Engine != "goroutine" || c.EjectAfter != 0 || c.HandoverSocket != "" ||
		!reflect.DeepEqual(c.ConnectTimeouts, []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}) {
		t.Fatalf("file not applied: mode %s engine %s eject-after %d handover %q timeouts %v", c.Mode(), c.Engine, c.EjectAfter, c.HandoverSocket, c.ConnectTimeouts)
	}
	if c.ConnectAttempts != 7 {
		t.Fatalf("the flag did not override the file: %d", c.ConnectAttempts)
	}
	if c.ConnectBudget != def.ConnectBudget || c.EjectBackoff != def.EjectBackoff || c.DrainTimeout != def.DrainTimeout {
		t.Fatalf("absent fields lost their defaults: %v %v %v", c.ConnectBudget, c.EjectBackoff, c.DrainTimeout)
	}
	if len(c.ConfigWarnings) != 0 {
		t.Fatalf("warnings: %v", c.ConfigWarnings)
	}

	alone := writeConfig(t, "apiVersion: config.sluice-proxy.io/v1alpha1\nkind: SluiceConfiguration\ndrainTimeout: 5s\n")
	c, _, err = Parse([]string{"--config", alone})
	if err != nil || c.DrainTimeout != 5*time.Second || !reflect.DeepEqual(c.KubeProxy, def.KubeProxy) {
		t.Fatalf("SluiceConfiguration alone: %v drain %v", err, c.DrainTimeout)
	}
}

// What is wrong in a --config file is an error naming the file, the line
// its document starts on, and the field; sluice's own document is decoded
// strictly (it has no older releases' fields to tolerate).
func TestConfigFileErrorsNameTheDocumentAndField(t *testing.T) {
	for name, tc := range map[string]struct {
		text string
		want []string
	}{
		"unknown field": {kubeProxyDoc + "---\napiVersion: config.sluice-proxy.io/v1alpha1\nkind: SluiceConfiguration\nconect:\n  attempts: 2\n",
			[]string{":5 (document 2)", `unknown field "conect"`}},
		"nested unknown field": {kubeProxyDoc + "---\napiVersion: config.sluice-proxy.io/v1alpha1\nkind: SluiceConfiguration\nejection:\n  afterr: 2\n",
			[]string{":5 (document 2)", `unknown field "ejection.afterr"`}},
		"wrong type": {kubeProxyDoc + "---\napiVersion: config.sluice-proxy.io/v1alpha1\nkind: SluiceConfiguration\neventLoops: many\n",
			[]string{":5 (document 2)", "eventLoops"}},
		"invalid value": {"apiVersion: config.sluice-proxy.io/v1alpha1\nkind: SluiceConfiguration\nejection:\n  after: -1\n",
			[]string{"--eject-after (SluiceConfiguration field ejection.after)", "-1"}},
		"two of a kind": {kubeProxyDoc + "---\n" + kubeProxyDoc, []string{":5 (document 2)", "a second KubeProxyConfiguration (the first is document 1)"}},
		"other kind":    {kubeProxyDoc + "---\napiVersion: v1\nkind: ConfigMap\n", []string{":5 (document 2)", `kind "ConfigMap"`}},
		"empty":         {"# nothing\n---\n", []string{"empty"}},
	} {
		t.Run(name, func(t *testing.T) {
			file := writeConfig(t, tc.text)
			_, _, err := Parse([]string{"--config", file})
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), file) && name != "invalid value" {
				t.Fatalf("%v: does not name %s", err, file)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%v: want %q in it", err, w)
				}
			}
		})
	}
}

// kube-proxy reads only a --config file's first document: a file that puts
// the SluiceConfiguration first still works here, with a warning that
// kube-proxy cannot read it.
func TestSluiceConfigurationFirstWarns(t *testing.T) {
	file := writeConfig(t, "apiVersion: config.sluice-proxy.io/v1alpha1\nkind: SluiceConfiguration\nengine: goroutine\n---\n"+kubeProxyDoc)
	c, _, err := Parse([]string{"--config", file})
	if err != nil {
		t.Fatal(err)
	}
	if c.Engine != "goroutine" || c.Mode() != ModeIPTables {
		t.Fatalf("engine %s mode %s", c.Engine, c.Mode())
	}
	if len(c.ConfigWarnings) != 1 || !strings.Contains(c.ConfigWarnings[0], "put the KubeProxyConfiguration first") {
		t.Fatalf("warnings %v", c.ConfigWarnings)
	}
}

// The KubeProxyConfiguration's logging section sets the log format and
// verbosity, as it does for kube-proxy; flags override it.
func TestKubeProxyLoggingSectionApplies(t *testing.T) {
	file := writeConfig(t, kubeProxyDoc+"logging:\n  format: json\n  verbosity: 4\n")
	c, _, err := Parse([]string{"--config", file})
	if err != nil || c.LogFormat != "json" || c.Verbosity != 4 {
		t.Fatalf("%v: format %s verbosity %d", err, c.LogFormat, c.Verbosity)
	}
	c, _, err = Parse([]string{"--config", file, "--logging-format=text"})
	if err != nil || c.LogFormat != "text" || c.Verbosity != 4 {
		t.Fatalf("%v: format %s verbosity %d", err, c.LogFormat, c.Verbosity)
	}
	bad := writeConfig(t, kubeProxyDoc+"logging:\n  format: xml\n")
	if _, _, err := Parse([]string{"--config", bad}); err == nil || !strings.Contains(err.Error(), "xml") {
		t.Fatalf("format xml: %v", err)
	}
}

// The sync periods a mode runs with are kube-proxy v1.34's: the mode's
// own section of the file (the others are ignored); without a file,
// --iptables-(min-)sync-period in every mode but IPVS (nftables included),
// --ipvs-* in IPVS mode, both defaulting to 30s and 1s.
func TestSyncPeriodsFollowTheMode(t *testing.T) {
	section := "nftables:\n  syncPeriod: 40s\n  minSyncPeriod: 3s\niptables:\n  minSyncPeriod: 7s\nipvs:\n  minSyncPeriod: 9s\n"
	file := func(mode string) string {
		return writeConfig(t, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: "+mode+"\n"+section)
	}
	nft := file("nftables")
	for _, tc := range []struct {
		args          []string
		sync, minSync time.Duration
	}{
		{[]string{"--config", nft}, 40 * time.Second, 3 * time.Second},
		{[]string{"--config", nft, "--iptables-min-sync-period=5s"}, 40 * time.Second, 3 * time.Second},
		{[]string{"--config", file("iptables")}, 30 * time.Second, 7 * time.Second},
		{[]string{"--config", file("ipvs")}, 30 * time.Second, 9 * time.Second},
		{[]string{"--config", file("userspace")}, 30 * time.Second, 7 * time.Second},
		{[]string{"--proxy-mode=nftables", "--iptables-min-sync-period=5s"}, 30 * time.Second, 5 * time.Second},
		{[]string{"--proxy-mode=ipvs", "--iptables-min-sync-period=5s"}, 30 * time.Second, time.Second},
		{[]string{"--proxy-mode=ipvs", "--ipvs-sync-period=20s"}, 20 * time.Second, time.Second},
		{[]string{"--proxy-mode=iptables", "--ipvs-sync-period=20s"}, 30 * time.Second, time.Second},
	} {
		c, _, err := Parse(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if s, m := c.SyncPeriods(); s != tc.sync || m != tc.minSync {
			t.Fatalf("%v: sync %s min %s, want %s %s", tc.args, s, m, tc.sync, tc.minSync)
		}
	}
}
