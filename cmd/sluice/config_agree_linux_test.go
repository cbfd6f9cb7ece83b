package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// agreeCase is one command line, with or without a --config file, that
// upstream kube-proxy and sluice are given alike.
type agreeCase struct {
	name string
	file string // the KubeProxyConfiguration's fields; "" for no --config
	args []string
	// differs, when set, is why sluice's answer is meant to differ from
	// kube-proxy's (README, "Flags"). The test checks that it still does,
	// so that a change on either side brings the case back to be looked at.
	differs string
	// started: kube-proxy's --write-config-to skips what is checked here
	// (the deprecated port flags), so kube-proxy is started for real
	// instead, in a network namespace of its own and with no API server,
	// and takes the command line when it gets as far as looking for one.
	started bool
}

const (
	differsScheduler = "kube-proxy takes any scheduler name and fails at start-up when the kernel refuses a virtual server with it (CanUseIPVSProxier); sluice refuses it up front"
	differsPortZero  = "sluice takes port 0 (an ephemeral port, for tests and side-by-side runs); kube-proxy refuses it"
	differsEmpty     = "an empty bind address turns the server off in sluice, as kube-proxy's help says; kube-proxy v1.34.2's flag parser drops an empty value and keeps the default"
	differsMode      = "an empty mode is userspace in sluice, iptables in kube-proxy"
)

