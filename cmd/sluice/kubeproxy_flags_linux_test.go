package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// helpFlag is one line of a pflag --help: "  -v, --v Level   usage" or
// "      --cleanup   usage" (a bool has no type).
var helpFlag = regexp.MustCompile(`^\s+(?:-[a-z], )?--([a-z0-9-]+)(?: ([^ ]+))?\s{2,}`)

// kubeProxyFlag is one flag of upstream kube-proxy's help: its name and
// type ("" for a bool).
type kubeProxyFlag struct{ name, typ string }

// kubeProxyFlags returns upstream kube-proxy's binary and the flags its
// help lists, failing the test when the help no longer parses.
func kubeProxyFlags(t *testing.T) (string, []kubeProxyFlag) {
	t.Helper()
	kubeProxy, err := kubetest.KubeProxyBinary()
	kubetest.Require(t, err)
	help, err := exec.Command(kubeProxy, "--help").Output()
	if err != nil {
		t.Fatalf("kube-proxy --help: %v", err)
	}
	var flags []kubeProxyFlag
	for _, line := range strings.Split(string(help), "\n") {
		if m := helpFlag.FindStringSubmatch(line); m != nil {
			flags = append(flags, kubeProxyFlag{m[1], m[2]})
		}
	}
	if len(flags) < 50 {
		t.Fatalf("found %d flags in kube-proxy's help; the format must have changed:\n%s", len(flags), help)
	}
	return kubeProxy, flags
}

// arg is the flag given a sample value: by its name, else by its type;
// ok is false when neither has one.
func (f kubeProxyFlag) arg(byName, byType map[string]string) (arg string, ok bool) {
	if f.typ == "" {
		return "--" + f.name, true
	}
	v, ok := byName[f.name]
	if !ok {
		v, ok = byType[f.typ]
	}
	return "--" + f.name + "=" + v, ok
}

