//go:build linux && vmguest

package guest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/kernel/ipvs"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/vishvananda/netlink"
)

// iptables mode serves SCTP (and TCP and UDP) through ClusterIP and
// NodePort. It runs first: no IPVS state of other tests is around.
func TestSCTPInIPTablesModeInVM(t *testing.T) {
	b := newBed(t)
	b.backends("b", 8080, "10.244.0.5", "10.244.0.6")
	dir := t.TempDir()
	sh(t, dir, "svc.yaml", strings.NewReplacer("ENDPOINT2", "10.244.0.6", "HOLD2", "10.244.0.6").Replace(ipvsManifest))
	p := startSluice(t, "--proxy-mode=iptables", "--manifests", dir, "--healthz-bind-address=", "--metrics-bind-address=",
		"--iptables-backend=legacy", "--cluster-cidr=10.244.0.0/16")
	p.waitLog("state applied")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("iptables-legacy-save", "-c").CombinedOutput()
			snmp, _ := os.ReadFile("/proc/net/sctp/snmp")
			t.Logf("iptables:\n%s\nsctp snmp:\n%s", out, snmp)
		}
	})
	// iptables mode picks at random (statistic): 30 tries miss one of two
	// backends with p = 2^-29, where 8 did with p = 1/128.
	both(t, "iptables mode ClusterIP TCP", b.tally("tcp", "10.96.0.10:80", 30))
	both(t, "iptables mode ClusterIP SCTP", b.tally("sctp", "10.96.0.10:9000", 30))
	both(t, "iptables mode NodePort SCTP", b.tally("sctp", "192.168.10.1:30090", 30))
	p.stop()
	c := startSluice(t, "--cleanup", "--iptables-backend=legacy")
	for range c.lines {
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("--cleanup: %v", err)
	}
	if left := ourIPTablesRules(); len(left) > 0 {
		t.Fatalf("iptables rules after --cleanup:\n%s", strings.Join(left, "\n"))
	}
}

// ourIPTablesRules are the lines of iptables-legacy-save that name a KUBE-
// chain other than kubelet's KUBE-FIREWALL, which --cleanup leaves, as
// kube-proxy's does.
func ourIPTablesRules() []string {
	out, _ := exec.Command("iptables-legacy-save").CombinedOutput()
	var ours []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "KUBE-") && !strings.Contains(l, "KUBE-FIREWALL") {
			ours = append(ours, l)
		}
	}
	return ours
}