// Command lines and config files kube-proxy v1.34.2 takes, sluice takes,
// with the same effective configuration; those it refuses, sluice refuses.
// Each case is run through upstream's binary (--write-config-to, in a
// network namespace of its own) and through sluice's parser: whether each
// takes it must agree, and when both do, the configuration kube-proxy
// wrote, read back by sluice, must be the one sluice resolved (compared
// as /configz serves it, kube-proxy's internal shape). The cases are the
// edges of kube-proxy's validation (pkg/proxy/apis/config/validation) and
// of its flag handling: checks that apply in one mode only, the sloppy IP
// parser, dual-stack CIDR pairs, "primary", the flags a --config file
// replaces. Against the sluice of 67b2f50 (before this work), 42 of the 98 fail.
func TestConfigAcceptanceAgreesWithKubeProxy(t *testing.T) {
	kubeProxy, err := kubetest.KubeProxyBinary()
	kubetest.Require(t, err)
	ipt := func(args ...string) []string { return append([]string{"--proxy-mode=iptables"}, args...) }
	cases := []agreeCase{
		{name: "iptables", args: ipt()},
		{name: "ipvs", args: []string{"--proxy-mode=ipvs"}},
		{name: "nftables", args: []string{"--proxy-mode=nftables"}},
		{name: "negative qps", args: ipt("--kube-api-qps=-1")},
		{name: "negative burst", args: ipt("--kube-api-burst=-1")},
		{name: "iptables sync 0", args: ipt("--iptables-sync-period=0")},
		{name: "iptables sync 0 in ipvs mode", args: []string{"--proxy-mode=ipvs", "--iptables-sync-period=0"}},
		{name: "iptables sync 0 in nftables mode", args: []string{"--proxy-mode=nftables", "--iptables-sync-period=0"}},
		{name: "ipvs sync 0 in iptables mode", args: ipt("--ipvs-sync-period=0")},
		{name: "ipvs sync 0", args: []string{"--proxy-mode=ipvs", "--ipvs-sync-period=0"}},
		{name: "min above sync", args: ipt("--iptables-min-sync-period=1m")},
		{name: "iptables min above sync in ipvs mode", args: []string{"--proxy-mode=ipvs", "--iptables-min-sync-period=1m"}},
		{name: "ipvs min above sync", args: []string{"--proxy-mode=ipvs", "--ipvs-min-sync-period=1m"}},
		{name: "ipvs min above sync in iptables mode", args: ipt("--ipvs-min-sync-period=1m")},
		{name: "negative min", args: ipt("--iptables-min-sync-period=-1s")},
		{name: "negative ipvs timeout in iptables mode", args: ipt("--ipvs-tcp-timeout=-1s")},
		{name: "negative ipvs timeout", args: []string{"--proxy-mode=ipvs", "--ipvs-tcp-timeout=-1s"}},
		{name: "bad exclude cidr in iptables mode", args: ipt("--ipvs-exclude-cidrs=bogus")},
		{name: "bad exclude cidr", args: []string{"--proxy-mode=ipvs", "--ipvs-exclude-cidrs=bogus"}},
		{name: "bad scheduler in iptables mode", args: ipt("--ipvs-scheduler=bogus")},
		{name: "bad scheduler", args: []string{"--proxy-mode=ipvs", "--ipvs-scheduler=bogus"}, differs: differsScheduler},
		{name: "healthz port 0", args: ipt("--healthz-bind-address=0.0.0.0:0"), differs: differsPortZero},
		{name: "metrics port 0", args: ipt("--metrics-bind-address=127.0.0.1:0"), differs: differsPortZero},
		{name: "metrics empty", args: ipt("--metrics-bind-address="), differs: differsEmpty},
		{name: "healthz empty", args: ipt("--healthz-bind-address="), differs: differsEmpty},
		{name: "metrics ip alone", args: ipt("--metrics-bind-address=127.0.0.2"), started: true},
		{name: "deprecated healthz port 0", args: ipt("--healthz-port=0"), started: true},
		{name: "deprecated metrics port 0", args: ipt("--metrics-port=0"), started: true, differs: "--metrics-port=0 turns the metrics server off in sluice, as its help says; kube-proxy then refuses the empty address"},
		{name: "deprecated port", args: ipt("--healthz-bind-address=127.0.0.1", "--healthz-port=12345"), started: true},
		{name: "bind sloppy", args: ipt("--bind-address=010.0.0.1")},
		{name: "bind zone", args: ipt("--bind-address=fe80::1%eth0")},
		{name: "bind mapped", args: ipt("--bind-address=::ffff:1.2.3.4")},
		{name: "bind v6", args: ipt("--bind-address=fd00::1")},
		{name: "primary and cidr", args: ipt("--nodeport-addresses=primary,10.0.0.0/8")},
		{name: "cidr and primary", args: ipt("--nodeport-addresses=10.0.0.0/8,primary")},
		{name: "nodeport cidr with host bits", args: ipt("--nodeport-addresses=10.0.0.1/8")},
		{name: "nodeport cidr sloppy", args: ipt("--nodeport-addresses=010.0.0.0/8")},
		{name: "nftables nodeports set", args: []string{"--proxy-mode=nftables", "--nodeport-addresses=10.0.0.0/8"}},
		{name: "cluster cidrs one family", args: ipt("--cluster-cidr=10.0.0.0/8,10.1.0.0/16")},
		{name: "cluster cidrs dual-stack", args: ipt("--cluster-cidr=10.0.0.0/8,fd00::/48")},
		{name: "three cluster cidrs", args: ipt("--cluster-cidr=10.0.0.0/8,fd00::/48,10.2.0.0/16")},
		{name: "bad cluster cidr in NodeCIDR mode", args: ipt("--cluster-cidr=bogus", "--detect-local-mode=NodeCIDR")},
		{name: "bad cluster cidr", args: ipt("--cluster-cidr=bogus")},
		{name: "cluster cidrs with a space", args: ipt("--cluster-cidr=10.0.0.0/8, fd00::/48")},
		{name: "empty cluster cidr", args: ipt("--cluster-cidr=")},
		{name: "bad detect-local mode", args: ipt("--detect-local-mode=Bogus")},
		{name: "bridge mode without bridge", args: ipt("--detect-local-mode=BridgeInterface")},
		{name: "prefix mode without prefix", args: ipt("--detect-local-mode=InterfaceNamePrefix")},
		{name: "prefix mode", args: ipt("--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth")},
		{name: "unknown gate", args: ipt("--feature-gates=NoSuchGate=true")},
		{name: "locked gate against its lock", args: ipt("--feature-gates=APIServerTracing=false")},
		{name: "locked gate at its lock", args: ipt("--feature-gates=APIServerTracing=true")},
		{name: "unlocked GA gate flipped", args: ipt("--feature-gates=DisableAllocatorDualWrite=false")},
		{name: "known gate", args: ipt("--feature-gates=APIServerIdentity=false")},
		{name: "oom score below range", args: ipt("--oom-score-adj=-1001")},
		{name: "masquerade bit 32", args: ipt("--iptables-masquerade-bit=32")},
		{name: "masquerade bit 32 in nftables mode", args: []string{"--proxy-mode=nftables", "--iptables-masquerade-bit=32"}},
		{name: "masquerade bit in nftables mode", args: []string{"--proxy-mode=nftables", "--iptables-masquerade-bit=5", "--masquerade-all"}},
		{name: "negative conntrack max", args: ipt("--conntrack-max-per-core=-1")},
		{name: "negative conntrack min", args: ipt("--conntrack-min=-1")},
		{name: "negative established timeout", args: ipt("--conntrack-tcp-timeout-established=-1s")},
		{name: "negative close-wait timeout", args: ipt("--conntrack-tcp-timeout-close-wait=-1s")},
		{name: "negative udp timeout", args: ipt("--conntrack-udp-timeout=-1s")},
		{name: "config sync 0", args: ipt("--config-sync-period=0")},
		{name: "blank hostname", args: ipt("--hostname-override=  ")},
		{name: "hostname case", args: ipt("--hostname-override= Node-A ")},
		{name: "kernelspace mode", args: []string{"--proxy-mode=kernelspace"}},
		{name: "bad mode", args: []string{"--proxy-mode=bogus"}},
		{name: "bad log format", args: ipt("--logging-format=bogus")},
		{name: "vmodule with json", args: ipt("--logging-format=json", "--vmodule=x=2")},
		{name: "split stream without gate", args: ipt("--log-text-split-stream")},
		{name: "content type", args: ipt("--kube-api-content-type=application/json")},

		{name: "file", file: "mode: iptables\n"},
		{name: "file and the flags it holds", file: "mode: iptables\n", args: []string{"--proxy-mode=ipvs", "--metrics-bind-address=127.0.0.1:1234",
			"--oom-score-adj=5000", "--feature-gates=NoSuchGate=true", "--iptables-sync-period=0", "--cluster-cidr=bogus"}},
		{name: "file and the flags it does not hold", file: "mode: iptables\n", args: []string{"--v=3", "--hostname-override=Node-B", "--logging-format=json", "--log-flush-frequency=9s"}},
		{name: "file split stream and gate flag", file: "mode: iptables\nlogging:\n  options:\n    text:\n      splitStream: true\n", args: []string{"--feature-gates=LoggingAlphaOptions=true"}},
		{name: "file split stream and gate", file: "mode: iptables\nfeatureGates:\n  LoggingAlphaOptions: true\nlogging:\n  options:\n    text:\n      splitStream: true\n"},
		{name: "file unknown gate", file: "mode: iptables\nfeatureGates:\n  NoSuchGate: true\n"},
		{name: "file negative qps", file: "mode: iptables\nclientConnection:\n  qps: -1\n"},
		{name: "file negative sync", file: "mode: iptables\niptables:\n  syncPeriod: -1s\n"},
		{name: "file nftables min above sync", file: "mode: nftables\nnftables:\n  syncPeriod: 10s\n  minSyncPeriod: 20s\n"},
		{name: "file nftables sync in iptables mode", file: "mode: iptables\nnftables:\n  syncPeriod: -10s\n"},
		{name: "file ipvs without its section", file: "mode: ipvs\n"},
		{name: "file ipvs periods", file: "mode: ipvs\nipvs:\n  syncPeriod: 10s\n  minSyncPeriod: 2s\niptables:\n  minSyncPeriod: 1m\n"},
		{name: "file healthz ip alone", file: "mode: iptables\nhealthzBindAddress: 0.0.0.0\n"},
		{name: "file metrics port 0", file: "mode: iptables\nmetricsBindAddress: 1.2.3.4:0\n", differs: differsPortZero},
		{name: "file bad port range", file: "mode: iptables\nportRange: bogus\n"},
		{name: "file negative established timeout", file: "mode: iptables\nconntrack:\n  tcpEstablishedTimeout: -1s\n"},
		{name: "file nftables masquerade bit 40", file: "mode: nftables\nnftables:\n  masqueradeBit: 40\n"},
		{name: "file nftables masquerade bit 40 in iptables mode", file: "mode: iptables\nnftables:\n  masqueradeBit: 40\n"},
		{name: "file negative ipvs timeout in iptables mode", file: "mode: iptables\nipvs:\n  tcpTimeout: -1s\n"},
		{name: "file bad log format", file: "mode: iptables\nlogging:\n  format: bogus\n"},
		{name: "file cluster cidrs", file: "mode: iptables\nclusterCIDR: 10.0.0.0/8,fd00::/48\n"},
		{name: "file empty cluster cidr", file: "mode: iptables\nclusterCIDR: \"\"\n"},
		{name: "file primary and cidr", file: "mode: iptables\nnodePortAddresses: [primary, 10.0.0.0/8]\n"},
		{name: "file hostname case", file: "mode: iptables\nhostnameOverride: Node-C\n"},
		{name: "file empty mode", file: "bindAddress: 1.2.3.4\n", differs: differsMode},
		{name: "file nftables empty nodeports", file: "mode: nftables\nnodePortAddresses: []\n"},
	}
	dir := t.TempDir()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := tc.args
			if tc.file != "" {
				f := filepath.Join(dir, "in-"+strconv.Itoa(i)+".yaml")
				os.WriteFile(f, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+tc.file), 0o644)
				args = append([]string{"--config", f}, args...)
			}
			out := filepath.Join(dir, "out-"+strconv.Itoa(i)+".yaml")
			theirsOK, why := kubeProxyTakes(t, kubeProxy, args, out, tc.started)
			ours, _, ourErr := config.Parse(args)
			var diff string
			switch {
			case theirsOK != (ourErr == nil):
				diff = "kube-proxy takes it: " + yesNo(theirsOK) + " (" + why + "); sluice takes it: " + yesNo(ourErr == nil) + " (" + errText(ourErr) + ")"
			case theirsOK && !tc.started:
				theirs, _, err := config.Parse([]string{"--config", out})
				if err != nil {
					t.Fatalf("the configuration kube-proxy wrote does not load into sluice: %v", err)
				}
				a, _ := json.MarshalIndent(ours.Configz()[config.ConfigzGroup], "", " ")
				b, _ := json.MarshalIndent(theirs.Configz()[config.ConfigzGroup], "", " ")
				if !bytes.Equal(a, b) {
					diff = "the effective configurations differ:\n" + lineDiff(string(b), string(a))
				}
			}
			switch {
			case tc.differs == "" && diff != "":
				t.Errorf("%v: %s", args, diff)
			case tc.differs != "" && diff == "":
				t.Errorf("%v: sluice now answers as kube-proxy, which the case says it does not (%s): update the case and the README", args, tc.differs)
			}
		})
	}
}

