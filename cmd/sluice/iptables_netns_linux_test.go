package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// iptables mode for real: three network namespaces of the test's own,
// client <-veth-> node (sluice) <-veth-> backend, with no link to the root
// namespace and no route out of the machine; deleted when the test ends,
// pass or fail. The test binary doubles as backend and client (helper
// modes below), run inside the namespaces with `ip netns exec`.

const (
	helperEnv     = "SLUICE_TEST_HELPER"
	helperArgsEnv = "SLUICE_TEST_HELPER_ARGS"
)

// runHelper serves as a backend or acts as a client when the test binary
// is started as a helper; it reports whether it was one.
func runHelper() bool {
	args := strings.Split(os.Getenv(helperArgsEnv), ",")
	switch os.Getenv(helperEnv) {
	case "backend": // name,ip...: HTTP on ip:8080 and UDP echo on ip:5353
		name := args[0]
		for _, ip := range args[1:] {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, "8080"))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				host, _, _ := net.SplitHostPort(r.RemoteAddr)
				w.Header().Set("X-Peer", host) // the source the backend saw
				io.WriteString(w, name+"@"+ip)
			}))
			pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, "5353"))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			go func() {
				buf := make([]byte, 2048)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo(append([]byte(name+"@"+ip+"|"), buf[:n]...), from)
				}
			}()
		}
		fmt.Println("ready")
		select {}
	case "client": // proto,addr,count: one line per try, the answer or "error: ..."
		n, _ := strconv.Atoi(args[2])
		for i := 0; i < n; i++ {
			fmt.Println(clientTry(args[0], args[1]))
		}
		os.Exit(0)
	}
	return false
}

