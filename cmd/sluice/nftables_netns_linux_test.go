package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nftables mode (issue 13) in the node namespace between a client and a
// backend namespace, as TestIPTablesModeInNetns: TCP and UDP through
// ClusterIP, NodePort and externalIP, IPv6, ClientIP affinity, REJECT with
// no endpoints, a LoadBalancer IP with externalTrafficPolicy Local and
// source ranges (then a range that leaves the client out: dropped), and
// --cleanup deleting the kube-proxy table in both families.
func TestNFTablesModeInNetns(t *testing.T) {
	b := newNetnsBed(t)
	b.startBackends("b", "10.244.0.5", "10.244.0.6", "fd00:244::5", "fd00:244::6")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), iptablesManifest)
	writeFile(t, filepath.Join(dir, "svc6.yaml"), ipv6Manifest)
	writeFile(t, filepath.Join(dir, "lb.yaml"), strings.Replace(lbManifest, "RANGE", "192.168.10.0/24", 1))
	p := b.start(b.node, nil, sluiceBin, "--proxy-mode=nftables", "--mode-fallback=false", "--hostname-override=node-a", "--manifests", dir,
		"--cluster-cidr=10.244.0.0/16,fd00:244::/64", "--nodeport-addresses=192.168.10.0/24,fd00:10::/64", "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
		"--iptables-sync-period=1s") // the periodic sync that deletes stale chains (below), every second
	p.waitLog("nftables mode", "families=2")
	p.waitLog("state applied")

	table := func(family string) func() string {
		return func() string { return b.in(b.node, "nft", "list", "table", family, "kube-proxy") }
	}
	want2 := func(what string, answers []string) {
		t.Helper()
		wantBothBackends(t, what, answers, "10.244.0.5", "10.244.0.6", table("ip"))
	}
	want2("ClusterIP TCP", b.tries("tcp", "10.96.0.10:80", 20))
	want2("NodePort TCP", b.tries("tcp", "192.168.10.1:30080", 20))
	want2("externalIP TCP", b.tries("tcp", "203.0.113.10:80", 20))
	want2("ClusterIP UDP", b.tries("udp", "10.96.0.10:53", 20))
	want2("NodePort UDP", b.tries("udp", "192.168.10.1:30053", 20))
	want6 := func(what string, answers []string) {
		t.Helper()
		wantBothBackends(t, what, answers, "fd00:244::5", "fd00:244::6", table("ip6"))
	}
	want6("IPv6 ClusterIP TCP", b.tries("tcp", "[fd00:96::10]:80", 20))
	want6("IPv6 ClusterIP UDP", b.tries("udp", "[fd00:96::10]:53", 20))
	want6("IPv6 NodePort TCP", b.tries("tcp", "[fd00:10::1]:30081", 20))
	if d := distinct(b.tries("tcp", "10.96.0.11:80", 15)); len(d) != 1 || d["error"] > 0 {
		t.Fatalf("ClientIP affinity: %v, want 15 hits on one backend", d)
	}
	if got := b.tries("tcp", "10.96.0.12:80", 1)[0]; !strings.Contains(got, "connection refused") {
		t.Fatalf("no endpoints: %q, want connection refused (reject), not a timeout", got)
	}
	if d := distinct(b.tries("tcp", "203.0.113.20:80", 6)); d["b@10.244.0.5"] != 6 {
		t.Fatalf("LB IP from an allowed source: %v, want the local endpoint only", d)
	}
	writeFile(t, filepath.Join(dir, "lb.yaml"), strings.Replace(lbManifest, "RANGE", "10.0.0.0/8", 1))
	p.waitLog("state applied", "e2e/guarded:http")
	if got := b.tries("tcp", "203.0.113.20:80", 1)[0]; !strings.Contains(got, "Timeout") {
		t.Fatalf("LB IP from a source outside the ranges: %q, want a timeout (dropped)", got)
	}
	// A removed endpoint's chains are flushed by the sync, and deleted by
	// one a second or more later, as kube-proxy's (the periodic one here).
	writeFile(t, filepath.Join(dir, "svc.yaml"), strings.Replace(iptablesManifest, "- addresses: [10.244.0.5]\n- addresses: [10.244.0.6]", "- addresses: [10.244.0.6]", 1))
	p.waitLog("state applied", "e2e/web:http")
	table0 := b.in(b.node, "nft", "list", "table", "ip", "kube-proxy")
	if _, body, ok := strings.Cut(table0, "e2e/web/tcp/http__10.244.0.5/8080 {"); !ok || !strings.HasPrefix(strings.TrimSpace(body), "}") {
		t.Fatalf("the removed endpoint's chain is not there, flushed:\n%s", table0)
	}
	if d := distinct(b.tries("tcp", "10.96.0.10:80", 10)); d["b@10.244.0.6"] != 10 {
		t.Fatalf("after 10.244.0.5 left: %v", d)
	}
	p.waitLog("Deleting stale nftables chains", "family=IPv4")
	if table := b.in(b.node, "nft", "list", "table", "ip", "kube-proxy"); strings.Contains(table, "e2e/web/tcp/http__10.244.0.5/8080") {
		t.Fatalf("the removed endpoint's chain is still there:\n%s", table)
	}

	p.cmd.Process.Signal(os.Interrupt)
	if code := p.exitCode(); code != 0 {
		t.Fatalf("sluice exit %d", code)
	}
	b.in(b.node, sluiceBin, "--cleanup")
	if out := b.in(b.node, "nft", "list", "tables"); strings.Contains(out, "kube-proxy") {
		t.Fatalf("after --cleanup: %s", out)
	}
}
