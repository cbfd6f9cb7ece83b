//go:build linux && vmguest

package guest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
)

// The guest half of the IPVS parity test (cmd/sluice's
// TestIPVSParityWithKubeProxy, which boots an image holding this spec):
// upstream kube-proxy, then sluice, each in IPVS mode with the same flags,
// on this node, against the host's kube-apiserver (reached through the
// boot's Forward), then each started over the other's state. Each one's
// kernel state once settled, and after the clean-ups, is printed as
// "PARITY <who> <part>| <line>" lines for the host to compare. The node is
// this VM's own namespace: nothing else runs in it meanwhile.

// paritySpecPath is where the host puts the spec; without it (the VM
// suite's image) the test has nothing to do.
const paritySpecPath = "/parity-spec.json"

type paritySpec struct {
	// KubeProxy is upstream kube-proxy's binary in the image.
	KubeProxy string
	// Flags are given to both, after --proxy-mode=ipvs.
	Flags []string
	// Want are strings the IPVS dump holds once a proxy has synced
	// (the Services' addresses).
	Want []string
	// Metrics is the host:port of the metrics server the flags give.
	Metrics string
}

// paritySysctls are the sysctls either proxy may set in IPVS mode.
var paritySysctls = []string{"net/ipv4/vs/conntrack", "net/ipv4/vs/expire_nodest_conn", "net/ipv4/vs/expire_quiescent_template",
	"net/ipv4/vs/conn_reuse_mode", "net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet", "net/ipv4/conf/all/arp_ignore",
	"net/ipv4/conf/all/arp_announce", "net/bridge/bridge-nf-call-iptables"}

func TestIPVSParityDumps(t *testing.T) {
	raw, err := os.ReadFile(paritySpecPath)
	if os.IsNotExist(err) {
		t.Skip("no " + paritySpecPath + ": not the parity test's image")
	}
	must(t, err)
	var spec paritySpec
	must(t, json.Unmarshal(raw, &spec))

	// eth0 reaches the API server (the Forward); parity0 is the node's
	// uplink, with the node's InternalIP, as on the host's parity bed.
	// The NIC's driver probes it as its module loads.
	if _, err := netlink.LinkByName("eth0"); err != nil {
		t.Fatalf("no eth0 (the boot's Forward): %v", err)
	}
	// No IPv6 on eth0: an address from qemu's router advertisement would
	// come at a time of its own, between one proxy's run and the other's.
	must(t, os.WriteFile("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", []byte("1"), 0o644))
	for _, args := range [][]string{
		{"link", "set", "eth0", "up"}, {"addr", "add", "10.0.2.15/24", "dev", "eth0"},
		{"link", "add", "parity0", "type", "dummy"}, {"addr", "add", "192.168.10.1/24", "dev", "parity0"}, {"link", "set", "parity0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// kube-proxy runs iptables by these names; here they are legacy's.
	bin := t.TempDir()
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		must(t, os.Symlink("/usr/sbin/xtables-legacy-multi", filepath.Join(bin, n)))
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))

	kubeProxy, sluice := spec.KubeProxy, os.Getenv("SLUICE_BIN")
	// Each runs on a clean node, then the binary is swapped both ways:
	// each starts over what the other's run left (stopped, not cleaned
	// up), as a DaemonSet's image swap does.
	run(t, spec, "kube-proxy", kubeProxy, "kube-proxy")
	cleanup(t, "kube-proxy", kubeProxy, "kube-proxy-cleanup")
	run(t, spec, "sluice", sluice, "sluice")
	cleanup(t, "sluice", sluice, "sluice-cleanup")
	run(t, spec, "kube-proxy", kubeProxy, "")
	run(t, spec, "sluice", sluice, "sluice-over-kube-proxy")
	run(t, spec, "kube-proxy", kubeProxy, "kube-proxy-over-sluice")
	cleanup(t, "kube-proxy", kubeProxy, "")
	cleanup(t, "sluice", sluice, "both-cleanups")
}