func clientTry(proto, addr string) string {
	if proto == "udp-burst" {
		return udpBurstTry(addr)
	}
	if proto == "udp" || strings.HasPrefix(proto, "udp@") {
		// udp@PORT sends from a fixed source port: the same conntrack entry.
		d := net.Dialer{}
		if _, port, ok := strings.Cut(proto, "@"); ok {
			n, _ := strconv.Atoi(port)
			d.LocalAddr = &net.UDPAddr{Port: n}
		}
		c, err := d.Dial("udp", addr)
		if err != nil {
			return "error: " + err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Write([]byte("ping"))
		buf := make([]byte, 2048)
		n, err := c.Read(buf)
		if err != nil {
			return "error: " + err.Error()
		}
		name, _, _ := strings.Cut(string(buf[:n]), "|")
		return name
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + addr + "/")
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if proto == "peer" { // the answer and the source the backend saw
		return string(b) + " from " + resp.Header.Get("X-Peer")
	}
	return string(b)
}

// udpBurstTry sends 11 datagrams (100 bytes each, the last 50) in one UDP
// GSO send, as a QUIC stack does, and reads the 11 echoes: the answering
// backend when every one came back whole and in order, else "error: ...".
func udpBurstTry(addr string) string {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	var msgs []string
	for i := 0; i < 11; i++ {
		m := fmt.Sprintf("burst-%02d-", i)
		size := 100
		if i == 10 {
			size = 50
		}
		msgs = append(msgs, m+strings.Repeat("x", size-len(m)))
	}
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = 100
	if _, _, err := c.(*net.UDPConn).WriteMsgUDP([]byte(strings.Join(msgs, "")), oob, nil); err != nil {
		return "error: GSO send: " + err.Error()
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 65536)
	var from string
	for i, m := range msgs {
		n, err := c.Read(buf)
		if err != nil {
			return fmt.Sprintf("error: echo %d of %d: %v", i, len(msgs), err)
		}
		name, payload, _ := strings.Cut(string(buf[:n]), "|")
		if payload != m || from != "" && name != from {
			return fmt.Sprintf("error: echo %d is %.20q... from %s, want %.20q... from %s", i, payload, name, m, from)
		}
		from = name
	}
	return from
}

type netnsBed struct {
	t                     *testing.T
	client, node, backend string
}

func (b *netnsBed) ip(args ...string) {
	b.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		b.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (b *netnsBed) in(ns string, args ...string) string {
	b.t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		b.t.Fatalf("in %s: %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newNetnsBed builds client <-> node <-> backend. The client is
// 192.168.10.2 and fd00:10::2 (node side .1 and ::1); backends are
// 10.244.0.5, 10.244.0.6, fd00:244::5 and fd00:244::6 (node side
// 10.244.0.1 and fd00:244::1).
func newNetnsBed(t *testing.T) *netnsBed {
	if os.Geteuid() != 0 {
		kubetest.Require(t, errors.New("network namespace tests need root"))
	}
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		kubetest.Require(t, errors.New("iptables is not installed: run `make test-deps`"))
	}
	suffix := make([]byte, 3)
	rand.Read(suffix)
	id := hex.EncodeToString(suffix)
	b := &netnsBed{t: t, client: "sluice-" + id + "-client", node: "sluice-" + id + "-node", backend: "sluice-" + id + "-backend"}
	for _, ns := range []string{b.client, b.node, b.backend} {
		b.ip("netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		b.ip("-n", ns, "link", "set", "lo", "up")
		// No duplicate address detection on the links made below: their
		// IPv6 addresses, link-local ones included, are usable at once.
		b.in(ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}
	b.ip("-n", b.node, "link", "add", "c0", "type", "veth", "peer", "name", "c1", "netns", b.client)
	b.ip("-n", b.node, "link", "add", "b0", "type", "veth", "peer", "name", "b1", "netns", b.backend)
	b.ip("-n", b.node, "addr", "add", "192.168.10.1/24", "dev", "c0")
	b.ip("-n", b.node, "addr", "add", "10.244.0.1/24", "dev", "b0")
	b.ip("-n", b.client, "addr", "add", "192.168.10.2/24", "dev", "c1")
	b.ip("-n", b.backend, "addr", "add", "10.244.0.5/24", "dev", "b1")
	b.ip("-n", b.backend, "addr", "add", "10.244.0.6/24", "dev", "b1")
	for _, l := range [][2]string{{b.node, "c0"}, {b.node, "b0"}, {b.client, "c1"}, {b.backend, "b1"}} {
		b.ip("-n", l[0], "link", "set", l[1], "up")
	}
	b.ip("-n", b.client, "route", "add", "default", "via", "192.168.10.1")
	b.ip("-n", b.backend, "route", "add", "default", "via", "10.244.0.1")
	// IPv6: the same shape (nodad: usable at once).
	b.ip("-n", b.node, "addr", "add", "fd00:10::1/64", "dev", "c0", "nodad")
	b.ip("-n", b.node, "addr", "add", "fd00:244::1/64", "dev", "b0", "nodad")
	b.ip("-n", b.client, "addr", "add", "fd00:10::2/64", "dev", "c1", "nodad")
	b.ip("-n", b.backend, "addr", "add", "fd00:244::5/64", "dev", "b1", "nodad")
	b.ip("-n", b.backend, "addr", "add", "fd00:244::6/64", "dev", "b1", "nodad")
	b.ip("-n", b.client, "-6", "route", "add", "default", "via", "fd00:10::1")
	b.ip("-n", b.backend, "-6", "route", "add", "default", "via", "fd00:244::1")
	b.ip("-n", b.node, "-6", "route", "add", "fd00:96::/112", "via", "fd00:244::5")
	b.in(b.node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	// Service and external ranges lead into the backend namespace, which
	// does not forward: an undecided packet dies inside the sandbox.
	b.ip("-n", b.node, "route", "add", "10.96.0.0/16", "via", "10.244.0.5")
	b.ip("-n", b.node, "route", "add", "203.0.113.0/24", "via", "10.244.0.5")
	b.in(b.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return b
}

// start runs a command in a namespace until the test ends (killed by PID).
func (b *netnsBed) start(ns string, env []string, args ...string) *proc {
	b.t.Helper()
	if len(args) > 0 && args[0] == sluiceBin && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--handover-socket") }) {
		args = append(args, "--handover-socket", filepath.Join(b.t.TempDir(), "handover.sock")) // not /run/sluice: see start
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return startCmd(b.t, cmd)
}

// startBackends runs the backend helper in the backend namespace and
// waits for its "ready" line; it is killed by PID when the test ends.
func (b *netnsBed) startBackends(name string, ips ...string) {
	b.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", b.backend, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=backend", helperArgsEnv+"="+name+","+strings.Join(ips, ","))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		b.t.Fatalf("backend helper: %q %v", line, err)
	}
}

// tries runs the client helper in the client namespace.
func (b *netnsBed) tries(proto, addr string, n int) []string {
	b.t.Helper()
	return triesIn(b, b.client, proto, addr, n)
}

// triesIn runs the client helper in the namespace ns.
func triesIn(b *netnsBed, ns, proto, addr string, n int) []string {
	b.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=client", fmt.Sprintf("%s=%s,%s,%d", helperArgsEnv, proto, addr, n))
	out, err := cmd.Output()
	if err != nil {
		b.t.Fatalf("client %s %s: %v", proto, addr, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// wantBothBackends fails unless the answers came from exactly the backends
// at a and b; context, if set, adds what to look at (the rules, the raw
// answers) to the failure.
func wantBothBackends(t *testing.T, what string, answers []string, a, b string, context func() string) {
	t.Helper()
	d := distinct(answers)
	if len(d) == 2 && d["b@"+a] > 0 && d["b@"+b] > 0 {
		return
	}
	more := ""
	if context != nil {
		more = "\n" + context()
	}
	t.Fatalf("%s: %v, want both backends%s", what, d, more)
}

func distinct(answers []string) map[string]int {
	m := map[string]int{}
	for _, a := range answers {
		if strings.HasPrefix(a, "error: ") {
			a = "error"
		}
		m[a]++
	}
	return m
}

// saveState is iptables-save and ip6tables-save without comments and
// counters, for before/after comparisons.
func (b *netnsBed) saveState(backend string) string {
	var out strings.Builder
	for _, cmd := range []string{"iptables-" + backend + "-save", "ip6tables-" + backend + "-save"} {
		for _, l := range strings.Split(b.in(b.node, cmd), "\n") {
			if strings.HasPrefix(l, "#") {
				continue
			}
			out.WriteString(regexp.MustCompile(`\[\d+:\d+\]`).ReplaceAllString(l, "[0:0]") + "\n")
		}
	}
	return out.String()
}

const iptablesManifest = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  externalIPs: [203.0.113.10]
  ports:
  - {name: http, port: 80, nodePort: 30080, protocol: TCP}
  - {name: dns, port: 53, nodePort: 30053, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: e2e, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 5353, protocol: UDP}
endpoints:
- addresses: [10.244.0.5]
- addresses: [10.244.0.6]
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: e2e}
spec:
  clusterIP: 10.96.0.11
  sessionAffinity: ClientIP
  ports:
  - {name: http, port: 80, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-1, namespace: e2e, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [10.244.0.5]
- addresses: [10.244.0.6]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: e2e}
spec:
  clusterIP: 10.96.0.12
  ports:
  - {name: http, port: 80, protocol: TCP}
`

// ipv6Manifest is an IPv6 single-stack Service for the ip6tables rules.
const ipv6Manifest = `
---
apiVersion: v1
kind: Service
metadata: {name: web6, namespace: e2e}
spec:
  type: NodePort
  ipFamilies: [IPv6]
  clusterIP: fd00:96::10
  ports:
  - {name: http, port: 80, nodePort: 30081, protocol: TCP}
  - {name: dns, port: 53, nodePort: 30054, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web6-1, namespace: e2e, labels: {kubernetes.io/service-name: web6}}
addressType: IPv6
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 5353, protocol: UDP}
endpoints:
- addresses: ["fd00:244::5"]
- addresses: ["fd00:244::6"]
`

// lbManifest is a LoadBalancer Service with externalTrafficPolicy Local,
// a health check node port and source ranges (RANGE) that admit the client
// namespace; 10.244.0.5 is on this node (--hostname-override=node-a).
const lbManifest = `apiVersion: v1
kind: Service
metadata: {name: guarded, namespace: e2e}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.13
  externalTrafficPolicy: Local
  healthCheckNodePort: 32100
  loadBalancerSourceRanges: [RANGE]
  ports: [{name: http, port: 80, nodePort: 30090, protocol: TCP}]
status:
  loadBalancer: {ingress: [{ip: 203.0.113.20}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: guarded-1, namespace: e2e, labels: {kubernetes.io/service-name: guarded}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.0.5], nodeName: node-a}
- {addresses: [10.244.0.6], nodeName: node-b}
`

// A restart of iptables mode (and of nftables mode), then a crash and a
// start, while a client keeps connecting through a ClusterIP and a
// NodePort: every connection is answered (issue 14). The rules stay in the
// kernel throughout; the new process takes /healthz and /metrics over and
// replaces the rules in one restore per table (one transaction per
// family).
func TestIPTablesModeRestartAndCrashKeepServing(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { kernelModeRestart(t, mode) })
	}
}

func kernelModeRestart(t *testing.T, mode string) {
	b := newNetnsBed(t)
	b.startBackends("b", "10.244.0.5", "10.244.0.6", "fd00:244::5", "fd00:244::6")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), iptablesManifest)
	args := []string{sluiceBin, "--proxy-mode=" + mode, "--mode-fallback=false", "--hostname-override=node-a", "--iptables-backend=nft", "--manifests", dir,
		"--cluster-cidr=10.244.0.0/16", "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
		// nftables mode's default is the primary address, kube-proxy's.
		"--nodeport-addresses=192.168.10.0/24",
		"--handover-socket", filepath.Join(t.TempDir(), "handover.sock")}
	p := b.start(b.node, nil, args...)
	p.waitLog("state applied")
	stop := make(chan struct{})
	answers := make(chan []string, 1)
	go func() {
		var all []string
		for {
			select {
			case <-stop:
				answers <- all
				return
			default:
			}
			for _, a := range []string{"10.96.0.10:80", "192.168.10.1:30080"} {
				cmd := exec.Command("ip", "netns", "exec", b.client, os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=client", fmt.Sprintf("%s=tcp,%s,20", helperArgsEnv, a))
				out, err := cmd.Output()
				if err != nil {
					all = append(all, "error: client helper: "+err.Error())
					continue
				}
				all = append(all, strings.Split(strings.TrimSpace(string(out)), "\n")...)
			}
		}
	}()
	// A restart: the successor takes the admin sockets and retires p.
	next := b.start(b.node, nil, args...)
	next.waitLog("hand-over: the previous sluice retires") // after its first sync
	if code := p.exitCode(); code != 0 {
		t.Fatalf("the retired sluice exited %d", code)
	}
	// A crash: the rules stay; traffic goes on with no process at all.
	next.cmd.Process.Kill()
	next.exitCode()
	mid := b.tries("tcp", "10.96.0.10:80", 20)
	third := b.start(b.node, nil, args...)
	third.waitLog("state applied")
	close(stop)
	all := append(<-answers, mid...)
	if d := distinct(all); d["error"] > 0 || d["b@10.244.0.5"] == 0 || d["b@10.244.0.6"] == 0 {
		for _, a := range all {
			if strings.HasPrefix(a, "error") {
				t.Fatalf("%d connections across a restart and a crash: %v; first error %q", len(all), d, a)
			}
		}
		t.Fatalf("%d connections across a restart and a crash: %v", len(all), d)
	}
	t.Logf("%d connections across a restart and a crash, none failed", len(all))
}

func TestIPTablesModeInNetns(t *testing.T) {
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) { iptablesModeInNetns(t, backend) })
	}
}

func iptablesModeInNetns(t *testing.T, backend string) {
	b := newNetnsBed(t)
	b.startBackends("b", "10.244.0.5", "10.244.0.6", "fd00:244::5", "fd00:244::6")
	// Rules of someone else's, in every table sluice touches: --cleanup
	// must leave them exactly as they were.
	for _, cmd := range []string{"iptables-" + backend, "ip6tables-" + backend} {
		b.in(b.node, cmd, "-A", "INPUT", "-p", "tcp", "--dport", "2222", "-j", "ACCEPT")
		b.in(b.node, cmd, "-t", "nat", "-A", "POSTROUTING", "-o", "c0", "-p", "udp", "--dport", "4444", "-j", "MASQUERADE")
		b.in(b.node, cmd, "-t", "mangle", "-A", "PREROUTING", "-p", "tcp", "--dport", "2222", "-j", "ACCEPT")
		// kubelet's KUBE-FIREWALL, as kubelet v1.34 makes it (the drop in
		// IPv4 only): iptables mode writes the same rule into it, and
		// --cleanup leaves it, as kube-proxy's does; kubelet would not put
		// it back.
		b.in(b.node, cmd, "-N", "KUBE-FIREWALL")
		if cmd == "iptables-"+backend {
			b.in(b.node, cmd, "-A", "KUBE-FIREWALL", "-m", "comment", "--comment", "block incoming localnet connections",
				"-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8", "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP")
		}
		b.in(b.node, cmd, "-I", "OUTPUT", "-j", "KUBE-FIREWALL")
		b.in(b.node, cmd, "-I", "INPUT", "-j", "KUBE-FIREWALL")
	}
	before := b.saveState(backend)
	if !strings.Contains(before, "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8") {
		t.Fatalf("no kubelet rule in KUBE-FIREWALL:\n%s", before)
	}

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), iptablesManifest)
	writeFile(t, filepath.Join(dir, "svc6.yaml"), ipv6Manifest)
	writeFile(t, filepath.Join(dir, "lb.yaml"), strings.Replace(lbManifest, "RANGE", "192.168.10.0/24", 1))
	p := b.start(b.node, nil, sluiceBin, "--proxy-mode=iptables", "--hostname-override=node-a", "--iptables-backend="+backend, "--manifests", dir,
		"--cluster-cidr=10.244.0.0/16", "--iptables-sync-period=1s", "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249")
	p.waitLog("state applied")

	want2 := func(what string, answers []string) {
		t.Helper()
		// The rules with their counters say which jump took the tries (a
		// one-off run saw all 20 on one backend; keep what explains it).
		wantBothBackends(t, what, answers, "10.244.0.5", "10.244.0.6", func() string {
			out, err := exec.Command("ip", "netns", "exec", b.node, "iptables-"+backend+"-save", "-c", "-t", "nat").CombinedOutput()
			return fmt.Sprintf("answers: %q\nnat table (%v):\n%s", answers, err, out)
		})
	}
	// As kube-proxy when iptables has it (1.6.2 and later; 1.8 here).
	if nat := b.in(b.node, "iptables-"+backend+"-save", "-t", "nat"); !strings.Contains(nat, `"kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`) {
		t.Fatalf("KUBE-POSTROUTING's SNAT rule without --random-fully:\n%s", nat)
	}
	want2("ClusterIP TCP", b.tries("tcp", "10.96.0.10:80", 20))
	want2("NodePort TCP", b.tries("tcp", "192.168.10.1:30080", 20))
	want2("externalIP TCP", b.tries("tcp", "203.0.113.10:80", 20))
	want2("ClusterIP UDP", b.tries("udp", "10.96.0.10:53", 20))
	want2("NodePort UDP", b.tries("udp", "192.168.10.1:30053", 20))
	want2("externalIP UDP", b.tries("udp", "203.0.113.10:53", 20))
	want6 := func(what string, answers []string) {
		t.Helper()
		wantBothBackends(t, what, answers, "fd00:244::5", "fd00:244::6", func() string { return strings.Join(answers, "\n") })
	}
	want6("IPv6 ClusterIP TCP", b.tries("tcp", "[fd00:96::10]:80", 20))
	want6("IPv6 ClusterIP UDP", b.tries("udp", "[fd00:96::10]:53", 20))
	want6("IPv6 NodePort TCP", b.tries("tcp", "[fd00:10::1]:30081", 20))
	if d := distinct(b.tries("tcp", "10.96.0.11:80", 15)); len(d) != 1 || d["error"] > 0 {
		t.Fatalf("ClientIP affinity: %v, want 15 hits on one backend", d)
	}
	if got := b.tries("tcp", "10.96.0.12:80", 1)[0]; !strings.Contains(got, "connection refused") {
		t.Fatalf("no endpoints: %q, want connection refused (REJECT), not a timeout", got)
	}

	// LoadBalancer IP with externalTrafficPolicy Local and source ranges:
	// the client is inside the range and reaches only the local endpoint;
	// the health check node port says there is one.
	if d := distinct(b.tries("tcp", "203.0.113.20:80", 6)); d["b@10.244.0.5"] != 6 {
		t.Fatalf("LB IP from an allowed source: %v, want the local endpoint only", d)
	}
	// (kube-proxy's body is indented over lines, which the client prints
	// as they come.)
	if got := strings.Join(b.tries("tcp", "192.168.10.1:32100", 1), "\n"); !strings.Contains(got, `"localEndpoints": 1`) || !strings.Contains(got, `"name": "guarded"`) {
		t.Fatalf("health check node port: %q", got)
	}
	// The range no longer admits the client: its packets are dropped.
	writeFile(t, filepath.Join(dir, "lb.yaml"), strings.Replace(lbManifest, "RANGE", "10.0.0.0/8", 1))
	p.waitLog("state applied", "e2e/guarded:http")
	if got := b.tries("tcp", "203.0.113.20:80", 1)[0]; !strings.Contains(got, "Timeout") {
		t.Fatalf("LB IP from a source outside the ranges: %q, want a timeout (dropped)", got)
	}

	// A firewall reload flushes nat: the canary is gone, sluice resyncs.
	b.in(b.node, "iptables-"+backend, "-t", "nat", "-F")
	b.in(b.node, "iptables-"+backend, "-t", "nat", "-X")
	// ... and the reloading firewall puts back its own rule.
	b.in(b.node, "iptables-"+backend, "-t", "nat", "-A", "POSTROUTING", "-o", "c0", "-p", "udp", "--dport", "4444", "-j", "MASQUERADE")
	p.waitLog("iptables: full resync", "KUBE-PROXY-CANARY")
	p.waitLog("iptables: resynced")
	want2("ClusterIP after the canary resync", b.tries("tcp", "10.96.0.10:80", 20))

	// conntrack: a UDP client keeps one source port, so its packets share
	// one conntrack entry. When its endpoint leaves the service, the
	// entry is deleted and the next packet reaches the remaining one (the
	// old endpoint still answers, so a stale entry would show).
	first := b.tries("udp@40000", "10.96.0.10:53", 3)
	if d := distinct(first); len(d) != 1 || d["error"] > 0 {
		t.Fatalf("UDP from one source port: %v, want one backend throughout", d)
	}
	gone, keep := "10.244.0.5", "10.244.0.6"
	if first[0] == "b@10.244.0.6" {
		gone, keep = keep, gone
	}
	writeFile(t, filepath.Join(dir, "svc.yaml"), strings.Replace(iptablesManifest, "- addresses: [10.244.0.5]\n- addresses: [10.244.0.6]", "- addresses: ["+keep+"]", 1))
	p.waitLog("conntrack: deleted stale UDP entries")
	if d := distinct(b.tries("udp@40000", "10.96.0.10:53", 3)); d["b@"+keep] != 3 {
		t.Fatalf("UDP from the same source port after %s left: %v, want %s only", gone, d, keep)
	}

	// --cleanup after sluice stops restores the tables exactly, kubelet's
	// KUBE-FIREWALL included; twice is fine.
	p.cmd.Process.Signal(os.Interrupt)
	if code := p.exitCode(); code != 0 {
		t.Fatalf("sluice exit %d", code)
	}
	for i := 0; i < 2; i++ {
		b.in(b.node, sluiceBin, "--cleanup", "--iptables-backend="+backend)
		if after := b.saveState(backend); after != before {
			t.Fatalf("after --cleanup #%d the tables differ.\nbefore:\n%s\nafter:\n%s", i+1, before, after)
		}
	}
}

// With --manifests, the node hints count unless the
// PreferSameTrafficDistribution gate is off, as with the API source (whose
// test is the parity bed's): KUBE-SVC- jumps to this node's endpoint only,
// or to both.
func TestManifestNodeHintsFollowTheGate(t *testing.T) {
	b := newNetnsBed(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), `apiVersion: v1
kind: Service
metadata: {name: hinted, namespace: e2e}
spec:
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: hinted-1, namespace: e2e, labels: {kubernetes.io/service-name: hinted}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.0.5]
  hints: {forNodes: [{name: node-a}]}
- addresses: [10.244.1.6]
  hints: {forNodes: [{name: node-b}]}
`)
	for _, tc := range []struct {
		gate string
		want []string
	}{
		{"", []string{"10.244.0.5:8080"}},
		{"--feature-gates=PreferSameTrafficDistribution=false", []string{"10.244.0.5:8080", "10.244.1.6:8080"}},
	} {
		args := []string{sluiceBin, "--proxy-mode=iptables", "--iptables-backend=nft", "--hostname-override=node-a", "--manifests", dir,
			"--healthz-bind-address=", "--metrics-bind-address=", "--cluster-cidr=10.244.0.0/16"}
		if tc.gate != "" {
			args = append(args, tc.gate)
		}
		p := b.start(b.node, nil, args...)
		p.waitLog("state applied")
		var got []string
		for _, l := range strings.Split(b.in(b.node, "iptables-nft-save", "-t", "nat"), "\n") {
			if strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, "-j KUBE-SEP-") {
				if _, ep, ok := strings.Cut(l, "e2e/hinted:http -> "); ok {
					got = append(got, strings.Trim(strings.Fields(ep)[0], `"`))
				}
			}
		}
		slices.Sort(got)
		p.cmd.Process.Signal(os.Interrupt)
		p.exitCode()
		b.in(b.node, sluiceBin, "--cleanup", "--iptables-backend=nft")
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: the Service's chain jumps to %q, want %q", tc.gate, got, tc.want)
		}
	}
}

// route_localnet (node-wide, and what CVE-2020-8558 was about) is set only
// when NodePorts answer on 127.0.0.1, as kube-proxy decides, and --cleanup
// puts back the value it had (issue 18).
func TestRouteLocalnetOnlyWhenNeededAndRestoredByCleanup(t *testing.T) {
	b := newNetnsBed(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), iptablesManifest)
	value := func() string {
		return strings.TrimSpace(b.in(b.node, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet"))
	}
	if v := value(); v != "0" {
		t.Fatalf("a new namespace has route_localnet=%s", v)
	}
	base := []string{sluiceBin, "--proxy-mode=iptables", "--iptables-backend=nft", "--manifests", dir,
		"--healthz-bind-address=", "--metrics-bind-address=", "--cluster-cidr=10.244.0.0/16"}
	p := b.start(b.node, nil, append(base, "--nodeport-addresses=192.168.10.0/24")...)
	p.waitLog("state applied")
	if v := value(); v != "0" {
		t.Fatalf("NodePorts only on 192.168.10.0/24, yet route_localnet=%s", v)
	}
	p.cmd.Process.Kill()
	p.exitCode()
	p = b.start(b.node, nil, base...)
	p.waitLog("state applied")
	if v := value(); v != "1" {
		t.Fatalf("NodePorts on every address (127.0.0.1 too), yet route_localnet=%s", v)
	}
	p.cmd.Process.Kill()
	p.exitCode()
	b.in(b.node, sluiceBin, "--cleanup", "--iptables-backend=nft")
	if v := value(); v != "0" {
		t.Fatalf("after --cleanup route_localnet=%s, want the 0 it was", v)
	}
}

// The conntrack sysctls the kernel modes depend on are set from the
// --conntrack-* flags, as kube-proxy sets them (issue 18: accepted and
// never applied), in the node's namespace; nf_conntrack_max, which only
// the host's namespace may set, is left alone here and said so.
func TestConntrackSysctlsAreApplied(t *testing.T) {
	b := newNetnsBed(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), iptablesManifest)
	p := b.start(b.node, nil, sluiceBin, "--proxy-mode=iptables", "--iptables-backend=nft", "--manifests", dir,
		"--healthz-bind-address=", "--metrics-bind-address=", "--cluster-cidr=10.244.0.0/16",
		"--conntrack-tcp-timeout-established=2h", "--conntrack-tcp-timeout-close-wait=30m", "--conntrack-tcp-be-liberal",
		"--conntrack-udp-timeout=45s", "--conntrack-udp-timeout-stream=3m")
	p.waitLog("nf_conntrack_max left as it is")
	p.waitLog("state applied")
	for name, want := range map[string]string{
		"nf_conntrack_tcp_timeout_established": "7200",
		"nf_conntrack_tcp_timeout_close_wait":  "1800",
		"nf_conntrack_tcp_be_liberal":          "1",
		"nf_conntrack_udp_timeout":             "45",
		"nf_conntrack_udp_timeout_stream":      "180",
	} {
		if got := strings.TrimSpace(b.in(b.node, "cat", "/proc/sys/net/netfilter/"+name)); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	// Liberal tracking set before the rules were made: no INVALID drop.
	if filter := b.in(b.node, "iptables-nft-save", "-t", "filter"); strings.Contains(filter, "--ctstate INVALID -j DROP") {
		t.Fatalf("INVALID drop with nf_conntrack_tcp_be_liberal set:\n%s", filter)
	}
}

// With --manifests, this node's Node object in the files stands for the
// API's Node: its zone steers the zone hints (a change of its label
// rewrites the Service's chain), its pod CIDRs are what
// --detect-local-mode=NodeCIDR matches (a change ends sluice with exit code
// 1, as it ends kube-proxy), and without it NodeCIDR mode refuses to start,
// naming the node.
func TestManifestNodeGivesTheZoneAndThePodCIDRs(t *testing.T) {
	b := newNetnsBed(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), `apiVersion: v1
kind: Service
metadata: {name: zoned, namespace: e2e}
spec:
  clusterIP: 10.96.0.41
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: zoned-1, namespace: e2e, labels: {kubernetes.io/service-name: zoned}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.0.5]
  hints: {forZones: [{name: z1}]}
- addresses: [10.244.1.6]
  hints: {forZones: [{name: z2}]}
`)
	node := func(zone, podCIDR string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: %s}
spec: {podCIDR: %[2]s, podCIDRs: [%[2]s]}
status:
  addresses: [{type: InternalIP, address: 10.244.0.1}]
`, zone, podCIDR)
	}
	args := []string{sluiceBin, "--proxy-mode=iptables", "--mode-fallback=false", "--iptables-backend=nft", "--hostname-override=node-a",
		"--manifests", dir, "--healthz-bind-address=", "--metrics-bind-address=", "--detect-local-mode=NodeCIDR"}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "exec", b.node, sluiceBin, "--cleanup", "--iptables-backend=nft").Run()
	})

	p := b.start(b.node, nil, args...)
	p.waitLog("holds no Node named", `\"node-a\"`)
	if code := p.exitCode(); code == 0 {
		t.Fatal("NodeCIDR mode without the Node in the manifests exited 0")
	}

	nodeFile := filepath.Join(dir, "node.yaml")
	writeFile(t, nodeFile, "# another node's, then this one's\n"+strings.ReplaceAll(node("z1", "10.244.9.0/24"), "node-a", "node-b")+"---\n"+node("z2", "10.244.1.0/24"))
	p = b.start(b.node, nil, args...)
	p.waitLog("detect-local-mode NodeCIDR", "10.244.1.0/24")
	p.waitLog("state applied")
	jumps := func() []string {
		t.Helper()
		var got []string
		for _, l := range strings.Split(b.in(b.node, "iptables-nft-save", "-t", "nat"), "\n") {
			if strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, "-j KUBE-SEP-") {
				if _, ep, ok := strings.Cut(l, "e2e/zoned:http -> "); ok {
					got = append(got, strings.Trim(strings.Fields(ep)[0], `"`))
				}
			}
		}
		return got
	}
	if got := jumps(); !slices.Equal(got, []string{"10.244.1.6:8080"}) {
		t.Errorf("in zone z2 the Service's chain jumps to %q, want only the z2 endpoint", got)
	}
	if nat := b.in(b.node, "iptables-nft-save", "-t", "nat"); !strings.Contains(nat, "! -s 10.244.1.0/24 -d 10.96.0.41/32") {
		t.Errorf("no masquerade of traffic from outside the Node's pod CIDR:\n%s", nat)
	}

	writeFile(t, nodeFile, node("z1", "10.244.1.0/24"))
	p.waitLog("this node's zone", "zone=z1")
	p.waitLog("state applied")
	if got := jumps(); !slices.Equal(got, []string{"10.244.0.5:8080"}) {
		t.Errorf("moved to zone z1, the Service's chain jumps to %q, want only the z1 endpoint", got)
	}

	writeFile(t, nodeFile, node("z1", "10.244.2.0/24"))
	p.waitLog("spec.podCIDRs changed")
	if code := p.exitCode(); code != 1 {
		t.Fatalf("exit code %d after the pod CIDRs changed, want 1", code)
	}
}
