//go:build linux

package harness

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Topology says where the parts of a run live.
//
// "loopback" (the default; no privileges): the harness, every load
// balancer and the backends share the machine's loopback. The kernel modes
// cannot take part: their DNAT does not reach loopback endpoints.
//
// "netns" (root): private network namespaces joined by veth pairs, client
// (this harness and its load generators) - node (every userspace load
// balancer) - backend (the backends). Each kernel mode gets a node of its
// own, joined to the same client and backend namespaces by links of its
// own (two kernel modes in one namespace would fight over the same
// chains), and serves its own ClusterIP range, which the client routes to
// it; the backend routes replies to that client link back through it.
// The nodes route between their links; nothing has a route out of the
// machine, and the machine's own namespace is never touched. Every system
// is measured across the same two veth hops.
type Topology struct {
	Name string
	// LB is the address the userspace load balancers listen on.
	LB netip.Addr
	// Backend is the address the backends listen on.
	Backend netip.Addr
	// Sources are client source addresses (the affinity workload).
	Sources []netip.Addr

	nodeNS, backendNS string // named namespaces; empty on loopback
	// kernel holds each kernel mode's node, in order.
	kernel []kernelNode

	mu       sync.Mutex
	nextPort uint16
}

// kernelNode is the node namespace of one kernel mode.
type kernelNode struct {
	mode string
	ns   string
	net  byte // the mode's ClusterIPs are 10.<net>.0.0/16
	link byte // its links: 10.77.<link>.0/24 to the client, <link>+1 to the backend
}

// KernelModes lists the kernel modes that have a node.
func (t *Topology) KernelModes() []string {
	var out []string
	for _, k := range t.kernel {
		out = append(out, k.mode)
	}
	return out
}

func (t *Topology) kernelNode(mode string) (kernelNode, bool) {
	for _, k := range t.kernel {
		if k.mode == mode {
			return k, true
		}
	}
	return kernelNode{}, false
}

// ClusterIP is the address of the i-th service (from 0) in mode's range;
// sub picks a /24 inside it (0: the benchmark's services; others for the
// churn workloads).
func (t *Topology) ClusterIP(mode string, sub, i int) netip.Addr {
	k, _ := t.kernelNode(mode)
	return netip.AddrFrom4([4]byte{10, k.net, byte(sub + i/250), byte(i%250 + 1)})
}

// SourcesFor are the client source addresses for traffic to a system:
// those of the client's link to mode's node for a kernel mode (replies to
// them come back through that node, where its NAT is undone), Sources
// otherwise.
func (t *Topology) SourcesFor(mode string) []netip.Addr {
	k, ok := t.kernelNode(mode)
	if !ok {
		return t.Sources
	}
	var out []netip.Addr
	for i := 0; i < affinitySources; i++ {
		out = append(out, netip.AddrFrom4([4]byte{10, 77, k.link, byte(10 + i)}))
	}
	return out
}

// InKernelNode prefixes argv so that it runs in mode's node namespace.
func (t *Topology) InKernelNode(mode string, argv ...string) []string {
	k, _ := t.kernelNode(mode)
	return netnsExec(k.ns, argv)
}

// netnsExec prefixes argv with `ip netns exec ns` (none for "": loopback).
func netnsExec(ns string, argv []string) []string {
	if ns == "" {
		return argv
	}
	return append([]string{"ip", "netns", "exec", ns}, argv...)
}

// Netns reports whether the run uses the namespace topology.
func (t *Topology) Netns() bool { return t.nodeNS != "" }

// Loopback is the unprivileged topology.
func Loopback() *Topology {
	t := &Topology{Name: "loopback", LB: netip.MustParseAddr("127.0.0.1"), Backend: netip.MustParseAddr("127.0.0.1")}
	for i := 0; i < affinitySources; i++ {
		t.Sources = append(t.Sources, netip.AddrFrom4([4]byte{127, 0, byte(1 + i/250), byte(2 + i%250)}))
	}
	return t
}