// run starts name's binary in IPVS mode with the spec's flags, waits for
// its state to settle, prints it as who (unless who is ""), and stops it
// with SIGINT, which leaves its state in place.
func run(t *testing.T, spec paritySpec, name, bin, who string) {
	t.Helper()
	if t.Failed() {
		return
	}
	args := append([]string{"--proxy-mode=ipvs"}, spec.Flags...)
	if name == "sluice" {
		args = append(args, "--mode-fallback=false")
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, append(args, "--v=2")...)
	cmd.Stdout, cmd.Stderr = &log, &log
	must(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	settled, why := waitSettled(spec.Want, spec.Metrics, done)
	if settled == nil {
		cmd.Process.Kill()
		<-done
		t.Fatalf("%s: IPVS state not settled (%s); its log:\n%s", name, why, tail(log.String(), 60))
	}
	if who != "" {
		printParity(who, settled)
		// Its kubeproxy_* series, apart: their values move.
		var series []string
		for _, l := range strings.Split(metricsPage(spec.Metrics), "\n") {
			if strings.HasPrefix(l, "kubeproxy_") {
				series = append(series, "metrics| "+l)
			}
		}
		printParity(who+"-metrics", series)
	}
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(45 * time.Second):
		cmd.Process.Signal(syscall.SIGQUIT)
		<-done
		t.Fatalf("%s did not exit within 45 s of SIGINT; its log:\n%s", name, tail(log.String(), 60))
	}
}

// cleanup runs name's --cleanup in IPVS mode and prints what is left as
// who (unless who is ""). kube-proxy v1.34.2's exits 1 here after an IPVS
// run (its ip6tables-restore of iptables mode's clean-up fails, after its
// IPVS clean-up has run): what it leaves is compared all the same.
// sluice's must succeed.
func cleanup(t *testing.T, name, bin, who string) {
	t.Helper()
	if t.Failed() {
		return
	}
	out, err := exec.Command(bin, "--cleanup", "--proxy-mode=ipvs").CombinedOutput()
	if err != nil && name == "sluice" {
		t.Fatalf("%s --cleanup: %v\n%s", name, err, out)
	} else if err != nil {
		t.Logf("%s --cleanup: %v\n%s", name, err, tail(string(out), 20))
	}
	if who != "" {
		printParity(who, kernelState())
	}
}

// waitSettled polls the kernel state until the proxy says it has synced
// (metrics) and the IPVS part holds every wanted string, and the whole
// has not changed for a second; nil, with why, when the proxy exits or
// three minutes pass (the guest is emulated). Over another's state the
// wanted strings are there from the start: only the proxy's own sync
// counts.
func waitSettled(want []string, metrics string, done <-chan error) ([]string, string) {
	deadline := time.Now().Add(3 * time.Minute)
	var last []string
	var since time.Time
	why := "nothing read yet"
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return nil, fmt.Sprintf("it exited: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if !synced(metrics) {
			why = "no sync yet (" + metrics + ")"
			continue
		}
		state := kernelState()
		all := strings.Join(state, "\n")
		missing := ""
		for _, w := range want {
			if !strings.Contains(all, w) {
				missing = w
				break
			}
		}
		if missing != "" {
			why = "no " + missing + " in IPVS"
			continue
		}
		if !slices.Equal(state, last) {
			last, since, why = state, time.Now(), "changing"
			continue
		}
		if time.Since(since) >= time.Second {
			return last, ""
		}
	}
	return nil, why
}

// synced reports whether the proxy whose metrics server is at addr has
// applied its rules: kubeproxy_sync_proxy_rules_last_timestamp_seconds
// is exported, and not zero, in each family it has.
func synced(addr string) bool {
	n := 0
	for _, l := range strings.Split(metricsPage(addr), "\n") {
		if strings.HasPrefix(l, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") {
			f := strings.Fields(l)
			if f[len(f)-1] == "0" {
				return false
			}
			n++
		}
	}
	return n > 0
}

