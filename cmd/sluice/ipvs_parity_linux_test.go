package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
	"github.com/sluice-proxy/sluice/vmtest"
)

// Live parity with upstream kube-proxy v1.34.2 in IPVS mode, as the
// nftables and iptables tests have it, in the VM (this host's kernel has
// no IPVS): the parity bed's API objects in this test's kube-apiserver,
// which the guest reaches through its one forwarded address; in the guest
// (vmtest/guest's TestIPVSParityDumps) kube-proxy, then sluice, program
// the node with the same flags, and each one's IPVS services and
// destinations, ipsets, iptables-save of both families, kube-ipvs0's
// addresses and sysctls, settled and again after its --cleanup, come back
// on the console. They must be equal but for knownIPVSDifferences.
//
// It boots an emulated guest for about two minutes, so `make test` runs it
// with the VM suite, alone (see the Makefile's test-race).

// knownIPVSDifferences: as knownNFTablesDifferences, for IPVS mode.
var knownIPVSDifferences = []string{
	// sluice brings kube-ipvs0 up, which gives it an IPv6 link-local
	// address; kube-proxy leaves it down. The service addresses on it are
	// local addresses either way (a dummy link does no DAD).
	"kube-proxy only: link kube-ipvs0 dummy up=false",
	"sluice only: link kube-ipvs0 dummy up=true",
}

// kubeIPVS0LinkLocal is the kernel's link-local address of kube-ipvs0,
// which comes with its being up (its last half varies).
var kubeIPVS0LinkLocal = regexp.MustCompile(`^addr kube-ipvs0 fe80::`)

func TestIPVSParityWithKubeProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM for about two minutes")
	}
	if os.Geteuid() != 0 {
		kubetest.Require(t, errors.New("the VM needs root (kernel unpacking, modules)"))
	}
	kubeProxy, err := kubetest.KubeProxyBinary()
	kubetest.Require(t, err)
	c := startCluster(t, kubetest.WithDualStack())
	e, _ := createParityObjects(t, c)

	// Settled once every Service address and the node's NodePorts are in
	// IPVS.
	want := []string{"192.168.10.1:"}
	svcs, err := e.client.CoreV1().Services("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		if s.Spec.Type == corev1.ServiceTypeExternalName || s.Spec.ClusterIP == corev1.ClusterIPNone {
			continue
		}
		for _, ip := range append(slices.Clone(s.Spec.ClusterIPs), s.Spec.ExternalIPs...) {
			want = append(want, net.JoinHostPort(ip, "")) // "ip:" or "[ip]:"
		}
	}

	// The guest's kubeconfig names the forwarded address.
	api, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	guestAPI := "10.0.2.100:" + api.Port()
	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kubeconfig := write("kubeconfig", []byte(strings.Replace(string(kc), api.Host, guestAPI, 1)))
	spec, _ := json.Marshal(map[string]any{"KubeProxy": "/kube-proxy", "Want": want, "Metrics": "127.0.0.1:10249", "Flags": []string{
		"--kubeconfig=/parity-kubeconfig", "--hostname-override=" + kubeNode,
		"--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=192.168.10.0/24",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249"}})

	root, _ := filepath.Abs("../..")
	guest := filepath.Join(work, "guest.test")
	build := exec.Command("go", "test", "-c", "-trimpath", "-tags", "vmguest", "-o", guest, "./vmtest/guest")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the guest tests: %v\n%s", err, out)
	}
	img, err := vmtest.Build(vmtest.Spec{Root: root, Work: work,
		Files: map[string]string{"sluice": sluiceBin, "guest.test": guest, "kube-proxy": kubeProxy,
			"parity-kubeconfig": kubeconfig, "parity-spec.json": write("spec.json", spec)},
		Script: "SLUICE_BIN=/sluice /guest.test -test.v -test.timeout=10m -test.run='^TestIPVSParityDumps$'"})
	kubetest.Require(t, err)
	start := time.Now()
	log, err := vmtest.BootWith(img, work, 2048, 12*time.Minute, &vmtest.Forward{Guest: guestAPI, Host: api.Host})
	t.Logf("qemu ran %s", time.Since(start).Round(time.Second))
	if f := os.Getenv("SLUICE_PARITY_CONSOLE"); f != "" { // the whole console, to read the dumps
		os.WriteFile(f, []byte(log), 0o644)
	}
	states := parityStates(log)
	if err != nil || vmtest.ExitCode(log) != 0 {
		for _, l := range strings.Split(log, "\n") {
			if !strings.HasPrefix(l, "PARITY ") {
				t.Log("guest| " + strings.TrimRight(l, "\r"))
			}
		}
		t.Fatalf("the guest half failed (%v, marker code %d)", err, vmtest.ExitCode(log))
	}
	for _, who := range []string{"kube-proxy", "sluice", "kube-proxy-cleanup", "sluice-cleanup", "sluice-over-kube-proxy", "kube-proxy-over-sluice", "both-cleanups"} {
		if len(states[who]) == 0 {
			t.Fatalf("no state of %s on the console", who)
		}
		for _, l := range states[who] {
			if strings.HasPrefix(l, "error ") {
				t.Errorf("%s: %s", who, l)
			}
		}
	}
	// Without kube-ipvs0's link-local address, which comes with its being
	// up: one while sluice has run.
	linkUp := map[string][]string{}
	for who, lines := range states {
		if strings.HasSuffix(who, "-metrics") {
			continue
		}
		linkUp[who] = slices.DeleteFunc(slices.Clone(lines), kubeIPVS0LinkLocal.MatchString)
		if up := who == "sluice" || strings.Contains(who, "over"); up != (len(linkUp[who]) == len(lines)-1) {
			t.Errorf("%s: kube-ipvs0 has %d link-local addresses", who, len(lines)-len(linkUp[who]))
		}
	}
	checkDifferences(t, states["kube-proxy"], linkUp["sluice"], knownIPVSDifferences)
	// The binary swapped: sluice over kube-proxy's rules makes what it
	// makes on a clean node, and kube-proxy over sluice's what it makes
	// there (kube-ipvs0 stays up: neither changes an existing link's
	// state the other way).
	checkDifferences(t, linkUp["sluice"], linkUp["sluice-over-kube-proxy"], nil)
	checkDifferences(t, linkUp["sluice"], linkUp["kube-proxy-over-sluice"], nil)
	// --cleanup leaves the node as kube-proxy's leaves it, but for
	// kube-proxy's IPv6 sets: v1.34.2's IPVS clean-up destroys its sets by
	// their IPv4 names only (KUBE-6-* stay), where sluice's destroys both.
	upLeft := slices.DeleteFunc(slices.Clone(states["kube-proxy-cleanup"]), func(l string) bool {
		return strings.HasPrefix(l, "ipset create KUBE-6-") || strings.HasPrefix(l, "ipset add KUBE-6-")
	})
	if len(upLeft) == len(states["kube-proxy-cleanup"]) {
		t.Error("kube-proxy's --cleanup destroyed its IPv6 sets: take the exception off")
	}
	checkDifferences(t, upLeft, states["sluice-cleanup"], nil)
	// Every kubeproxy_* metric kube-proxy exports in IPVS mode (by name and
	// label names), and the same Local-policy counts.
	metricsOf := func(who string) string {
		var page []string
		for _, l := range states[who+"-metrics"] {
			page = append(page, strings.TrimPrefix(l, "metrics "))
		}
		return strings.Join(page, "\n")
	}
	upPage, usPage := metricsOf("kube-proxy"), metricsOf("sluice")
	for _, m := range metricShapes(upPage) {
		if !slices.Contains(metricShapes(usPage), m) {
			t.Errorf("kube-proxy exports %s in IPVS mode; sluice does not", m)
		}
	}
	for _, name := range []string{"kubeproxy_sync_proxy_rules_no_local_endpoints_total",
		"kubeproxy_sync_proxy_rules_service_changes_pending", "kubeproxy_sync_proxy_rules_endpoint_changes_pending"} {
		if up, us := series(upPage, name), series(usPage, name); len(up) == 0 || !slices.Equal(up, us) {
			t.Errorf("%s: kube-proxy\n%s\nsluice\n%s", name, strings.Join(up, "\n"), strings.Join(us, "\n"))
		}
	}
	// After the swaps, kube-proxy's --cleanup and then sluice's leave
	// nothing of either.
	for _, who := range []string{"sluice-cleanup", "both-cleanups"} {
		for _, l := range states[who] {
			if strings.HasPrefix(l, "ipset ") || strings.HasPrefix(l, "ipvs ") || strings.Contains(l, "KUBE-") || strings.Contains(l, "kube-ipvs0") {
				t.Errorf("left after %s: %s", who, l)
			}
		}
	}
}

var ipsetSeed = regexp.MustCompile(` initval 0x[0-9a-f]+`)

// withoutEmptyTables drops the lines of each table that holds only its
// built-in chains, each with policy ACCEPT and no rule: such a table is as
// no table, and a legacy table appears so once anything has listed it
// (kube-proxy's --cleanup lists mangle, between the two runs).
func withoutEmptyTables(lines []string) []string {
	empty := map[string]bool{} // "family table"
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 3 {
			empty[f[0]+" "+f[1]] = true
		}
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		builtin := f[2] == "chain" && len(f) == 5 && f[4] == "ACCEPT" && strings.ToUpper(f[3]) == f[3] && !strings.Contains(f[3], "-")
		if !builtin {
			empty[f[0]+" "+f[1]] = false
		}
	}
	return slices.DeleteFunc(lines, func(l string) bool {
		f := strings.Fields(l)
		return len(f) >= 2 && empty[f[0]+" "+f[1]]
	})
}

// parityStates reads the guest's "PARITY <who> <part>| <line>" lines into
// each one's canonical lines: IPVS, ipsets, addresses and sysctls sorted
// (their order is the kernel's hashing), iptables-save as
// canonicalIPTables makes it.
func parityStates(log string) map[string][]string {
	parts := map[string]map[string][]string{}
	for _, l := range strings.Split(log, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "PARITY ")
		if !ok {
			continue
		}
		who, rest, _ := strings.Cut(rest, " ")
		part, line, ok := strings.Cut(rest, "| ")
		if !ok || part == "end" {
			continue
		}
		if parts[who] == nil {
			parts[who] = map[string][]string{}
		}
		parts[who][part] = append(parts[who][part], line)
	}
	states := map[string][]string{}
	for who, byPart := range parts {
		var lines []string
		for part, ls := range byPart {
			switch part {
			case "iptables", "ip6tables":
				lines = append(lines, withoutEmptyTables(canonicalIPTables(part, strings.Join(ls, "\n")))...)
			case "ipset":
				for _, l := range ls { // a set's hash seed is random
					lines = append(lines, part+" "+ipsetSeed.ReplaceAllString(l, ""))
				}
			default:
				for _, l := range ls {
					lines = append(lines, part+" "+l)
				}
			}
		}
		slices.Sort(lines)
		states[who] = lines
	}
	return states
}
