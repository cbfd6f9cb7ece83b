// Package ipvs owns sluice's IPVS mode: the virtual servers and real
// servers kube-proxy's IPVS mode would program, rendered from an
// lb.Snapshot as a pure function (Render), reconciled against the kernel
// through a small Kernel interface (netlink through moby/ipvs, or the
// stateful Fake), with graceful termination of removed TCP real servers
// and detection of whether IPVS really works (moby/ipvs reports no error
// when it does not).
package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-proxy/sluice/lb"
)

// IPVS service flags, as the kernel defines them.
const (
	FlagPersistent = 0x1
	FlagHashed     = 0x2
	FlagSourceHash = 0x10 // mh: hash on the source port too (kube-proxy sets it for mh)
)

// Schedulers are the schedulers kube-proxy accepts (plus mh).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh"}

// Key names a virtual server.
type Key struct {
	Addr  netip.Addr
	Port  uint16
	Proto lb.Protocol
}

func (k Key) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Proto)
}

// Service is a virtual server's settings.
type Service struct {
	Key
	Scheduler string
	Flags     uint32
	Timeout   uint32 // persistence, seconds
}

// Real is a real server of a virtual server.
type Real struct {
	Addr             netip.AddrPort
	Weight           int
	Active, Inactive int // connections, as the kernel counts them
}

// Kernel is what the IPVS mode needs of the kernel's IPVS table.
type Kernel interface {
	Services() ([]Service, error)
	AddService(Service) error
	UpdateService(Service) error
	DeleteService(Key) error
	Reals(Key) ([]Real, error)
	AddReal(Key, Real) error
	UpdateReal(Key, Real) error
	DeleteReal(Key, netip.AddrPort) error
}

// Options are the settings the rendered state depends on.
type Options struct {
	IPv6      bool
	Scheduler string // default rr
	// NodeIPs are the addresses NodePorts get virtual servers on.
	NodeIPs []netip.Addr
	// IsLocal reports whether an address is already an address of another
	// interface of this host; such external and LB IPs are not bound to
	// kube-ipvs0.
	IsLocal func(netip.Addr) bool
}

// VirtualServer is one desired virtual server with its real servers.
type VirtualServer struct {
	Service
	Name  lb.ServicePortName
	Reals []netip.AddrPort
}

// Desired is the whole desired IPVS state of one family: the virtual
// servers and the addresses kube-ipvs0 must hold.
type Desired struct {
	Servers map[Key]*VirtualServer
	Bind    []netip.Addr
}

// Render is the desired state of one family for snap. It is a pure
// function. As in kube-proxy, a port under a Local traffic policy with no
// local endpoint falls back to all endpoints (unlike iptables' DROP).
func Render(snap *lb.Snapshot, o Options) Desired {
	d, _ := render(snap, o)
	return d
}

// render is Render, with the table SyncChanged keeps (its id and node IPs
// unset). Where two ports render one virtual server, the later in name
// order has it, in both.
func render(snap *lb.Snapshot, o Options) (Desired, appliedTable) {
	d := Desired{Servers: map[Key]*VirtualServer{}}
	t := newAppliedTable()
	for _, sp := range snap.Sorted() {
		t.setPort(sp.Name, renderedPort(sp, o))
	}
	for k, vs := range t.servers {
		d.Servers[k] = vs
	}
	for a := range t.bindRefs {
		d.Bind = append(d.Bind, a)
	}
	slices.SortFunc(d.Bind, netip.Addr.Compare)
	return d, t
}