// metricsPage is the /metrics page at addr ("" when it does not answer).
func metricsPage(addr string) string {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	return string(page)
}

// kernelState is what the proxies program, one "<part>| <line>" each:
// IPVS services and destinations, the ipsets, iptables-save of both
// families, kube-ipvs0's addresses and the sysctls.
func kernelState() []string {
	var out []string
	add := func(part, text string) {
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			if l != "" {
				out = append(out, part+"| "+l)
			}
		}
	}
	if h, err := ipvs.New(""); err != nil {
		add("error", "ipvs: "+err.Error())
	} else {
		svcs, err := h.GetServices()
		if err != nil {
			add("error", "ipvs services: "+err.Error())
		}
		for _, s := range svcs {
			key := fmt.Sprintf("%s %s fwmark=%d", ipvsProto(s.Protocol), joinHostPort(s.Address, s.Port), s.FWMark)
			add("ipvs", fmt.Sprintf("%s sched=%s flags=%#x timeout=%d netmask=%#x af=%d", key, s.SchedName, s.Flags, s.Timeout, s.Netmask, s.AddressFamily))
			dsts, err := h.GetDestinations(s)
			if err != nil {
				add("error", "ipvs destinations of "+key+": "+err.Error())
			}
			for _, d := range dsts {
				add("ipvs", fmt.Sprintf("%s -> %s fwd=%#x weight=%d upper=%d lower=%d", key, joinHostPort(d.Address, d.Port), d.ConnectionFlags, d.Weight, d.UpperThreshold, d.LowerThreshold))
			}
		}
		h.Close()
	}
	for _, c := range []struct{ part, name string }{{"ipset", "ipset"}, {"iptables", "iptables-save"}, {"ip6tables", "ip6tables-save"}} {
		args := []string{"save"}
		if c.part != "ipset" {
			args = nil
		}
		o, err := exec.Command(c.name, args...).CombinedOutput()
		if err != nil {
			add("error", fmt.Sprintf("%s: %v: %s", c.name, err, o))
		}
		// Without the dated comments and the packet counters, which the
		// API server's traffic moves.
		add(c.part, saveNoise.ReplaceAllString(string(o), ""))
	}
	if l, err := netlink.LinkByName("kube-ipvs0"); err == nil {
		add("link", fmt.Sprintf("kube-ipvs0 %s up=%v", l.Type(), l.Attrs().Flags&1 != 0))
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range addrs {
			add("addr", "kube-ipvs0 "+a.IPNet.String())
		}
	}
	for _, s := range paritySysctls {
		if v, err := os.ReadFile("/proc/sys/" + s); err == nil {
			add("sysctl", s+" = "+strings.TrimSpace(string(v)))
		}
	}
	return out
}

// saveNoise is what iptables-save writes that changes by itself: its
// dated comment lines and the chains' packet and byte counters.
var saveNoise = regexp.MustCompile(`(?m)^#.*$| \[\d+:\d+\]`)

func ipvsProto(p uint16) string {
	switch p {
	case syscall.IPPROTO_TCP:
		return "TCP"
	case syscall.IPPROTO_UDP:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

func joinHostPort(ip net.IP, port uint16) string {
	s := ip.String()
	if strings.Contains(s, ":") {
		s = "[" + s + "]"
	}
	return fmt.Sprintf("%s:%d", s, port)
}

// printParity writes who's state to the console for the host.
func printParity(who string, state []string) {
	var b strings.Builder
	for _, l := range state {
		fmt.Fprintf(&b, "PARITY %s %s\n", who, l)
	}
	fmt.Fprintf(&b, "PARITY %s end| %d lines\n", who, len(state))
	os.Stdout.WriteString(b.String())
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