// nftables mode serves SCTP (and TCP) through ClusterIP and NodePort in a
// kernel that has SCTP (issue 13; the host's has none), and --cleanup
// removes its tables and nothing else.
func TestSCTPInNFTablesModeInVM(t *testing.T) {
	if out, err := exec.Command("nft", "add", "table", "inet", "someone-elses").CombinedOutput(); err != nil {
		t.Fatalf("nft in the guest: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", "someone-elses").Run() })
	b := newBed(t)
	b.backends("b", 8080, "10.244.0.5", "10.244.0.6")
	dir := t.TempDir()
	sh(t, dir, "svc.yaml", strings.NewReplacer("ENDPOINT2", "10.244.0.6", "HOLD2", "10.244.0.6").Replace(ipvsManifest))
	// A sync period of a second: the periodic sync deletes the chains a
	// change left flushed (below) a second or two after it.
	p := startSluice(t, "--proxy-mode=nftables", "--mode-fallback=false", "--manifests", dir, "--healthz-bind-address=", "--metrics-bind-address=",
		"--cluster-cidr=10.244.0.0/16", "--iptables-sync-period=1s", "--v=1")
	p.waitLog("state applied")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("nft", "list", "ruleset").CombinedOutput()
			t.Logf("nft ruleset:\n%s", out)
		}
	})
	// numgen random: 30 tries miss one of two backends with p = 2^-29.
	both(t, "nftables mode ClusterIP TCP", b.tally("tcp", "10.96.0.10:80", 30))
	both(t, "nftables mode ClusterIP SCTP", b.tally("sctp", "10.96.0.10:9000", 30))
	both(t, "nftables mode NodePort SCTP", b.tally("sctp", "192.168.10.1:30090", 30))

	// An endpoint and a Service removed: the partial sync drops the map
	// elements that point to their chains, and flushes the chains. This
	// kernel is Debian 12's 6.1: before 6.2 a chain a deleted map element
	// pointed to stays referenced until after the transaction, so the
	// chains are deleted by a later sync, a second on, in a transaction of
	// their own, as kube-proxy deletes them.
	sh(t, dir, "svc.yaml", strings.NewReplacer("- addresses: [ENDPOINT2]\n", "", "HOLD2", "10.244.0.6").Replace(ipvsManifest[:strings.Index(ipvsManifest, "---\napiVersion: v1\nkind: Service\nmetadata: {name: sticky")]))
	p.waitLog("state applied", "vm/web:http")
	if m := b.tally("tcp", "10.96.0.10:80", 10); m["b@10.244.0.5"] != 10 {
		t.Fatalf("after removing 10.244.0.6: %v, want only 10.244.0.5", m)
	}
	if a := b.ask("tcp", "10.96.0.11:80"); !strings.HasPrefix(a, "error: ") {
		t.Fatalf("the deleted Service vm/sticky answers: %q", a)
	}
	p.waitLog("Deleting stale nftables chains", "family=IPv4")
	out, err := exec.Command("nft", "list", "table", "ip", "kube-proxy").CombinedOutput()
	must(t, err)
	for _, gone := range []string{"10.244.0.6/8080", "vm/sticky/"} {
		if strings.Contains(string(out), gone) {
			t.Fatalf("a chain of %s left after the stale chains' deletion:\n%s", gone, out)
		}
	}
	if !strings.Contains(string(out), "10.244.0.5/8080") {
		t.Fatalf("no chain of 10.244.0.5 after the syncs:\n%s", out)
	}
	for _, l := range p.logged() {
		if strings.Contains(l, "stale chains") && strings.Contains(l, "level=ERROR") {
			t.Fatalf("a deletion failed: %s", l)
		}
	}
	p.stop()
	c := startSluice(t, "--cleanup")
	for range c.lines {
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("--cleanup: %v", err)
	}
	out, _ = exec.Command("nft", "list", "tables").CombinedOutput()
	if strings.Contains(string(out), "kube-proxy") || !strings.Contains(string(out), "someone-elses") {
		t.Fatalf("nft tables after --cleanup (want kube-proxy's gone, someone-elses kept):\n%s", out)
	}
}

