//go:build linux

package harness

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Service is one frontend every system serves: the userspace load
// balancers on the topology's LB address and Port, the kernel modes on
// ClusterIP:80.
type Service struct {
	Name      string
	UDP       bool
	Affinity  bool // ClientIP affinity (or the peer's nearest: balance source, hash $remote_addr)
	Backends  []netip.AddrPort
	Port      uint16
	ClusterIP netip.Addr
}

// System is one load balancer (or none) under test.
type System interface {
	Name() string
	// Peer reports whether it is a third-party peer (for "best peer" ratios).
	Peer() bool
	// Supports reports whether it can serve s at all; "n/a" otherwise.
	Supports(s Service) bool
	// Start serves svcs in t; dir is its private scratch directory. A nil
	// Proc means nothing runs (direct).
	Start(t *Topology, dir string, svcs []Service, at Place) (*Proc, error)
}

// kernelMode is a system whose data path is the kernel's: its process is
// only the control plane, so the process's CPU and memory say nothing of
// the forwarding cost (see the host CPU column).
type kernelMode interface{ kernel() }

// IsKernelMode reports whether sys forwards in the kernel.
func IsKernelMode(sys System) bool {
	_, ok := sys.(kernelMode)
	return ok
}

// Config names the binaries the systems need.
type Config struct {
	Sluice string // path to bin/sluice
	Self   string // path to this harness binary (for the naive proxy)
	// IPTablesBackend is passed to the kernel modes as --iptables-backend
	// (empty: sluice's own detection).
	IPTablesBackend string
	// SluiceBase, when set, is an earlier sluice binary run beside the
	// current one as sluice-eventloop-base (and, when named,
	// sluice-goroutine-base), so a change to an engine is measured before
	// and after in the same run.
	SluiceBase string
}

// Systems returns every system t can run, in report order: the kernel
// modes only in the namespace topology.
func Systems(c Config, t *Topology) []System {
	all := []System{
		direct{},
		sluice{bin: c.Sluice, engine: "eventloop"},
		sluice{bin: c.Sluice, engine: "goroutine"},
	}
	if c.SluiceBase != "" {
		all = append(all, sluice{bin: c.SluiceBase, engine: "eventloop", suffix: "-base"},
			sluice{bin: c.SluiceBase, engine: "goroutine", suffix: "-base"})
	}
	if t != nil {
		for _, mode := range t.KernelModes() {
			all = append(all, sluiceKernel{bin: c.Sluice, mode: mode, backend: c.IPTablesBackend})
		}
	} else { // report order for re-rendering
		all = append(all, sluiceKernel{mode: "iptables"}, sluiceKernel{mode: "nftables"}, sluiceKernel{mode: "ipvs"})
	}
	all = append(all, naive{self: c.Self}, haproxy{}, haproxy{splice: true}, nginx{})
	// Busy-polling trades a core for latency, one loop leaves a core to
	// the load generator and backends on a small box, the C floor is a
	// reference rather than a product, and the event loop without io_uring
	// measures what batching on it brings: run only when named.
	return append(all, sluice{bin: c.Sluice, engine: "eventloop", suffix: "-busypoll", args: []string{"--busy-poll=50us"}}, haproxy{busyPoll: true},
		sluice{bin: c.Sluice, engine: "eventloop", suffix: "-1loop", args: []string{"--event-loops=1"}}, haproxy{oneThread: true},
		sluice{bin: c.Sluice, engine: "eventloop", suffix: "-no-io-uring", args: []string{"--io-uring=false"}},
		floor{}, floor{oneThread: true})
}

// Spins reports whether a system keeps a CPU busy while it has nothing to
// do (HAProxy's busy-polling spins for good; sluice's --busy-poll for a
// while after each event): the run pauses it while it is not measured, so
// it takes no core from the others.
func Spins(name string) bool { return strings.HasSuffix(name, "-busypoll") }

// OptIn reports whether a system runs only when --systems names it.
func OptIn(name string) bool {
	return strings.HasSuffix(name, "-busypoll") || strings.HasSuffix(name, "-1loop") || strings.HasSuffix(name, "-1thread") || strings.HasSuffix(name, "-no-io-uring") ||
		strings.HasPrefix(name, "floor-") || name == "sluice-goroutine-base"
}

type direct struct{}

func (direct) Name() string                                             { return "direct" }
func (direct) Peer() bool                                               { return false }
func (direct) Supports(s Service) bool                                  { return !s.Affinity }
func (direct) Start(*Topology, string, []Service, Place) (*Proc, error) { return nil, nil }