// affinitySources is how many client source addresses a topology offers.
const affinitySources = 64

// The namespace topology's addresses: 10.77.1.0/24 between client and
// node, 10.77.2.0/24 between node and backend; each kernel mode's links
// and ClusterIP range are in its kernelNode.
var (
	netnsClient  = netip.MustParseAddr("10.77.1.2")
	netnsNodeC   = netip.MustParseAddr("10.77.1.1")
	netnsNodeB   = netip.MustParseAddr("10.77.2.1")
	netnsBackend = netip.MustParseAddr("10.77.2.2")
)

// NetnsNames are the three namespace names for a run prefix.
func NetnsNames(prefix string) (client, node, backend string) {
	return prefix + "-client", prefix + "-node", prefix + "-backend"
}

// InNetns is the namespace topology, as seen from inside the client
// namespace that SetupNetns made for prefix and kernelModes.
func InNetns(prefix string, kernelModes ...string) *Topology {
	_, node, backend := NetnsNames(prefix)
	t := &Topology{Name: "netns", LB: netnsNodeC, Backend: netnsBackend, nodeNS: node, backendNS: backend, nextPort: 20000}
	for i := 0; i < affinitySources; i++ {
		t.Sources = append(t.Sources, netip.AddrFrom4([4]byte{10, 77, 1, byte(10 + i)}))
	}
	for j, mode := range kernelModes {
		t.kernel = append(t.kernel, kernelNode{mode: mode, ns: prefix + "-" + mode, net: byte(100 + j), link: byte(10 + 2*j)})
	}
	return t
}