// The Netlink kernel against real IPVS: detection with every scheduler,
// and a reconcile read back, then cleaned up.
func TestIPVSKernelForReal(t *testing.T) {
	k, err := ipvs.NewNetlink()
	must(t, err)
	defer k.Close()
	for _, s := range []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"} {
		if err := ipvs.Detect(k, s); err != nil {
			t.Errorf("scheduler %s: %v", s, err)
		}
	}
	sp := &lb.ServicePort{Name: lb.ServicePortName{Namespace: "ns", Name: "web", Protocol: lb.SCTP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.9.9")}, Port: 9000,
		Affinity:  lb.Affinity{ClientIP: true, Timeout: 600e9},
		Endpoints: []lb.Endpoint{{Addr: lb.EndpointAddrOf(netip.MustParseAddrPort("10.244.9.1:9000")), Ready: true, Serving: true}}}
	p := &ipvs.Proxier{Kernel: k, Options: ipvs.Options{Scheduler: "sh"}}
	if _, err := p.Sync(lb.NewSnapshot(map[lb.ServicePortName]*lb.ServicePort{sp.Name: sp})); err != nil {
		t.Fatal(err)
	}
	svcs, err := k.Services()
	must(t, err)
	if len(svcs) != 1 || svcs[0].Scheduler != "sh" || svcs[0].Flags&ipvs.FlagPersistent == 0 || svcs[0].Timeout != 600 || svcs[0].Proto != lb.SCTP {
		t.Fatalf("read back %+v", svcs)
	}
	reals, err := k.Reals(svcs[0].Key)
	if err != nil || len(reals) != 1 || reals[0].Weight != 1 {
		t.Fatalf("reals %+v %v", reals, err)
	}
	// One handle used by several goroutines at once, as IPVS mode's sync
	// and drain check do: every request gets its own answer and none
	// waits forever for one another goroutine took.
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 300; i++ {
				if s, err := k.Services(); err != nil || len(s) != 1 {
					errs <- fmt.Errorf("services %+v: %v", s, err)
					return
				}
				if r, err := k.Reals(svcs[0].Key); err != nil || len(r) != 1 {
					errs <- fmt.Errorf("reals %+v: %v", r, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		select {
		case err := <-errs:
			must(t, err)
		case <-time.After(60 * time.Second): // a safety net: a lost reply waits forever
			t.Fatal("concurrent requests on one IPVS handle: no answer in 60 s")
		}
	}
	must(t, ipvs.Cleanup(k, nil))
	if svcs, _ := k.Services(); len(svcs) != 0 {
		t.Fatalf("after cleanup: %+v", svcs)
	}
}

const ipvsManifest = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: vm}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, nodePort: 30080, protocol: TCP}
  - {name: dns, port: 53, nodePort: 30053, protocol: UDP}
  - {name: sig, port: 9000, nodePort: 30090, protocol: SCTP}
  - {name: src, port: 81, nodePort: 30081, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: vm, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 8080, protocol: UDP}
- {name: sig, port: 8080, protocol: SCTP}
- {name: src, port: 8081, protocol: TCP}
endpoints:
- addresses: [10.244.0.5]
- addresses: [ENDPOINT2]
---
apiVersion: v1
kind: Service
metadata: {name: hold, namespace: vm}
spec:
  clusterIP: 10.96.0.12
  ports: [{name: hold, port: 82, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: hold-1, namespace: vm, labels: {kubernetes.io/service-name: hold}}
addressType: IPv4
ports: [{name: hold, port: 8082, protocol: TCP}]
endpoints:
- addresses: [10.244.0.5]
- addresses: [HOLD2]
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: vm}
spec:
  clusterIP: 10.96.0.11
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-1, namespace: vm, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.0.5]
- addresses: [10.244.0.6]
`

const lbManifest = `apiVersion: v1
kind: Service
metadata: {name: guarded, namespace: vm}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.13
  loadBalancerSourceRanges: [RANGE]
  ports: [{name: http, port: 80, nodePort: 30100, protocol: TCP}]
