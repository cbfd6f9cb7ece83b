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
// "netns" (root): three private network namespaces joined by veth pairs,
// client (this harness and its load generators) - node (every load
// balancer, sluice's kernel modes included) - backend (the backends). The
// node routes between the two links; nothing has a route out of the
// machine, and the machine's own namespace is never touched. Every system
// is measured across the same two hops.
type Topology struct {
	Name string
	// LB is the address the userspace load balancers listen on.
	LB netip.Addr
	// Backend is the address the backends listen on.
	Backend netip.Addr
	// Sources are client source addresses (the affinity workload).
	Sources []netip.Addr

	nodeNS, backendNS string // named namespaces; empty on loopback

	mu       sync.Mutex
	nextPort uint16
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
// node, 10.77.2.0/24 between node and backend. Service ClusterIPs
// (10.96.0.0/16) reach the node through the client's default route.
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
// namespace that SetupNetns made for prefix.
func InNetns(prefix string) *Topology {
	_, node, backend := NetnsNames(prefix)
	t := &Topology{Name: "netns", LB: netnsNodeC, Backend: netnsBackend, nodeNS: node, backendNS: backend, nextPort: 20000}
	for i := 0; i < affinitySources; i++ {
		t.Sources = append(t.Sources, netip.AddrFrom4([4]byte{10, 77, 1, byte(10 + i)}))
	}
	return t
}

// SetupNetns creates the namespace topology for prefix and returns a
// function that deletes it. Every link is created inside the namespaces
// (a veth's peer goes straight into its namespace), so the machine's own
// namespace never holds any of it, even for a moment.
func SetupNetns(prefix string) (cleanup func(), err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("--topology netns needs root (it creates network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("--topology netns needs ip (apt-get install iproute2)")
	}
	client, node, backend := NetnsNames(prefix)
	cleanup = func() {
		for _, ns := range []string{client, node, backend} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
	var cmds [][]string
	add := func(args string) { cmds = append(cmds, strings.Fields(args)) }
	for _, ns := range []string{client, node, backend} {
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
	for _, s := range InNetns(prefix).Sources {
		add(fmt.Sprintf("-n %s addr add %s/32 dev eth0", client, s))
	}
	add("-n " + client + " link set eth0 up")
	add(fmt.Sprintf("-n %s route add default via %s", client, netnsNodeC))
	add(fmt.Sprintf("-n %s addr add %s/24 dev eth0", backend, netnsBackend))
	add("-n " + backend + " link set eth0 up")
	add(fmt.Sprintf("-n %s route add default via %s", backend, netnsNodeB))
	for _, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			cleanup()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	// The node forwards between its links; the sysctl is the node
	// namespace's own.
	if out, err := exec.Command("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		cleanup()
		return nil, fmt.Errorf("ip_forward in %s: %v: %s", node, err, out)
	}
	return cleanup, nil
}

// InNode prefixes argv so that it runs in the node namespace.
func (t *Topology) InNode(argv ...string) []string {
	if t.nodeNS == "" {
		return argv
	}
	return append([]string{"ip", "netns", "exec", t.nodeNS}, argv...)
}

// InBackend prefixes argv so that it runs in the backend namespace.
func (t *Topology) InBackend(argv ...string) []string {
	if t.backendNS == "" {
		return argv
	}
	return append([]string{"ip", "netns", "exec", t.backendNS}, argv...)
}

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