// manifests renders svcs as Kubernetes Services and EndpointSlices for
// sluice's --manifests: NodePort Services on each Port for the userspace
// engines, ClusterIP-only ones for the kernel modes (whose rules must not
// catch the other systems' ports in the shared node namespace).
func manifests(svcs []Service, nodePorts bool) string {
	var m strings.Builder
	for _, svc := range svcs {
		proto := "TCP"
		if svc.UDP {
			proto = "UDP"
		}
		aff := ""
		if svc.Affinity {
			aff = "\n  sessionAffinity: ClientIP"
		}
		typ, nodePort := "ClusterIP", ""
		if nodePorts {
			typ, nodePort = "NodePort", fmt.Sprintf(", nodePort: %d", svc.Port)
		}
		fmt.Fprintf(&m, "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: bench}\nspec:\n  type: %s\n  clusterIP: %s%s\n  ports: [{name: p, port: 80, protocol: %s%s}]\n---\n",
			svc.Name, typ, svc.ClusterIP, aff, proto, nodePort)
		for j, b := range svc.Backends {
			fmt.Fprintf(&m, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s-%d, namespace: bench, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{name: p, port: %d, protocol: %s}]\nendpoints: [{addresses: [%q]}]\n---\n",
				svc.Name, j, svc.Name, b.Port(), proto, b.Addr())
		}
	}
	return m.String()
}

type sluice struct {
	bin, engine, suffix string
	args                []string // extra flags
}

func (s sluice) Name() string        { return "sluice-" + s.engine + s.suffix }
func (sluice) Peer() bool            { return false }
func (sluice) Supports(Service) bool { return true }

// restart starts a second sluice with the same command line: it takes
// the running one's sockets and retires it (the hitless restart).
func (s sluice) restart(in *Instance) (*Proc, error) {
	next, err := in.Proc.again()
	if err != nil {
		return nil, err
	}
	if !next.WaitFor(10*time.Second, func() bool { return strings.Contains(next.Output(), "the previous sluice retires") }) {
		next.Stop(5 * time.Second)
		return nil, fmt.Errorf("no hand-over in 10 s: %s", next.Output())
	}
	return next, nil
}

func (s sluice) Start(t *Topology, dir string, svcs []Service, at Place) (*Proc, error) {
	file := filepath.Join(dir, "services.yaml")
	if err := os.WriteFile(file, []byte(manifests(svcs, true)), 0o644); err != nil {
		return nil, err
	}
	argv := append([]string{s.bin, "--manifests", file, "--engine", s.engine, "--userspace-capture=none",
		"--bind-address", t.LB.String(), "--healthz-bind-address=", "--metrics-bind-address=",
		"--connect-timeouts", "250ms", "--connect-attempts", "3", "--udp-timeout", "1s"}, s.args...)
	return StartProc(s.Name(), at, t.InNode(argv...)...)
}

// sluiceKernel is sluice in a kernel mode: it programs its own node
// namespace (netfilter, IPVS) and the kernel forwards (ClusterIP, no
// masquerade: the backends route replies back through that node).
type sluiceKernel struct{ bin, mode, backend string }

func (s sluiceKernel) Name() string        { return "sluice-" + s.mode }
func (sluiceKernel) Peer() bool            { return false }
func (sluiceKernel) Supports(Service) bool { return true }
func (sluiceKernel) kernel()               {}
func (s sluiceKernel) Start(t *Topology, dir string, svcs []Service, at Place) (*Proc, error) {
	if _, ok := t.kernelNode(s.mode); !ok {
		return nil, fmt.Errorf("%s needs --topology netns (a node namespace of its own)", s.Name())
	}
	// A directory: the churn workloads add their services beside these.
	mdir := filepath.Join(dir, "manifests")
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(mdir, "services.yaml"), []byte(manifests(svcs, false)), 0o644); err != nil {
		return nil, err
	}
	// No fallback: a sluice-ipvs that quietly ran iptables mode would
	// report the wrong mode's numbers.
	args := []string{s.bin, "--proxy-mode", s.mode, "--mode-fallback=false", "--manifests", mdir,
		"--healthz-bind-address=", "--metrics-bind-address=", "--iptables-min-sync-period=0", "--ipvs-min-sync-period=0", "--manifest-coalesce", "1ms"}
	if s.backend != "" {
		args = append(args, "--iptables-backend", s.backend)
	}
	return StartProc(s.Name(), at, t.InKernelNode(s.mode, args...)...)
}

// naive is the baseline: a goroutine pair and io.Copy per connection, as
// legacy kube-proxy and most Go L4 proxies do (run by this harness binary).
type naive struct{ self string }

func (naive) Name() string            { return "naive-go" }
func (naive) Peer() bool              { return true }
func (naive) Supports(s Service) bool { return !s.UDP && !s.Affinity }
func (n naive) Start(t *Topology, _ string, svcs []Service, at Place) (*Proc, error) {
	args := []string{n.self, "naive-proxy"}
	for _, s := range svcs {
		if !n.Supports(s) {
			continue
		}
		var bs []string
		for _, b := range s.Backends {
			bs = append(bs, b.String())
		}
		args = append(args, fmt.Sprintf("%s=%s", netip.AddrPortFrom(t.LB, s.Port), strings.Join(bs, ",")))
	}
	return StartProc(n.Name(), at, t.InNode(args...)...)
}