// renderPort is Render for one service port: it passes each virtual
// server to server and each address kube-ipvs0 must hold to bind (an
// address may come more than once).
func renderPort(sp *lb.ServicePort, o Options, server func(*VirtualServer), bind func(netip.Addr)) {
	sched := o.Scheduler
	if sched == "" {
		sched = "rr"
	}
	fam := func(a netip.Addr) bool { return a.Is6() == o.IPv6 }
	flags := uint32(0)
	var timeout uint32
	if sp.Affinity.ClientIP {
		flags |= FlagPersistent
		timeout = uint32(sp.Affinity.Timeout.Seconds())
	}
	if sched == "mh" {
		flags |= FlagSourceHash
	}
	pick := func(local bool) []netip.AddrPort {
		eps := sp.Select(local)
		if local && len(eps) == 0 {
			eps = sp.Select(false)
		}
		var out []netip.AddrPort
		for _, ep := range eps {
			if fam(ep.Addr()) {
				out = append(out, ep)
			}
		}
		return out
	}
	internal, external := pick(sp.InternalLocal), pick(sp.ExternalLocal)
	add := func(a netip.Addr, port uint16, reals []netip.AddrPort) {
		k := Key{Addr: a, Port: port, Proto: sp.Name.Protocol}
		server(&VirtualServer{Service: Service{Key: k, Scheduler: sched, Flags: flags, Timeout: timeout}, Name: sp.Name, Reals: reals})
	}
	for _, ip := range sp.ClusterIPs {
		if fam(ip) {
			add(ip, sp.Port, internal)
			bind(ip)
		}
	}
	for _, ip := range slices.Concat(sp.ExternalIPs(), sp.LoadBalancerIPs()) {
		if fam(ip) {
			add(ip, sp.Port, external)
			if o.IsLocal == nil || !o.IsLocal(ip) {
				bind(ip)
			}
		}
	}
	// A NodePort is served in the families the Service has (kube-proxy's
	// proxier of a family knows only the Services of its family).
	if sp.NodePort != 0 && slices.ContainsFunc(sp.ClusterIPs, fam) {
		for _, ip := range o.NodeIPs {
			if fam(ip) {
				add(ip, sp.NodePort, external)
			}
		}
	}
}

// ErrUnavailable is returned (wrapped) by Detect when IPVS does not work.
var ErrUnavailable = errors.New("IPVS is not available")

// probe is the virtual server Detect adds and removes, as kube-proxy's
// CanUseIPVSProxier does (TEST-NET-2, never routed).
var probe = Key{Addr: netip.MustParseAddr("198.51.100.0"), Port: 20000, Proto: lb.TCP}

// Detect checks that IPVS really works with the scheduler: a probe
// virtual server must appear in the kernel's list and go again. moby/ipvs
// reports no error when the kernel has no IPVS, so only reading back
// tells.
func Detect(k Kernel, scheduler string) error {
	if scheduler == "" {
		scheduler = "rr"
	}
	if !slices.Contains(Schedulers, scheduler) {
		return fmt.Errorf("%w: unknown scheduler %q (want one of %s)", ErrUnavailable, scheduler, strings.Join(Schedulers, ", "))
	}
	svcs, err := k.Services()
	if err != nil {
		return fmt.Errorf("%w: list virtual servers: %v", ErrUnavailable, err)
	}
	for _, s := range svcs {
		if s.Scheduler == scheduler {
			return nil // already in use: the scheduler's module is loaded
		}
	}
	s := Service{Key: probe, Scheduler: scheduler}
	if err := k.AddService(s); err != nil {
		return fmt.Errorf("%w: add a probe virtual server with scheduler %s: %v (are the ip_vs and ip_vs_%s modules loaded?)", ErrUnavailable, scheduler, err, scheduler)
	}
	defer k.DeleteService(probe)
	svcs, err = k.Services()
	if err != nil {
		return fmt.Errorf("%w: list virtual servers: %v", ErrUnavailable, err)
	}
	for _, got := range svcs {
		if got.Key == probe {
			return nil
		}
	}
	return fmt.Errorf("%w: a probe virtual server (scheduler %s) was accepted but is not listed: the kernel has no IPVS (ip_vs module), or not this scheduler (ip_vs_%s)", ErrUnavailable, scheduler, scheduler)
}