status:
  loadBalancer: {ingress: [{ip: 203.0.113.20}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: guarded-1, namespace: vm, labels: {kubernetes.io/service-name: guarded}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.0.5]
- addresses: [10.244.0.6]
`

func both(t *testing.T, what string, m map[string]int) {
	t.Helper()
	if len(m) != 2 || m["b@10.244.0.5"] == 0 || m["b@10.244.0.6"] == 0 {
		t.Fatalf("%s: %v, want both backends", what, m)
	}
}

func TestIPVSModeInVM(t *testing.T) {
	b := newBed(t)
	b.backends("b", 8080, "10.244.0.5", "10.244.0.6")
	k, err := ipvs.NewNetlink()
	must(t, err)
	defer k.Close()
	foreign := ipvs.Service{Key: ipvs.Key{Addr: netip.MustParseAddr("172.30.0.1"), Port: 443, Proto: lb.TCP}, Scheduler: "wrr"}
	must(t, k.AddService(foreign))

	dir := t.TempDir()
	full := strings.NewReplacer("ENDPOINT2", "10.244.0.6", "HOLD2", "10.244.0.6").Replace(ipvsManifest)
	sh(t, dir, "svc.yaml", full)
	sh(t, dir, "lb.yaml", strings.Replace(lbManifest, "RANGE", "192.168.10.0/24", 1))
	args := []string{"--proxy-mode=ipvs", "--manifests", dir, "--healthz-bind-address=", "--metrics-bind-address=",
		"--iptables-backend=legacy", "--cluster-cidr=10.244.0.0/16",
		"--ipvs-sync-period=1s", "--ipvs-drain-interval=1s", "--ipvs-exclude-cidrs=172.30.0.0/16", "--ipvs-udp-timeout=7s", "--ipvs-tcpfin-timeout=9s", "--ipvs-strict-arp"}
	p := startSluice(t, args...)
	p.waitLog("IPVS mode", "scheduler=rr")
	p.waitLog("state applied")
	if _, fin, udp, err := k.Timeouts(); err != nil || fin != 9*time.Second || udp != 7*time.Second {
		t.Fatalf("IPVS timeouts: tcpfin %s udp %s (%v), want 9s and 7s", fin, udp, err)
	}
	for sysctl, want := range map[string]string{"net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2", "net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1"} {
		if got, _ := os.ReadFile("/proc/sys/" + sysctl); strings.TrimSpace(string(got)) != want {
			t.Errorf("%s = %q, want %s", sysctl, got, want)
		}
	}

	both(t, "ClusterIP TCP", b.tally("tcp", "10.96.0.10:80", 10))
	both(t, "ClusterIP UDP", b.tally("udp", "10.96.0.10:53", 10))
	both(t, "ClusterIP SCTP", b.tally("sctp", "10.96.0.10:9000", 6))
	both(t, "NodePort TCP", b.tally("tcp", "192.168.10.1:30080", 10))
	both(t, "NodePort SCTP", b.tally("sctp", "192.168.10.1:30090", 6))
	if m := b.tally("tcp", "10.96.0.11:80", 10); len(m) != 1 || m["error"] > 0 {
		t.Fatalf("ClientIP persistence: %v, want one backend", m)
	}
	// loadBalancerSourceRanges: the client's range is admitted to the LB
	// IP; once the range excludes it, its connections are dropped.
	both(t, "LB IP from an allowed source", b.tally("tcp", "203.0.113.20:80", 10))
	sh(t, dir, "lb.yaml", strings.Replace(lbManifest, "RANGE", "10.0.0.0/8", 1))
	p.waitLog("state applied", "vm/guarded:http")
	if got := b.askWithin("tcp", "203.0.113.20:80", 3*time.Second); !strings.Contains(got, "timeout") {
		t.Fatalf("LB IP from a source outside the ranges: %q, want a timeout (dropped)", got)
	}
	sh(t, dir, "lb.yaml", strings.Replace(lbManifest, "RANGE", "192.168.10.0/24", 1))
	p.waitLog("state applied", "vm/guarded:http")

	// Masquerade (ipsets + iptables): the client is outside --cluster-cidr,
	// so backends see the node's address, through the ClusterIP and the
	// NodePort alike.
	for _, a := range []string{"10.96.0.10:81", "192.168.10.1:30081"} {
		if m := b.tally("tcp", a, 4); m["10.244.0.1"] != 4 {
			out, _ := exec.Command("iptables-legacy-save").CombinedOutput()
			sets, _ := exec.Command("ipset", "list").CombinedOutput()
			t.Logf("iptables:\n%s\nipsets:\n%s", out, sets)
			t.Fatalf("source seen by the backends via %s: %v, want the node's 10.244.0.1 (masqueraded)", a, m)
		}
	}
	ipvs0, err := netlink.LinkByName("kube-ipvs0")
	must(t, err)
	addrs, _ := netlink.AddrList(ipvs0, netlink.FAMILY_V4)
	var bound []string
	for _, a := range addrs {
		bound = append(bound, a.IP.String())
	}
	if !slices.Contains(bound, "10.96.0.10") || !slices.Contains(bound, "10.96.0.11") {
		t.Fatalf("kube-ipvs0 holds %v", bound)
	}

	// Graceful termination: the tallies above left connections of both
	// real servers in IPVS's table (closing, TIME_WAIT), so a removed one
	// is quiesced (weight 0) while they drain, not deleted; new
	// connections skip it; when it comes back it has weight 1 again.
	key := ipvs.Key{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: lb.TCP}
	sh(t, dir, "svc.yaml", strings.NewReplacer("- addresses: [ENDPOINT2]\n", "", "HOLD2", "10.244.0.6").Replace(ipvsManifest))
	p.waitLog("state applied", "vm/web:http")
	weight := func() (int, []ipvs.Real) {
		reals, err := k.Reals(key)
		must(t, err)
		for _, r := range reals {
			if r.Addr.Addr().String() == "10.244.0.6" {
				return r.Weight, reals
			}
		}
		return -1, reals
	}
	if w, reals := weight(); w != 0 {
		t.Fatalf("removed real server with connections: weight %d, want 0 (kept while draining): %+v", w, reals)
	}
	if m := b.tally("tcp", "10.96.0.10:80", 6); m["b@10.244.0.5"] != 6 {
		t.Fatalf("after removal: %v, want only 10.244.0.5", m)
	}
	sh(t, dir, "svc.yaml", full)
	p.waitLog("state applied", "vm/web:http")
	if w, reals := weight(); w != 1 {
		t.Fatalf("returned real server: weight %d, want 1: %+v", w, reals)
	}
	both(t, "ClusterIP TCP after the endpoint came back", b.tally("tcp", "10.96.0.10:80", 10))

	// ... and is deleted once its last connection is gone: hold one
	// connection to each endpoint of a quiet service, remove one
	// endpoint, reset its connection (IPVS's CLOSE state lasts 10 s), and
	// the drain check deletes it.
	holdKey := ipvs.Key{Addr: netip.MustParseAddr("10.96.0.12"), Port: 82, Proto: lb.TCP}
	c1, n1 := b.holdTCP("10.96.0.12:82")
	c2, n2 := b.holdTCP("10.96.0.12:82")
	defer c1.Close()
	defer c2.Close()
	conn6 := c1
	if n2 == "b@10.244.0.6" {
		conn6 = c2
	} else if n1 != "b@10.244.0.6" {
		t.Fatalf("held connections went to %s and %s, want both endpoints", n1, n2)
	}
	sh(t, dir, "svc.yaml", strings.NewReplacer("ENDPOINT2", "10.244.0.6", "- addresses: [HOLD2]\n", "").Replace(ipvsManifest))
	p.waitLog("state applied", "vm/hold:hold")
	reals, err := k.Reals(holdKey)
	must(t, err)
	if len(reals) != 2 {
		t.Fatalf("hold service right after the removal: %+v, want the removed one kept at weight 0", reals)
	}
	conn6.SetLinger(0)
	conn6.Close() // RST
	p.waitLog("IPVS: drained real servers deleted")
	if reals, _ := k.Reals(holdKey); len(reals) != 1 || reals[0].Addr.Addr().String() != "10.244.0.5" {
		t.Fatalf("after the drain: %+v, want only 10.244.0.5", reals)
	}

	// A restart (issue 14) under traffic: the successor takes the
	// running one's sockets and retires it; the virtual servers stay in
	// the kernel throughout, and no connection through them fails.
	during := make(chan map[string]int, 1)
	go func() { during <- b.tally("tcp", "10.96.0.10:80", 40) }()
	next := startSluice(t, args...)
	next.waitLog("hand-over: the previous sluice retires")
	if m := <-during; m["error"] > 0 {
		t.Fatalf("ClusterIP TCP across a restart: %v, want no error", m)
	}
	both(t, "ClusterIP TCP after a restart", b.tally("tcp", "10.96.0.10:80", 10))
	next.stop()

	// The scheduler flag reaches the kernel.
	p2 := startSluice(t, append(args, "--ipvs-scheduler=sh")...)
	p2.waitLog("IPVS mode", "scheduler=sh")
	p2.waitLog("state applied")
	svcs, err := k.Services()
	must(t, err)
	for _, s := range svcs {
		if s.Key != foreign.Key && s.Scheduler != "sh" {
			t.Fatalf("virtual server %s has scheduler %s, want sh", s.Key, s.Scheduler)
		}
	}
	if m := b.tally("tcp", "10.96.0.10:80", 6); len(m) != 1 || m["error"] > 0 {
		t.Fatalf("sh scheduler: %v, want one backend for one client", m)
	}
	p2.stop()

	// --cleanup removes sluice's virtual servers and kube-ipvs0, twice;
	// the excluded one stays.
	for i := 0; i < 2; i++ {
		c := startSluice(t, "--cleanup", "--ipvs-exclude-cidrs=172.30.0.0/16", "--iptables-backend=legacy")
		for range c.lines {
		}
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("--cleanup #%d: %v", i+1, err)
		}
	}
	svcs, _ = k.Services()
	if len(svcs) != 1 || svcs[0].Key != foreign.Key {
		t.Fatalf("after --cleanup: %+v, want only the excluded one", svcs)
	}
	if out, err := exec.Command("ipset", "list", "-n").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("ipsets after --cleanup: %q %v", out, err)
	}
	if left := ourIPTablesRules(); len(left) > 0 {
		t.Fatalf("iptables rules after --cleanup:\n%s", strings.Join(left, "\n"))
	}
	if _, err := netlink.LinkByName("kube-ipvs0"); err == nil {
		t.Fatal("kube-ipvs0 left after --cleanup")
	}
	k.DeleteService(foreign.Key)
}

const sctpManifest = `apiVersion: v1
kind: Service
metadata: {name: sig, namespace: vm}
spec:
  type: NodePort
  clusterIP: 10.96.0.20
  ports: [{name: sig, port: 9000, nodePort: 30091, protocol: SCTP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sig-1, namespace: vm, labels: {kubernetes.io/service-name: sig}}
addressType: IPv4
ports: [{name: sig, port: 8080, protocol: SCTP}]
endpoints:
- addresses: [10.244.0.5]
- addresses: [10.244.0.6]
- addresses: [10.244.0.7]
---
apiVersion: v1
kind: Service
metadata: {name: sticky-sig, namespace: vm}
spec:
  type: NodePort
  clusterIP: 10.96.0.21
  sessionAffinity: ClientIP
  ports: [{name: sig, port: 9000, nodePort: 30092, protocol: SCTP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-sig-1, namespace: vm, labels: {kubernetes.io/service-name: sticky-sig}}
addressType: IPv4
ports: [{name: sig, port: 8080, protocol: SCTP}]
endpoints:
- addresses: [10.244.0.5]
- addresses: [10.244.0.6]
`

// Userspace SCTP: round robin over the live endpoints while a black-holed
// one (10.244.0.7: no host has it) is retried past with no client error,
// and ClientIP affinity.
func TestUserspaceSCTPInVM(t *testing.T) {
	b := newBed(t)
	b.backends("b", 8080, "10.244.0.5", "10.244.0.6")
	dir := t.TempDir()
	sh(t, dir, "svc.yaml", sctpManifest)
	p := startSluice(t, "--proxy-mode=userspace", "--engine=goroutine", "--userspace-capture=none", "--manifests", dir,
		"--healthz-bind-address=", "--metrics-bind-address=", "--connect-timeouts=300ms", "--eject-after=1")
	p.waitLog("state applied")
	m := b.tally("sctp", "192.168.10.1:30091", 9)
	if m["error"] > 0 || m["b@10.244.0.5"] == 0 || m["b@10.244.0.6"] == 0 {
		t.Fatalf("SCTP round robin past a dead endpoint: %v, want both live backends and no error", m)
	}
	if m := b.tally("sctp", "192.168.10.1:30092", 6); len(m) != 1 || m["error"] > 0 {
		t.Fatalf("SCTP ClientIP affinity: %v, want one backend", m)
	}
	// A restart under traffic (issue 14): the SCTP listening sockets are
	// handed over with the others; no association is refused.
	args := []string{"--proxy-mode=userspace", "--engine=goroutine", "--userspace-capture=none", "--manifests", dir,
		"--healthz-bind-address=", "--metrics-bind-address=", "--connect-timeouts=300ms", "--eject-after=1"}
	during := make(chan map[string]int, 1)
	go func() { during <- b.tally("sctp", "192.168.10.1:30091", 30) }()
	next := startSluice(t, args...)
	// Every listener opened at once, SCTP's on the handed-over socket (a
	// fresh bind would fail while the old process holds the port, and the
	// state would be "not applied in full").
	next.waitLog("state applied")
	next.waitLog("hand-over: the previous sluice retires")
	if m := <-during; m["error"] > 0 {
		t.Fatalf("SCTP across a restart: %v, want no error", m)
	}
	if m := b.tally("sctp", "192.168.10.1:30091", 6); m["error"] > 0 {
		t.Fatalf("SCTP after the restart: %v", m)
	}
	next.stop()
}

// Without the scheduler's module (and no modprobe to load it), IPVS mode
// falls back to iptables mode and says why; --mode-fallback=false refuses.
func TestIPVSFallbackInVM(t *testing.T) {
	if out, err := exec.Command("rmmod", "ip_vs_mh").CombinedOutput(); err != nil {
		t.Fatalf("rmmod ip_vs_mh: %v %s", err, out)
	}
	b := newBed(t)
	b.backends("b", 8080, "10.244.0.5", "10.244.0.6")
	dir := t.TempDir()
	sh(t, dir, "svc.yaml", strings.NewReplacer("ENDPOINT2", "10.244.0.6", "HOLD2", "10.244.0.6").Replace(ipvsManifest))
	base := []string{"--proxy-mode=ipvs", "--ipvs-scheduler=mh", "--manifests", dir, "--healthz-bind-address=", "--metrics-bind-address=",
		"--iptables-backend=legacy", "--cluster-cidr=10.244.0.0/16"}
	hard := startSluice(t, append(base, "--mode-fallback=false")...)
	for range hard.lines { // read it all before Wait, as os/exec requires
	}
	werr := hard.cmd.Wait()
	if werr == nil {
		t.Fatal("--mode-fallback=false started without the scheduler")
	}
	hard.mu.Lock()
	out := strings.Join(hard.all, "\n")
	hard.mu.Unlock()
	if !strings.Contains(out, "IPVS is not available") || !strings.Contains(out, "ip_vs_mh") {
		t.Fatalf("refusal does not say why (%v):\n%s", werr, out)
	}
	p := startSluice(t, base...)
	p.waitLog("proxy mode ipvs is unavailable; falling back to iptables mode", "ip_vs_mh")
	p.waitLog("state applied")
	both(t, "after the fallback, ClusterIP TCP", b.tally("tcp", "10.96.0.10:80", 30)) // iptables mode picks at random
	both(t, "after the fallback, ClusterIP UDP", b.tally("udp", "10.96.0.10:53", 30)) // iptables mode picks at random
	p.stop()
	c := startSluice(t, "--cleanup", "--iptables-backend=legacy")
	for range c.lines {
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("--cleanup: %v", err)
	}
}