type haproxy struct {
	splice    bool
	busyPoll  bool // HAProxy's global busy-polling
	oneThread bool // nbthread 1, beside sluice-eventloop-1loop
	maxconn   int  // 0: proxiedConnLimit()
}

func (h haproxy) Name() string {
	switch {
	case h.splice:
		return "haproxy-splice"
	case h.busyPoll:
		return "haproxy-busypoll"
	case h.oneThread:
		return "haproxy-1thread"
	}
	return "haproxy"
}
func (haproxy) Peer() bool              { return true }
func (haproxy) Supports(s Service) bool { return !s.UDP } // no UDP in HAProxy OSS
func (h haproxy) Start(t *Topology, dir string, svcs []Service, at Place) (*Proc, error) {
	if _, err := exec.LookPath("haproxy"); err != nil {
		return nil, fmt.Errorf("haproxy not installed (apt-get install haproxy)")
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	// The stats socket with expose-fd listeners is what HAProxy's seamless
	// reload (-x) takes the listening sockets from (the restart workload).
	conf := strings.Replace(h.config(t.LB, svcs), "global\n", fmt.Sprintf("global\n  stats socket %s mode 600 level admin expose-fd listeners\n", filepath.Join(dir, "haproxy.sock")), 1)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return StartProc(h.Name(), at, t.InNode("haproxy", "-f", cfg, "-db")...)
}

// restart is HAProxy's seamless reload as its users do it without the
// master-worker: a new process takes the listening sockets from the old
// one's stats socket (-x) and tells it to finish (-sf).
func (h haproxy) restart(in *Instance) (*Proc, error) {
	cfg, sock := filepath.Join(in.Dir, "haproxy.cfg"), filepath.Join(in.Dir, "haproxy.sock")
	old := in.Proc
	next, err := StartProc(h.Name(), old.at, in.Topo.InNode("haproxy", "-f", cfg, "-db", "-x", sock, "-sf", strconv.Itoa(old.PID()))...)
	if err != nil {
		return nil, err
	}
	return next, nil
}

// config is the HAProxy configuration: the same threads as sluice's loops
// (2), the same connect timeout (250ms), retries on another server, no
// active health checks.
func (h haproxy) config(lb netip.Addr, svcs []Service) string {
	var c strings.Builder
	maxconn := h.maxconn
	if maxconn == 0 {
		maxconn = min(25000, proxiedConnLimit())
	}
	threads := 2
	if h.oneThread {
		threads = 1
	}
	fmt.Fprintf(&c, "global\n  nbthread %d\n  maxconn %d\n", threads, maxconn)
	if h.busyPoll {
		c.WriteString("  busy-polling\n")
	}
	c.WriteString("defaults\n  mode tcp\n  timeout connect 250ms\n  timeout client 120s\n  timeout server 120s\n  retries 3\n  option redispatch 1\n")
	if h.splice {
		c.WriteString("  option splice-auto\n")
	}
	for _, s := range svcs {
		if !h.Supports(s) {
			continue
		}
		balance := "roundrobin"
		if s.Affinity {
			balance = "source"
		}
		fmt.Fprintf(&c, "listen %s\n  bind %s\n  balance %s\n", s.Name, netip.AddrPortFrom(lb, s.Port), balance)
		for i, b := range s.Backends {
			fmt.Fprintf(&c, "  server s%d %s\n", i, b)
		}
	}
	return c.String()
}

type nginx struct{}

func (nginx) Name() string          { return "nginx" }
func (nginx) Peer() bool            { return true }
func (nginx) Supports(Service) bool { return true }

// NginxStreamModule is where Debian's libnginx-mod-stream puts the module.
const NginxStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

func (n nginx) Start(t *Topology, dir string, svcs []Service, at Place) (*Proc, error) {
	if _, err := exec.LookPath("nginx"); err != nil {
		return nil, fmt.Errorf("nginx not installed (apt-get install nginx-light libnginx-mod-stream)")
	}
	if _, err := os.Stat(NginxStreamModule); err != nil {
		return nil, fmt.Errorf("nginx stream module missing (apt-get install libnginx-mod-stream)")
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(n.config(t.LB, dir, svcs)), 0o644); err != nil {
		return nil, err
	}
	return StartProc(n.Name(), at, t.InNode("nginx", "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")...)
}

// config is the nginx stream configuration: 2 workers (sluice's 2 loops),
// the same connect timeout, up to 3 tries, half-close forwarded.
func (nginx) config(lb netip.Addr, dir string, svcs []Service) string {
	var c strings.Builder
	fds := min(60000, FileLimit())
	fmt.Fprintf(&c, "load_module %s;\nworker_processes 2;\nworker_rlimit_nofile %d;\npid %s/nginx.pid;\nerror_log %s/error.log warn;\nevents { worker_connections %d; }\nstream {\n",
		NginxStreamModule, fds, dir, dir, fds-500)
	for _, s := range svcs {
		up := "u_" + strings.ReplaceAll(s.Name, "-", "_")
		fmt.Fprintf(&c, "  upstream %s {\n", up)
		if s.Affinity {
			c.WriteString("    hash $remote_addr consistent;\n")
		}
		for _, b := range s.Backends {
			fmt.Fprintf(&c, "    server %s;\n", b)
		}
		c.WriteString("  }\n  server {\n")
		if s.UDP {
			fmt.Fprintf(&c, "    listen %s udp reuseport;\n    proxy_timeout 1s;\n", netip.AddrPortFrom(lb, s.Port))
		} else {
			fmt.Fprintf(&c, "    listen %s reuseport;\n    proxy_timeout 120s;\n    proxy_half_close on;\n", netip.AddrPortFrom(lb, s.Port))
		}
		fmt.Fprintf(&c, "    proxy_pass %s;\n    proxy_connect_timeout 250ms;\n    proxy_next_upstream on;\n    proxy_next_upstream_tries 3;\n  }\n", up)
	}
	c.WriteString("}\n")
	return c.String()
}

// Instance is a started system with its services.
type Instance struct {
	System   System
	Proc     *Proc
	Services map[string]Service
	Topo     *Topology
	Dir      string // the system's scratch directory

	shared   *sharedBeds
	launched []Service // as given to Launch, for another instance (capped)
	at       Place
}

// sharedBeds are test beds that a run starts once, lazily, for all its
// rounds, and stops at its end.
type sharedBeds struct {
	api     apiBed
	cgroups cgroupMount
}

// close stops the beds; the instances (whose cgroups live in the mount)
// are stopped first.
func (b *sharedBeds) close() {
	b.api.close()
	b.cgroups.close()
}

// Addr is where a client reaches service name through this system.
func (in *Instance) Addr(name string) netip.AddrPort {
	s := in.Services[name]
	switch {
	case in.Proc == nil:
		return s.Backends[len(s.Backends)-1] // direct: the last backend is always a good one
	case IsKernelMode(in.System):
		return netip.AddrPortFrom(s.ClusterIP, 80) // Launch gave it the mode's range
	}
	return netip.AddrPortFrom(in.Topo.LB, s.Port)
}

// Usage is the system's CPU time and memory now (its whole process group).
func (in *Instance) Usage() Usage {
	if in.Proc == nil {
		return Usage{}
	}
	return GroupUsage(in.Proc.PID())
}

// Sockets is how many sockets the system's processes hold.
func (in *Instance) Sockets() int {
	if in.Proc == nil {
		return 0
	}
	return GroupSockets(in.Proc.PID())
}

// Launch starts sys in t on fresh ports for svcs and waits until every
// TCP frontend accepts connections.
func Launch(sys System, t *Topology, dir string, svcs []Service, at Place) (*Instance, error) {
	in := &Instance{System: sys, Services: map[string]Service{}, Topo: t, Dir: dir, launched: svcs, at: at}
	var served []Service
	for _, s := range svcs {
		if !sys.Supports(s) {
			continue
		}
		p, err := t.FreePort(map[bool]string{true: "udp", false: "tcp"}[s.UDP])
		if err != nil {
			return nil, err
		}
		s.Port = p
		if k, ok := sys.(sluiceKernel); ok {
			s.ClusterIP = t.ClusterIP(k.mode, 0, len(served))
		}
		in.Services[s.Name] = s
		served = append(served, s)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	proc, err := sys.Start(t, dir, served, at)
	if err != nil {
		return nil, err
	}
	in.Proc = proc
	if proc == nil {
		return in, nil
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, s := range served {
		if s.UDP {
			continue
		}
		var err error
		if !proc.WaitFor(time.Until(deadline), func() bool { err = dialOnce(in.Addr(s.Name)); return err == nil }) {
			proc.Stop(time.Second)
			return nil, fmt.Errorf("%s did not come up on %s: %v\n%s", sys.Name(), in.Addr(s.Name), err, proc.Output())
		}
	}
	return in, nil
}

// dialOnce opens and closes one TCP connection to a.
func dialOnce(a netip.AddrPort) error {
	c, err := net.DialTimeout("tcp", a.String(), time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// Stop stops the system's process.
func (in *Instance) Stop() {
	if in.Proc != nil {
		in.Proc.Stop(5 * time.Second)
	}
}