// kubeProxyTakes runs upstream kube-proxy on args, in a network namespace
// of its own, and says whether it takes them, and why not. Without
// started, --write-config-to makes it parse, validate and write out, and
// exit. With it, kube-proxy starts for real, and has taken the command
// line when it goes on to look for its API server (there is none).
func kubeProxyTakes(t *testing.T, kubeProxy string, args []string, out string, started bool) (bool, string) {
	t.Helper()
	if !started {
		b, err := exec.Command("unshare", append([]string{"--net", kubeProxy}, append(args, "--write-config-to", out)...)...).CombinedOutput()
		if err != nil {
			return false, lastLine(string(b))
		}
		return true, "wrote " + out
	}
	cmd := exec.Command("unshare", append([]string{"--net", kubeProxy}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no KUBERNETES_SERVICE_HOST: no API server to find
	b, err := cmd.CombinedOutput()
	text := string(b)
	switch {
	case strings.Contains(text, "unable to load in-cluster configuration"):
		return true, "went on to look for its API server"
	case err != nil:
		return false, lastLine(text)
	}
	t.Fatalf("kube-proxy ended without error and without looking for an API server:\n%s", text)
	return false, ""
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func errText(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// lineDiff lists the lines of want (kube-proxy's) and got (sluice's) that
// differ, position by position.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("kube-proxy: " + wl + "\nsluice:     " + gl + "\n")
		}
	}
	return b.String()
}
