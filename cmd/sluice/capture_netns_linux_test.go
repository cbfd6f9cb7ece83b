package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Userspace mode for real, with each VIP capture method, in the same
// client -> node -> backend namespaces as the iptables mode's test:
// ClusterIP (TCP and UDP), NodePort and a non-local externalIP reach the
// userspace listeners from the client namespace; --cleanup restores the
// tables and lo's addresses exactly.
func TestUserspaceCaptureInNetns(t *testing.T) {
	for _, tc := range []struct {
		name, method, backend string
		env                   []string
		logs                  []string
		args                  []string
	}{
		{"iptables-nft", "iptables", "nft", nil, []string{"userspace VIP capture: iptables", "forced by --userspace-capture"}, nil},
		{"iptables-legacy", "iptables", "legacy", nil, []string{"userspace VIP capture: iptables", "forced by --userspace-capture"}, nil},
		{"nftables", "nftables", "nft", nil, []string{"userspace VIP capture: nftables", "forced by --userspace-capture"}, nil},
		// A restricted node: nft and no iptables binary at all.
		{"nftables-without-iptables", "nftables", "nft", []string{"PATH=" + nftOnlyDir(t)}, []string{"userspace VIP capture: nftables", "forced by --userspace-capture"}, nil},
		{"auto", "auto", "nft", nil, []string{"userspace VIP capture: nftables", "nft can program the sluice-portals table"}, nil},
		// With neither nft nor iptables on PATH, auto falls back to bind
		// and says why.
		{"auto-without-nft-or-iptables", "auto", "nft", []string{"PATH=/var/empty"}, []string{"userspace VIP capture: bind", "nftables unusable", "iptables unusable"}, nil},
		{"bind-nft", "bind", "nft", nil, []string{"userspace VIP capture: bind", "forced by --userspace-capture"}, nil},
		{"bind-legacy", "bind", "legacy", nil, []string{"userspace VIP capture: bind", "forced by --userspace-capture"}, nil},
		{"none", "none", "legacy", nil, []string{"userspace VIP capture: none", "forced by --userspace-capture"}, nil},
		// One capture port for every TCP service port (issue 16's 50k
		// Services): the original destination picks the service.
		{"nftables-capture-port", "nftables", "nft", nil, []string{"userspace capture port", "port=15001"}, []string{"--userspace-capture-port=15001"}},
		{"iptables-capture-port", "iptables", "legacy", nil, []string{"userspace capture port", "port=15001"}, []string{"--userspace-capture-port=15001"}},
		{"nftables-capture-port-goroutine", "nftables", "nft", nil, []string{"userspace capture port", "port=15001"}, []string{"--userspace-capture-port=15001", "--engine=goroutine"}},
		// Go's engine listens on [::] for 0.0.0.0: its proxy ports must
		// still be captured for IPv4 ClusterIPs.
		{"nftables-goroutine", "nftables", "nft", nil, []string{"userspace VIP capture: nftables", "forced by --userspace-capture"}, []string{"--engine=goroutine"}},
	} {
		t.Run(tc.name, func(t *testing.T) { userspaceCaptureInNetns(t, tc.method, tc.backend, tc.env, tc.logs, tc.args...) })
	}
}