// Every flag upstream kube-proxy v1.34.2 lists in its help is one sluice
// takes: a kube-proxy command line keeps working when the binary is
// swapped. Each flag is given a value of its type (its own default where
// that is all it can take) that kube-proxy itself takes, checked by
// running kube-proxy with it (--write-config-to, so it only parses and
// writes the file; in a network namespace of its own, so nothing it
// might touch is the machine's); then sluice must parse it without error.
// A type the test has no value for fails it, so a new upstream release's
// flags are looked at, not passed over.
func TestEveryKubeProxyFlagIsTaken(t *testing.T) {
	kubeProxy, flags := kubeProxyFlags(t)
	dir := t.TempDir()
	kpConfig := filepath.Join(dir, "kp.yaml")
	os.WriteFile(kpConfig, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n"), 0o644)
	byType := map[string]string{
		"ip": "127.0.0.1", "ipport": "127.0.0.1:10256", "duration": "10s", "int32": "1", "float32": "5",
		"strings": "10.0.0.0/8", "LocalMode": "ClusterCIDR", "mapStringBool": "LoggingAlphaOptions=true",
		"ProxyMode": "iptables", "Level": "2", "quantity": "64Ki", "pattern=N,...": "proxier=2", "version[=true]": "true", "string": "x",
	}
	byName := map[string]string{
		"config": kpConfig, "write-config-to": filepath.Join(dir, "out.yaml"), "cluster-cidr": "10.244.0.0/16",
		"logging-format": "text", "ipvs-scheduler": "rr", "kube-api-content-type": "application/vnd.kubernetes.protobuf",
		"master": "https://127.0.0.1:6443", "show-hidden-metrics-for-version": "", // a release from the module proxy knows no version to name
	}
	// Flags that act rather than configure: only sluice parses them.
	acts := map[string]bool{"cleanup": true, "init-only": true, "version": true, "help": true}
	for _, f := range flags {
		name := f.name
		arg, ok := f.arg(byName, byType)
		if !ok {
			t.Errorf("--%s: no sample value for kube-proxy's type %q: add one", name, f.typ)
			continue
		}
		args := []string{arg, "--feature-gates=LoggingAlphaOptions=true"}
		if !acts[name] {
			out, err := exec.Command("unshare", append([]string{"--net", kubeProxy}, append(args, "--write-config-to", filepath.Join(dir, "kp-out.yaml"))...)...).CombinedOutput()
			if err != nil {
				t.Errorf("kube-proxy refuses the test's own %s: %v\n%s", arg, err, out)
				continue
			}
		}
		_, _, err := config.Parse(args)
		if name == "help" {
			if !config.IsHelp(err) {
				t.Errorf("--help: %v", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("kube-proxy takes %s, sluice does not: %v", arg, err)
		}
	}
}

// With --config, kube-proxy v1.34.2 ignores the flags whose settings the
// file holds, and sluice ignores the same ones (config.FileHoldsFlag).
// Each flag of upstream's help is given, with a value unlike the file's,
// beside a --config file, and the configuration kube-proxy writes out says
// whether the flag took effect. A flag the written configuration cannot
// show (--master, the deprecated ports, the ones that act) is listed with
// what kube-proxy's source does with it.
func TestFlagsAKubeProxyConfigFileHolds(t *testing.T) {
	kubeProxy, flags := kubeProxyFlags(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "kp.yaml")
	// The gate lets the alpha logging flags be given.
	os.WriteFile(file, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nfeatureGates:\n  LoggingAlphaOptions: true\n"), 0o644)
	writeOut := func(args ...string) ([]byte, error) {
		out := filepath.Join(t.TempDir(), "out.yaml")
		if b, err := exec.Command("unshare", append([]string{"--net", kubeProxy, "--config", file, "--write-config-to", out}, args...)...).CombinedOutput(); err != nil {
			return b, err
		}
		return os.ReadFile(out)
	}
	base, err := writeOut()
	if err != nil {
		t.Fatalf("kube-proxy --config: %v\n%s", err, base)
	}
	byType := map[string]string{
		"ip": "127.0.0.7", "ipport": "127.0.0.7:1234", "duration": "17s", "int32": "3", "float32": "7",
		"strings": "10.0.0.0/8", "LocalMode": "NodeCIDR", "mapStringBool": "LoggingAlphaOptions=false",
		"ProxyMode": "ipvs", "Level": "3", "quantity": "64Ki", "pattern=N,...": "proxier=2", "string": "x",
	}
	byName := map[string]string{
		"cluster-cidr": "10.244.0.0/16", "logging-format": "json", "ipvs-scheduler": "lc",
		"kube-api-content-type": "application/json", "iptables-localhost-nodeports": "false",
	}
	// What the written configuration cannot show: --master and
	// --hostname-override are kept apart from it (o.master,
	// o.hostnameOverride) and applied after the file; the deprecated ports
	// only without --config (addressFromDeprecatedFlags); the cAdvisor and
	// Windows flags before it, or not at all.
	unseen := map[string]bool{
		"master": false, "healthz-port": true, "metrics-port": true, "show-hidden-metrics-for-version": true,
		"boot-id-file": false, "machine-id-file": false, "windows-service": false,
	}
	acts := map[string]bool{"cleanup": true, "init-only": true, "version": true, "help": true, "config": true, "write-config-to": true}
	for _, f := range flags {
		name := f.name
		if acts[name] {
			if config.FileHoldsFlag(name) {
				t.Errorf("--%s acts; the file cannot hold it", name)
			}
			continue
		}
		if holds, ok := unseen[name]; ok {
			if config.FileHoldsFlag(name) != holds {
				t.Errorf("--%s: sluice says the file holds it: %v; kube-proxy's source: %v", name, config.FileHoldsFlag(name), holds)
			}
			continue
		}
		arg, ok := f.arg(byName, byType)
		if !ok {
			t.Errorf("--%s: no sample value for kube-proxy's type %q: add one", name, f.typ)
			continue
		}
		got, err := writeOut(arg)
		if err != nil {
			t.Errorf("kube-proxy --config with %s: %v\n%s", arg, err, got)
			continue
		}
		holds := bytes.Equal(got, base)
		if config.FileHoldsFlag(name) != holds {
			t.Errorf("%s beside --config: kube-proxy ignores it: %v; sluice: %v", arg, holds, config.FileHoldsFlag(name))
		}
	}
}

// gateSummary describes a gate sluice knows as kube-proxy's help does
// ("BETA default=true"); "" for one it does not know.
func gateSummary(name string) string {
	stage, def, _, known := config.KubeProxyGate(name)
	if !known {
		return ""
	}
	return fmt.Sprintf("%s default=%t", stage, def)
}

// helpGate is one feature gate of kube-proxy's --feature-gates help:
// "Name=true|false (BETA - default=true)".
var helpGate = regexp.MustCompile(`^\s+([A-Za-z0-9]+)=true\|false \(([A-Z]+) - default=(true|false)\)`)

// sluice knows kube-proxy v1.34.2's feature gates as its binary does
// (config/featuregates.go, from scripts/kube-proxy-feature-gates.sh): the
// help's alpha and beta gates with their defaults; every gate set to its
// default taken by kube-proxy (so no name is one it does not know); a
// locked gate set against its lock refused by it, an unlocked one taken.
// The parity tests check that no gate of upstream's /metrics is missing.
func TestFeatureGatesAreKubeProxys(t *testing.T) {
	kubeProxy, _ := kubeProxyFlags(t)
	help, err := exec.Command(kubeProxy, "--help").Output()
	if err != nil {
		t.Fatal(err)
	}
	inHelp := 0
	for _, line := range strings.Split(string(help), "\n") {
		m := helpGate.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		inHelp++
		if got := gateSummary(m[1]); got != m[2]+" default="+m[3] {
			t.Errorf("%s: sluice knows it as %q; kube-proxy's help: %s default=%s", m[1], got, m[2], m[3])
		}
	}
	if inHelp < 100 {
		t.Fatalf("%d gates in kube-proxy's help: the format must have changed", inHelp)
	}
	takes := func(gates []string) (bool, string) {
		out, err := exec.Command("unshare", "--net", kubeProxy, "--proxy-mode=iptables", "--feature-gates="+strings.Join(gates, ","),
			"--write-config-to", filepath.Join(t.TempDir(), "out.yaml")).CombinedOutput()
		return err == nil, string(out)
	}
	var defaults, flippable []string
	var locked []string
	for _, name := range config.KubeProxyGates() {
		stage, def, isLocked, _ := config.KubeProxyGate(name)
		defaults = append(defaults, fmt.Sprintf("%s=%t", name, def))
		flipped := fmt.Sprintf("%s=%t", name, !def)
		if isLocked {
			locked = append(locked, flipped)
		} else if stage == "GA" || stage == "DEPRECATED" {
			flippable = append(flippable, flipped)
		}
		if _, _, err := config.Parse([]string{"--proxy-mode=iptables", "--feature-gates=" + flipped}); (err == nil) == isLocked {
			t.Errorf("sluice given %s: %v (locked: %v)", flipped, err, isLocked)
		}
	}
	if ok, out := takes(defaults); !ok {
		t.Errorf("kube-proxy refuses sluice's gates at their defaults: %s", lastLine(out))
	}
	if ok, out := takes(flippable); !ok {
		t.Errorf("kube-proxy refuses the unlocked GA and deprecated gates flipped: %s", lastLine(out))
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, g := range locked {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if ok, _ := takes([]string{g}); ok {
				t.Errorf("kube-proxy takes %s, which sluice says is locked", g)
			}
		})
	}
	wg.Wait()
	if len(locked) < 10 {
		t.Fatalf("only %d locked gates", len(locked))
	}
}