// SetupNetns creates the namespace topology for prefix, with a node for
// each of kernelModes, and returns a function that deletes it. Every link
// is created inside the namespaces (a veth's peer goes straight into its
// namespace), so the machine's own namespace never holds any of it, even
// for a moment.
func SetupNetns(prefix string, kernelModes ...string) (cleanup func(), err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("--topology netns needs root (it creates network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("--topology netns needs ip (apt-get install iproute2)")
	}
	client, node, backend := NetnsNames(prefix)
	topo := InNetns(prefix, kernelModes...)
	all := []string{client, node, backend}
	for _, k := range topo.kernel {
		all = append(all, k.ns)
	}
	cleanup = func() {
		for _, ns := range all {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
	var cmds [][]string
	add := func(args string) { cmds = append(cmds, strings.Fields(args)) }
	for _, ns := range all {
		add("netns add " + ns)
		add("-n " + ns + " link set lo up")
	}
	add("-n " + node + " link add c0 type veth peer name eth0 netns " + client)
	add("-n " + node + " link add b0 type veth peer name eth0 netns " + backend)
	add(fmt.Sprintf("-n %s addr add %s/24 dev c0", node, netnsNodeC))
	add(fmt.Sprintf("-n %s addr add %s/24 dev b0", node, netnsNodeB))
	add("-n " + node + " link set c0 up")
	add("-n " + node + " link set b0 up")
	add(fmt.Sprintf("-n %s addr add %s/24 dev eth0", client, netnsClient))
	for _, s := range topo.Sources {
		add(fmt.Sprintf("-n %s addr add %s/32 dev eth0", client, s))
	}
	add("-n " + client + " link set eth0 up")
	add(fmt.Sprintf("-n %s route add default via %s", client, netnsNodeC))
	add(fmt.Sprintf("-n %s addr add %s/24 dev eth0", backend, netnsBackend))
	add("-n " + backend + " link set eth0 up")
	add(fmt.Sprintf("-n %s route add default via %s", backend, netnsNodeB))
	// Each kernel mode's node: links cN (client) and bN (backend), its
	// ClusterIP range routed to it by the client, and the client link's
	// subnet routed back through it by the backend.
	for j, k := range topo.kernel {
		cl, bl := fmt.Sprintf("10.77.%d", k.link), fmt.Sprintf("10.77.%d", k.link+1)
		dev := fmt.Sprintf("eth%d", j+1)
		add(fmt.Sprintf("-n %s link add c0 type veth peer name %s netns %s", k.ns, dev, client))
		add(fmt.Sprintf("-n %s link add b0 type veth peer name %s netns %s", k.ns, dev, backend))
		add(fmt.Sprintf("-n %s addr add %s.1/24 dev c0", k.ns, cl))
		add(fmt.Sprintf("-n %s addr add %s.1/24 dev b0", k.ns, bl))
		add("-n " + k.ns + " link set c0 up")
		add("-n " + k.ns + " link set b0 up")
		add(fmt.Sprintf("-n %s route add %s via %s.2", k.ns, netnsBackend, bl))
		add(fmt.Sprintf("-n %s addr add %s.2/24 dev %s", client, cl, dev))
		for _, src := range topo.SourcesFor(k.mode) {
			add(fmt.Sprintf("-n %s addr add %s/32 dev %s", client, src, dev))
		}
		add(fmt.Sprintf("-n %s link set %s up", client, dev))
		add(fmt.Sprintf("-n %s route add 10.%d.0.0/16 via %s.1", client, k.net, cl))
		add(fmt.Sprintf("-n %s addr add %s.2/24 dev %s", backend, bl, dev))
		add(fmt.Sprintf("-n %s link set %s up", backend, dev))
		add(fmt.Sprintf("-n %s route add %s.0/24 via %s.1", backend, cl, bl))
	}
	for _, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			cleanup()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	// The nodes forward between their links. Every namespace but the
	// backend's opens connections at a high rate (the clients, and the
	// proxies towards the backends), so TIME_WAIT ports are reused, as
	// loopback does by default (tcp_tw_reuse=2 covers loopback only);
	// without it the new-connection workload runs out of ports over veth.
	// The sysctls are each namespace's own.
	for _, ns := range all {
		if ns == backend {
			continue
		}
		settings := []string{"net.ipv4.tcp_tw_reuse=1"}
		if ns != client {
			settings = append(settings, "net.ipv4.ip_forward=1")
		}
		for _, kv := range settings {
			if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-w", kv).CombinedOutput(); err != nil {
				cleanup()
				return nil, fmt.Errorf("%s in %s: %v: %s", kv, ns, err, out)
			}
		}
	}
	return cleanup, nil
}

// InNode prefixes argv so that it runs in the node namespace.
func (t *Topology) InNode(argv ...string) []string { return netnsExec(t.nodeNS, argv) }

// InBackend prefixes argv so that it runs in the backend namespace.
func (t *Topology) InBackend(argv ...string) []string { return netnsExec(t.backendNS, argv) }

// inBackend runs fn with the calling thread in the backend namespace, so
// the sockets it creates live there (a socket keeps its namespace; the
// goroutines that serve it later may run on any thread).
func (t *Topology) inBackend(fn func() error) error {
	if t.backendNS == "" {
		return fn()
	}
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + t.backendNS)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter %s: %w", t.backendNS, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: it dies with its goroutine instead of
		// serving others from the wrong namespace.
		return fmt.Errorf("leave %s: %w", t.backendNS, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// FreePort returns a port for a frontend or a backend. On loopback it is
// one the kernel had free a moment ago; in the private namespaces,
// where every port is the harness's, ports are handed out in sequence.
func (t *Topology) FreePort(network string) (uint16, error) {
	if t.nodeNS != "" {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.nextPort == 0 || t.nextPort >= 32000 {
			return 0, fmt.Errorf("no free port left below the ephemeral range")
		}
		t.nextPort++
		return t.nextPort, nil
	}
	if network == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer pc.Close()
		return uint16(pc.LocalAddr().(*net.UDPAddr).Port), nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port), nil
}