// nftOnlyDir is a PATH holding nft and nothing else.
func nftOnlyDir(t *testing.T) string {
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Fatalf("nft: %v", err)
	}
	dir := t.TempDir()
	if err := os.Symlink(nft, filepath.Join(dir, "nft")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func userspaceCaptureInNetns(t *testing.T, method, backend string, env, logLine []string, args ...string) {
	b := newNetnsBed(t)
	b.startBackends("b", "10.244.0.5", "10.244.0.6", "fd00:244::5", "fd00:244::6")
	for _, cmd := range []string{"iptables-" + backend, "ip6tables-" + backend} {
		b.in(b.node, cmd, "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "2222", "-j", "REDIRECT", "--to-ports", "22")
	}
	b.in(b.node, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo") // someone else's address on lo
	state := func() string {
		return b.saveState(backend) + b.in(b.node, "ip", "-o", "addr", "show", "dev", "lo") + b.in(b.node, "nft", "list", "tables")
	}
	before := state()

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), iptablesManifest)
	writeFile(t, filepath.Join(dir, "svc6.yaml"), ipv6Manifest)
	capturePort := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--userspace-capture-port") })
	if capturePort { // a restart below hands it over, on this socket
		args = append(args, "--handover-socket", filepath.Join(t.TempDir(), "handover.sock"))
	}
	cmdline := append([]string{sluiceBin, "--proxy-mode=userspace", "--userspace-capture=" + method, "--iptables-backend=" + backend,
		"--manifests", dir, "--iptables-sync-period=1s", "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249"}, args...)
	p := b.start(b.node, env, cmdline...)
	p.waitLog(logLine...)
	p.waitLog("state applied")
	if method == "auto" {
		method = "nftables"
		if len(env) > 0 {
			method = "bind"
		}
	}

	want2 := func(what string, answers []string) {
		t.Helper()
		d := distinct(answers)
		if len(d) != 2 || d["b@10.244.0.5"] == 0 || d["b@10.244.0.6"] == 0 {
			t.Fatalf("%s: %v, want both backends", what, d)
		}
	}
	want2("NodePort TCP", b.tries("tcp", "192.168.10.1:30080", 10))
	want2("NodePort UDP", b.tries("udp", "192.168.10.1:30053", 10))
	// Bursts sent with GSO (merged on the way in, relayed as GSO, NATed
	// back as one): every datagram whole, in order, from the address asked.
	want2("NodePort UDP bursts", b.tries("udp-burst", "192.168.10.1:30053", 6))
	if method == "none" {
		// Nothing captured: the packets follow the node's route into the
		// backend namespace, which does not forward them.
		for _, a := range []string{"10.96.0.10:80", "203.0.113.10:80"} {
			if d := distinct(b.tries("tcp", a, 1)); d["error"] != 1 {
				t.Fatalf("%s reached %v with no capture", a, d)
			}
		}
	} else {
		want2("ClusterIP TCP", b.tries("tcp", "10.96.0.10:80", 10))
		want2("ClusterIP UDP", b.tries("udp", "10.96.0.10:53", 10))
		want2("ClusterIP UDP bursts", b.tries("udp-burst", "10.96.0.10:53", 6))
		want2("externalIP TCP", b.tries("tcp", "203.0.113.10:80", 10))
		want2("externalIP UDP", b.tries("udp", "203.0.113.10:53", 10))
		if d := distinct(b.tries("tcp", "10.96.0.11:80", 10)); len(d) != 1 || d["error"] > 0 {
			t.Fatalf("ClientIP affinity: %v, want 10 hits on one backend", d)
		}
		if got := b.tries("tcp", "10.96.0.12:80", 1)[0]; !strings.HasPrefix(got, "error: ") {
			t.Fatalf("no endpoints: %q, want an error", got)
		}
	}
	if capturePort {
		// The capture port serves only what was redirected to it.
		if d := distinct(b.tries("tcp", "192.168.10.1:15001", 1)); d["error"] != 1 {
			t.Fatalf("a connection straight to the capture port reached %v", d)
		}
		// A restart (the hitless one) hands the capture listener over: the
		// successor serves the ClusterIPs through it, the old one retires.
		next := b.start(b.node, env, cmdline...) // the same command line, as an upgrade runs it
		next.waitLog("hand-over: took the listening sockets")
		next.waitLog("hand-over: the previous sluice retires")
		if code := p.exitCode(); code != 0 {
			t.Fatalf("the retired sluice exited %d", code)
		}
		p = next
		want2("ClusterIP TCP after a restart", b.tries("tcp", "10.96.0.10:80", 10))
		want2("externalIP TCP after a restart", b.tries("tcp", "203.0.113.10:80", 10))
	}
	if method == "bind" {
		// The bind capture serves IPv6 ClusterIPs too: the VIP is an
		// address of the node, listened on directly. (The iptables capture
		// redirects to proxy ports on --bind-address's family only.)
		for _, a := range []string{"[fd00:96::10]:80", "[fd00:96::10]:53"} {
			proto := map[bool]string{true: "udp", false: "tcp"}[strings.HasSuffix(a, ":53")]
			d := distinct(b.tries(proto, a, 10))
			if len(d) != 2 || d["b@fd00:244::5"] == 0 || d["b@fd00:244::6"] == 0 {
				t.Fatalf("IPv6 ClusterIP %s %s: %v, want both IPv6 backends", proto, a, d)
			}
		}
	}
	if method == "iptables" {
		// A firewall reload flushes nat; the portals come back.
		b.in(b.node, "iptables-"+backend, "-t", "nat", "-F")
		b.in(b.node, "iptables-"+backend, "-t", "nat", "-X")
		b.in(b.node, "iptables-"+backend, "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "2222", "-j", "REDIRECT", "--to-ports", "22")
		p.waitLog("portals resynced")
		want2("ClusterIP after a flush", b.tries("tcp", "10.96.0.10:80", 10))
	}

	if method == "nftables" || method == "iptables" {
		// A Service added while sluice runs is captured (its portal a
		// new map element, with nftables), and released when it goes.
		writeFile(t, filepath.Join(dir, "added.yaml"), addedManifest)
		p.waitLog("state applied", "e2e/added")
		want2("an added ClusterIP", b.tries("tcp", "10.96.0.20:80", 10))
		want2("the first ClusterIP beside it", b.tries("tcp", "10.96.0.10:80", 10))
		if err := os.Remove(filepath.Join(dir, "added.yaml")); err != nil {
			t.Fatal(err)
		}
		p.waitLog("state applied", "e2e/added")
		if d := distinct(b.tries("tcp", "10.96.0.20:80", 1)); d["error"] != 1 {
			t.Fatalf("a removed ClusterIP reached %v", d)
		}
	}
	if method == "nftables" {
		// A `nft flush ruleset` or another tool drops the table; the
		// portals come back.
		b.in(b.node, "nft", "delete", "table", "ip", "sluice-portals")
		p.waitLog("portals resynced")
		want2("ClusterIP after the table was deleted", b.tries("tcp", "10.96.0.10:80", 10))
	}

	p.cmd.Process.Signal(os.Interrupt)
	if code := p.exitCode(); code != 0 {
		t.Fatalf("sluice exit %d", code)
	}
	for i := 0; i < 2; i++ {
		b.in(b.node, sluiceBin, "--cleanup", "--iptables-backend="+backend)
		if after := state(); after != before {
			t.Fatalf("after --cleanup #%d the node differs.\nbefore:\n%s\nafter:\n%s", i+1, before, after)
		}
	}
}

// addedManifest is a Service and its endpoints added to a running sluice.
const addedManifest = `apiVersion: v1
kind: Service
metadata: {name: added, namespace: e2e}
spec:
  clusterIP: 10.96.0.20
  ports:
  - {name: http, port: 80, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: added-1, namespace: e2e, labels: {kubernetes.io/service-name: added}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [10.244.0.5]
- addresses: [10.244.0.6]
`

// With an IPv6 --bind-address, the capture port serves IPv6 ClusterIPs:
// the nftables capture redirects them to [::]:15001, and each
// connection's original destination (IPV6_ORIGINAL_DST) picks the
// service. UDP keeps its proxy ports. A connection straight to the
// capture port is refused. Then the table is gone after --cleanup. Both
// engines.
func TestUserspaceCapturePortServesIPv6(t *testing.T) {
	for _, engine := range []string{"eventloop", "goroutine"} {
		t.Run(engine, func(t *testing.T) { userspaceCapturePortServesIPv6(t, engine) })
	}
}

func userspaceCapturePortServesIPv6(t *testing.T, engine string) {
	b := newNetnsBed(t)
	b.startBackends("b", "fd00:244::5", "fd00:244::6")
	before := b.in(b.node, "nft", "list", "tables")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc6.yaml"), ipv6Manifest)
	p := b.start(b.node, nil, sluiceBin, "--proxy-mode=userspace", "--userspace-capture=nftables", "--bind-address=::",
		"--userspace-capture-port=15001", "--engine="+engine, "--manifests", dir, "--healthz-bind-address=", "--metrics-bind-address=")
	p.waitLog("userspace capture port", "port=15001")
	p.waitLog("state applied")
	for _, c := range []struct{ proto, addr string }{{"tcp", "[fd00:96::10]:80"}, {"udp", "[fd00:96::10]:53"}} {
		d := distinct(b.tries(c.proto, c.addr, 10))
		if len(d) != 2 || d["b@fd00:244::5"] == 0 || d["b@fd00:244::6"] == 0 {
			t.Fatalf("IPv6 ClusterIP %s %s: %v, want both IPv6 backends", c.proto, c.addr, d)
		}
	}
	if d := distinct(b.tries("tcp", "[fd00:10::1]:15001", 1)); d["error"] != 1 {
		t.Fatalf("a connection straight to the capture port reached %v", d)
	}
	p.cmd.Process.Signal(os.Interrupt)
	if code := p.exitCode(); code != 0 {
		t.Fatalf("sluice exit %d", code)
	}
	b.in(b.node, sluiceBin, "--cleanup")
	if after := b.in(b.node, "nft", "list", "tables"); after != before {
		t.Fatalf("after --cleanup the node's tables differ.\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
