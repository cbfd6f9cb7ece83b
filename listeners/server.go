package listeners

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/affinity"
	"github.com/sluice-proxy/sluice/lb"
)

// Role says why a listener exists.
type Role string

// The roles of a listener.
const (
	RoleNodePort     Role = "nodePort"
	RoleExternalIP   Role = "externalIP"
	RoleLoadBalancer Role = "loadBalancerIP"
	RoleProxyPort    Role = "proxyPort" // the target of ClusterIP capture
	// RoleExternalProxyPort is the target of captured external and
	// load-balancer IPs when the traffic policies give them endpoints of
	// their own; otherwise they share the proxy port.
	RoleExternalProxyPort Role = "externalProxyPort"
	RoleClusterIP         Role = "clusterIP" // ClusterIP:port itself (ListenOnVIPs)
)

// Frontend is one open listener of one service port.
type Frontend struct {
	Service lb.ServicePortName
	Role    Role
	// VIP is the ClusterIP a proxy port stands for (invalid for other roles).
	VIP  netip.Addr
	Addr netip.AddrPort
}

// Server turns snapshots into open listeners. Each service port gets a
// Picker that lives as long as the port, so round-robin position, affinity
// pins and ejection survive updates; listeners are reopened only when the
// addresses a port listens on change. The zero value is not usable: set
// Engine and call Apply.
type Server struct {
	Engine Engine
	// SCTP serves SCTP ports (nil: they are skipped with a warning, as on
	// a kernel without SCTP).
	SCTP interface {
		Listen(addr netip.AddrPort, t *Target) (Listener, error)
	}
	// SCTPSkipped, when set, is told after each Apply how many SCTP
	// ports are not served.
	SCTPSkipped func(n int)
	// SCTPWhy says why SCTP is not served, for the warning.
	SCTPWhy     string
	BindAddress netip.Addr // NodePorts and proxy ports; default 0.0.0.0
	ProxyPorts  *PortAllocator
	// IsLocal reports whether an external or load-balancer IP is an address
	// of this host, so it can be listened on directly. Nil means none is.
	IsLocal func(netip.Addr) bool
	// ListenOnVIPs serves ClusterIPs, external IPs and load-balancer IPs
	// on their own addresses and ports instead of through a proxy port:
	// the "bind" VIP capture, which makes them local addresses first.
	ListenOnVIPs bool
	// CaptureExternal says external and load-balancer IPs that are not
	// local are redirected to a proxy port (the "iptables" capture), so a
	// port whose traffic policies differ gets an external proxy port.
	CaptureExternal bool
	// CapturePort, when not 0, is the one TCP port that every TCP service
	// port's captured ClusterIPs (and, with CaptureExternal, non-local
	// external and load-balancer IPs) are redirected to, once OpenCapture
	// has opened it: each connection's original destination picks its
	// service port (SO_ORIGINAL_DST), instead of a proxy port and a
	// listener per service port, which at 50,000 Services would be more
	// descriptors than the process may hold (--userspace-capture-port).
	// UDP and SCTP ports keep their proxy ports.
	CapturePort uint16
	// NodePortAddrs lists the addresses NodePorts listen on
	// (--nodeport-addresses). A nil result (or a nil func) means BindAddress;
	// an empty non-nil one means none. It is asked once per Apply; a change
	// reopens NodePort listeners.
	NodePortAddrs func() []netip.Addr
	Retry         lb.RetryPolicy
	Ejection      lb.EjectionPolicy
	UDPTimeout    time.Duration
	Clock         affinity.Clock
	// Counters returns new counters for a service port (nil: none). A port
	// keeps them until it is removed; EachCounters lists them.
	Counters func(lb.ServicePortName) Counters
	Log      *slog.Logger

	mu    sync.Mutex
	retry *lb.RetryPolicy // Retry, shared by every target (retryPolicy)
	// ports are the served ports by name (lb.PortTable: 16 bytes an entry,
	// issue 16's memory budget).
	ports lb.PortTable[*servedPort]
	// capture is the CapturePort listener (nil: none); captured maps each
	// original destination it serves to its Target, read without a lock
	// by the data path (what Apply and Close write to it is committed
	// before they return).
	capture     Listener
	captureAddr netip.AddrPort // BindAddress and the capture listener's port
	captured    capturedMap
	// sctpPorts counts the SCTP entries of ports, kept by setPort and
	// dropPort: the SCTPSkipped count without a walk of every port per
	// update (issue 16).
	sctpPorts int
	// The ID and node addresses of the snapshot applied last (for deltas).
	appliedID        uint64
	appliedNodeAddrs []netip.Addr
	unserved         int // frontends in the failed lists
	// failed are, per port, the frontends whose listener could not be
	// opened (a port busy with another process, an address not yet
	// assigned); RetryFailed tries them again. Kept here, not in each
	// port's ownFrontends: few ports have any, and the list's room made
	// every port's 64 bytes where it is 32 (issue 16's memory budget).
	failed map[*servedPort][]failedFrontend
	// frontendsVersion counts the changes to the open frontends: a
	// listener opened or closed (FrontendsVersion).
	frontendsVersion uint64

	// Ejections are logged off the data path: a bounded queue drained by
	// one goroutine, started with the first; what does not fit is counted.
	ejectMu      sync.Mutex
	policyOnce   sync.Once
	settings     *lb.PickerSettings // Clock, and Ejection with the log's callbacks, shared by every picker
	ejections    chan ejection
	ejectDone    chan struct{}
	ejectDropped int
}

// ejection is an endpoint ejected (skipped for a while) or returned (a
// probe connected), queued for the log.
type ejection struct {
	port     lb.ServicePortName
	ep       netip.AddrPort
	skipped  time.Duration
	returned bool
}

// newPicker is a picker for name, sharing the server's ejection policy,
// whose ejections are logged.
func (s *Server) newPicker(name lb.ServicePortName) *lb.Picker {
	return lb.NewPortPicker(s.pickerSettings(), name)
}

// pickerSettings are s.Clock and s.Ejection with ejections logged, made
// once: every picker shares them (a pair of closures per port was 150
// bytes each).
func (s *Server) pickerSettings() *lb.PickerSettings {
	s.policyOnce.Do(func() {
		p := s.Ejection
		if s.Log != nil {
			p.OnEject = func(port lb.ServicePortName, ep netip.AddrPort, skipped time.Duration) {
				s.noteEjection(ejection{port: port, ep: ep, skipped: skipped})
			}
			p.OnReturn = func(port lb.ServicePortName, ep netip.AddrPort) {
				s.noteEjection(ejection{port: port, ep: ep, returned: true})
			}
		}
		clock := s.Clock
		if clock == nil {
			clock = affinity.SystemClock{}
		}
		s.settings = &lb.PickerSettings{Clock: clock, Ejection: p}
	})
	return s.settings
}

// noteEjection queues an ejection for the log; it never blocks.
func (s *Server) noteEjection(ev ejection) {
	s.ejectMu.Lock()
	defer s.ejectMu.Unlock()
	if s.ejections == nil {
		if s.ejectDone != nil {
			return // closed
		}
		s.ejections, s.ejectDone = make(chan ejection, 64), make(chan struct{})
		go s.logEjections(s.ejections, s.ejectDone)
	}
	select {
	case s.ejections <- ev:
	default:
		s.ejectDropped++
	}
}

func (s *Server) logEjections(ch <-chan ejection, done chan<- struct{}) {
	defer close(done)
	for ev := range ch {
		s.ejectMu.Lock()
		dropped := s.ejectDropped
		s.ejectDropped = 0
		s.ejectMu.Unlock()
		if ev.returned {
			s.log().Info("endpoint returned: a connect to it succeeded after its ejection", "service", ev.port.String(), "protocol", ev.port.Protocol,
				"endpoint", ev.ep.String(), "moreNotLogged", dropped)
			continue
		}
		s.log().Warn("endpoint ejected: connects to it failed; skipped for a while", "service", ev.port.String(), "protocol", ev.port.Protocol,
			"endpoint", ev.ep.String(), "for", ev.skipped, "moreNotLogged", dropped)
	}
}

type servedPort struct {
	sp *lb.ServicePort
	// target serves cluster traffic (the proxy port); ext serves NodePort,
	// external and load-balancer frontends. They are the same Target unless
	// the traffic policies select different endpoints.
	target   *Target
	ext      *Target
	captured []netip.AddrPort // its destinations in Server.captured
	// capturedFEs says which frontends it has on the capture port
	// (captureProxyFE, captureExternalFE); they are made when listed,
	// from sp and the capture's address, not kept: a Frontend is 128
	// bytes of every captured port (issue 16's memory budget).
	capturedFEs uint8
	// own is what it has beyond the capture port (mine makes it): nil for
	// a port served through the capture port alone, which is then 64
	// bytes here instead of 176 (issue 16's memory budget).
	own *ownFrontends
}

// name is the port's service port name.
func (p *servedPort) name() lb.ServicePortName { return p.sp.Name }

// ownFrontends are a service port's listeners of its own and what goes
// with them.
type ownFrontends struct {
	open []openFrontend
	// nodeAddrs is where its NodePort listens: the list its Apply made,
	// shared by that Apply's ports (a slice each made this 80 bytes, not
	// 64: issue 16's memory budget).
	nodeAddrs *[]netip.Addr
}

// openFrontend is one listener of a port's own with its frontend, less
// the port's name (the port's own: made when listed), and the proxy port
// it took from ProxyPorts (0: none). One slice of these, where a Frontend,
// a Listener and a proxy port were in three, is 120 bytes less per port
// with a listener each (issue 16's memory budget).
//
// Its role is an index into roles and its proxy port 16 bits, and of its
// address it keeps one IP: 48 bytes, where a Role string, an int, a VIP
// and an address made 112 (issue 16's memory budget).
type openFrontend struct {
	// ip is the VIP a proxy-port frontend serves (its address is the
	// server's bind address), or the IP the others listen on. The port is
	// the listener's.
	ip        netip.Addr
	ln        Listener
	proxyPort uint16
	role      uint8
}

// roles are the roles an openFrontend names by index.
func roles() [6]Role {
	return [...]Role{RoleNodePort, RoleExternalIP, RoleLoadBalancer, RoleProxyPort, RoleExternalProxyPort, RoleClusterIP}
}

// roleIndex is r's index in roles.
func roleIndex(r Role) uint8 {
	for i, x := range roles() {
		if x == r {
			return uint8(i)
		}
	}
	panic("listeners: unknown role " + string(r))
}

// newOpenFrontend is fe served by ln.
func newOpenFrontend(fe Frontend, ln Listener) openFrontend {
	o := openFrontend{role: roleIndex(fe.Role), ip: fe.Addr.Addr(), ln: ln}
	if o.proxyRole() {
		o.ip = fe.VIP
	}
	return o
}

// proxyRole says o listens on a proxy port, on the server's bind address.
func (o *openFrontend) proxyRole() bool {
	r := roles()[o.role]
	return r == RoleProxyPort || r == RoleExternalProxyPort
}

// frontend is o as a Frontend of the port named name, on a server whose
// bind address is bind.
func (o *openFrontend) frontend(name lb.ServicePortName, bind netip.Addr) Frontend {
	fe := Frontend{Service: name, Role: roles()[o.role], Addr: netip.AddrPortFrom(o.ip, o.ln.Addr().Port())}
	if o.proxyRole() {
		fe.VIP, fe.Addr = o.ip, netip.AddrPortFrom(bind, fe.Addr.Port())
	}
	return fe
}

// mine is p.own, made if p has none.
func (p *servedPort) mine() *ownFrontends {
	if p.own == nil {
		p.own = &ownFrontends{}
	}
	return p.own
}

// nodeAddrs is where p's NodePort listens (nil: it has none).
func (p *servedPort) nodeAddrs() []netip.Addr {
	if p.own == nil || p.own.nodeAddrs == nil {
		return nil
	}
	return *p.own.nodeAddrs
}

// newServedPort is a port for sp whose NodePort, if it has one, listens
// on *nodeAddrs (shared: not changed afterwards).
func newServedPort(sp *lb.ServicePort, nodeAddrs *[]netip.Addr, t *Target) *servedPort {
	p := &servedPort{sp: sp, target: t, ext: t}
	if sp.NodePort != 0 {
		p.mine().nodeAddrs = nodeAddrs
	}
	return p
}

// The frontends a port can have on the capture port.
const (
	captureProxyFE    uint8 = 1 << iota // its ClusterIPs (RoleProxyPort)
	captureExternalFE                   // its external IPs, for ext (RoleExternalProxyPort)
)

// frontendCount is how many frontends p has.
func (p *servedPort) frontendCount() int {
	n := bits.OnesCount8(p.capturedFEs)
	if p.own != nil {
		n += len(p.own.open)
	}
	return n
}

// appendFrontends appends p's frontends to out: its listeners', on a
// server whose bind address is bind, then those on the capture port, at
// to.
func (p *servedPort) appendFrontends(out []Frontend, bind netip.Addr, to netip.AddrPort) []Frontend {
	if p.own != nil {
		for i := range p.own.open {
			out = append(out, p.own.open[i].frontend(p.sp.Name, bind))
		}
	}
	if p.capturedFEs&captureProxyFE != 0 {
		out = append(out, Frontend{Service: p.sp.Name, Role: RoleProxyPort, VIP: capturedVIP(p.sp, to), Addr: to})
	}
	if p.capturedFEs&captureExternalFE != 0 {
		out = append(out, Frontend{Service: p.sp.Name, Role: RoleExternalProxyPort, Addr: to})
	}
	return out
}

// capturable says whether the capture at to maps ip (its family).
func capturable(ip netip.Addr, to netip.AddrPort) bool { return ip.Is4() == to.Addr().Is4() }

// capturedVIP is the ClusterIP a port's capture frontend is for: its
// first of the capture's family.
func capturedVIP(sp *lb.ServicePort, to netip.AddrPort) netip.Addr {
	for _, ip := range sp.ClusterIPs {
		if capturable(ip, to) {
			return ip
		}
	}
	return netip.Addr{}
}

// failedFrontend is a listener to open again, with its back-off.
type failedFrontend struct {
	fe      Frontend
	t       *Target
	next    time.Time
	backoff time.Duration
}

// Back-off of a listener that failed to open: the first retry after
// retryFirst, doubling up to retryMax.
const (
	retryFirst = time.Second
	retryMax   = 30 * time.Second
)

// retryPolicy is Retry as the targets share it, made at the first use
// (Retry does not change once the server serves). Called with mu held.
func (s *Server) retryPolicy() *lb.RetryPolicy {
	if s.retry == nil {
		r := s.Retry
		s.retry = &r
	}
	return s.retry
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// portLinesMax is how many lines an Apply logs at the default verbosity,
// one per service port opened or removed. Past it the rest go to --v=1
// and one summary line follows: at 10,000 Services the first apply
// formatted and wrote 10,000 lines, 1.3 MB of log and its garbage made
// among the ports being built (kube-proxy logs no line per Service at
// its default verbosity either; the start's own listing does the same,
// cmd/sluice's listenerLinesMax).
const portLinesMax = 64

// portLines logs an Apply's lines about its ports.
type portLines struct {
	log   *slog.Logger
	n     int            // lines asked for
	quiet int            // of them, logged only at debug level
	byMsg map[string]int // the quiet ones by message
}

// port logs msg about name, with args after the service and protocol.
func (l *portLines) port(msg string, name lb.ServicePortName, args ...any) {
	l.n++
	level := slog.LevelInfo
	if l.n > portLinesMax {
		level = slog.LevelDebug
		l.quiet++
		if l.byMsg == nil {
			l.byMsg = map[string]int{}
		}
		l.byMsg[msg]++
	}
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	l.log.Log(context.Background(), level, msg, append([]any{"service", name.String(), "protocol", name.Protocol}, args...)...)
}

// summary logs how many lines went to the debug level, by message.
func (l *portLines) summary() {
	if l.quiet == 0 {
		return
	}
	args := []any{"lines", l.quiet}
	for _, msg := range slices.Sorted(maps.Keys(l.byMsg)) {
		args = append(args, msg, l.byMsg[msg])
	}
	l.log.Info("more service ports changed; each logged with --v=1", args...)
}

// Apply makes the listeners match snap. A listener that cannot be opened is
// reported in the returned error (naming service and address) and the rest
// still goes ahead. Established connections are never touched.
func (s *Server) Apply(snap *lb.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.captured.commit()
	if s.ports.NameOf == nil {
		s.ports.NameOf = (*servedPort).name
	}
	var errs []error
	lines := portLines{log: s.log()}
	defer lines.summary()
	nodeAddrs := []netip.Addr{s.bindAddress()}
	if s.NodePortAddrs != nil {
		if addrs := s.NodePortAddrs(); addrs != nil {
			nodeAddrs = addrs
		}
	}
	// Only the ports the snapshot says changed since the one applied last,
	// when it says so and the node addresses are as they were (issue 16:
	// O(changed) per update, not O(service ports)); else every one.
	names, delta := snap.DeltaSince(s.appliedID)
	delta = delta && slices.Equal(nodeAddrs, s.appliedNodeAddrs)
	remove := func(name lb.ServicePortName, p *servedPort) {
		s.closePort(p)
		s.dropPort(name) // its counters' series go with it (EachCounters)
		lines.port("service port removed", name)
	}
	// The very same port as last time (the sources reuse unchanged ones)
	// needs nothing; the others are handled in name order, so listeners
	// open in a stable order.
	var changed []*lb.ServicePort
	consider := func(name lb.ServicePortName, sp *lb.ServicePort) {
		p, _ := s.ports.Get(name)
		if p == nil || p.sp != sp || (sp.NodePort != 0 && !slices.Equal(p.nodeAddrs(), nodeAddrs)) {
			changed = append(changed, sp)
		}
	}
	if delta {
		for _, name := range names {
			sp := snap.Ports.Get(name)
			if sp == nil {
				if p, ok := s.ports.Get(name); ok {
					remove(name, p)
				}
				continue
			}
			consider(name, sp)
		}
	} else {
		for name, p := range s.ports.All() {
			if snap.Ports.Get(name) == nil {
				remove(name, p)
			}
		}
		for name, sp := range snap.Ports.All() {
			consider(name, sp)
		}
	}
	s.appliedID, s.appliedNodeAddrs = snap.ID, nodeAddrs
	for _, sp := range lb.SortPorts(changed) {
		p, _ := s.ports.Get(sp.Name)
		sameNodeAddrs := sp.NodePort == 0 || (p != nil && slices.Equal(p.nodeAddrs(), nodeAddrs))
		if p != nil && p.sp.SameFrontend(sp) && sameNodeAddrs {
			p.sp = sp
			p.setEndpoints(sp)
			continue
		}
		if sp.Name.Protocol == lb.SCTP && s.SCTP == nil {
			if p == nil {
				why := s.SCTPWhy
				if why == "" {
					why = "no SCTP listener"
				}
				s.log().Warn("SCTP service port not served", "service", sp.Name.String(), "why", why)
			}
			// Kept without listeners, so later updates neither warn again nor reopen anything.
			s.setPort(newServedPort(sp, &nodeAddrs, &Target{Picker: s.newPicker(sp.Name)}))
			continue
		}
		var picker, extPicker *lb.Picker
		if p != nil {
			// Keep pins and health across a frontend change.
			picker = p.target.Picker
			if p.ext != p.target {
				extPicker = p.ext.Picker
			}
			s.closePort(p)
		} else {
			picker = s.newPicker(sp.Name)
		}
		// A port keeps its counters across a frontend change, as a
		// labelled metric kept its series.
		var ctr Counters
		if p != nil && p.target.Counters != nil {
			ctr = p.target.Counters
		} else if s.Counters != nil {
			ctr = s.Counters(sp.Name)
		}
		np := newServedPort(sp, &nodeAddrs, &Target{Picker: picker, Retry: s.retryPolicy(), UDPTimeout: s.UDPTimeout, Counters: ctr})
		if sp.SplitPolicy() {
			if extPicker == nil {
				extPicker = s.newPicker(sp.Name)
			}
			np.ext = &Target{Picker: extPicker, Retry: s.retryPolicy(), UDPTimeout: s.UDPTimeout, Counters: ctr}
		}
		np.setEndpoints(sp)
		errs = append(errs, s.openPort(np)...)
		s.setPort(np)
		lines.port("service port listening", sp.Name, "frontends", np.frontendCount(), "endpoints", picker.Len())
	}
	if s.SCTPSkipped != nil {
		n := 0
		if s.SCTP == nil {
			n = s.sctpPorts
		}
		s.SCTPSkipped(n)
	}
	return errors.Join(errs...)
}

// EachCounters calls yield with each service port's name and counters,
// those of the ports the last Apply kept (a port without counters is
// left out). It holds the server's lock throughout, so yield must be
// quick and must not call back into the server.
func (s *Server) EachCounters(yield func(lb.ServicePortName, Counters)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, p := range s.ports.All() {
		if p.target.Counters != nil {
			yield(name, p.target.Counters)
		}
	}
}

// setPort puts p in ports under its name; s.mu held.
func (s *Server) setPort(p *servedPort) {
	if _, ok := s.ports.Get(p.sp.Name); !ok && p.sp.Name.Protocol == lb.SCTP {
		s.sctpPorts++
	}
	s.ports.Set(p.sp.Name, p)
}

// dropPort takes name out of ports; s.mu held.
func (s *Server) dropPort(name lb.ServicePortName) {
	if _, ok := s.ports.Get(name); ok && name.Protocol == lb.SCTP {
		s.sctpPorts--
	}
	s.ports.Delete(name)
}

// setEndpoints hands the port's usable endpoints and affinity to its
// pickers: one for cluster traffic and, under a split traffic policy, one for
// external traffic.
func (p *servedPort) setEndpoints(sp *lb.ServicePort) {
	p.target.Picker.SetUsable(sp, sp.InternalLocal)
	p.target.Picker.SetAffinity(sp.Affinity)
	if p.ext != p.target {
		p.ext.Picker.SetUsable(sp, sp.ExternalLocal)
		p.ext.Picker.SetAffinity(sp.Affinity)
	}
}

func (s *Server) bindAddress() netip.Addr {
	if s.BindAddress.IsValid() {
		return s.BindAddress
	}
	return netip.IPv4Unspecified()
}

func (s *Server) openPort(p *servedPort) []error {
	sp := p.sp
	var errs []error
	open := func(fe Frontend) bool {
		t := p.ext
		if fe.Role == RoleProxyPort || fe.Role == RoleClusterIP {
			t = p.target
		}
		if fe.Role == RoleLoadBalancer && len(sp.SourceRanges()) > 0 {
			// loadBalancerSourceRanges: the same picker, behind a source check.
			guarded := *t
			ranges := sp.SourceRanges()
			guarded.Hooks = &TargetHooks{Admit: func(a netip.Addr) bool {
				for _, r := range ranges {
					if r.Contains(a) {
						return true
					}
				}
				return false
			}}
			t = &guarded
		}
		ln, err := s.listen(sp.Name.Protocol, fe.Addr, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("service %s (%s %s): listen on %s: %w", sp.Name, sp.Name.Protocol, fe.Role, fe.Addr, err))
			if fe.Role != RoleProxyPort && fe.Role != RoleExternalProxyPort { // those move to another port of the range
				if s.failed == nil {
					s.failed = map[*servedPort][]failedFrontend{}
				}
				s.failed[p] = append(s.failed[p], failedFrontend{fe: fe, t: t, next: s.now().Add(retryFirst), backoff: retryFirst})
				s.unserved++
			}
			return false
		}
		// The address asked for, with the port the listener got: Go's
		// engine listens on [::] for 0.0.0.0, and the VIP capture maps
		// IPv4 VIPs only to IPv4 frontends.
		fe.Addr = netip.AddrPortFrom(fe.Addr.Addr(), ln.Addr().Port())
		own := p.mine()
		own.open = append(own.open, newOpenFrontend(fe, ln))
		s.frontendsVersion++
		return true
	}
	bind := s.bindAddress()
	if sp.NodePort != 0 {
		for _, a := range p.nodeAddrs() {
			open(Frontend{Service: sp.Name, Role: RoleNodePort, Addr: netip.AddrPortFrom(a, sp.NodePort)})
		}
	}
	var nonLocal []netip.Addr
	for _, set := range []struct {
		role Role
		ips  []netip.Addr
	}{{RoleExternalIP, sp.ExternalIPs()}, {RoleLoadBalancer, sp.LoadBalancerIPs()}} {
		for _, ip := range set.ips {
			if s.ListenOnVIPs || (s.IsLocal != nil && s.IsLocal(ip)) {
				open(Frontend{Service: sp.Name, Role: set.role, Addr: netip.AddrPortFrom(ip, sp.Port)})
			} else {
				nonLocal = append(nonLocal, ip)
			}
		}
	}
	if s.ListenOnVIPs {
		for _, vip := range sp.ClusterIPs {
			open(Frontend{Service: sp.Name, Role: RoleClusterIP, Addr: netip.AddrPortFrom(vip, sp.Port)})
		}
		return errs
	}
	if s.capture != nil && sp.Name.Protocol == lb.TCP {
		s.openCaptured(p, nonLocal)
		return errs
	}
	// openProxyPort opens a listener on a port of the proxy range (or a
	// random one), trying further ports of the range when one is taken.
	openProxyPort := func(role Role, vip netip.Addr) {
		// Ports that failed stay handed out until the tries end, so that
		// each try gets another one.
		var failed []int
		defer func() {
			for _, port := range failed {
				s.ProxyPorts.Release(port)
			}
		}()
		for try := 0; try < 16; try++ {
			port := 0
			if s.ProxyPorts != nil {
				var err error
				if port, err = s.ProxyPorts.Next(); err != nil {
					errs = append(errs, fmt.Errorf("service %s: proxy port: %w", sp.Name, err))
					return
				}
			}
			before := len(errs)
			if open(Frontend{Service: sp.Name, Role: role, VIP: vip, Addr: netip.AddrPortFrom(bind, uint16(port))}) {
				if port != 0 {
					p.own.open[len(p.own.open)-1].proxyPort = uint16(port) // open added it last
				}
				return
			}
			if port != 0 {
				failed = append(failed, port)
			}
			if port == 0 || try == 15 {
				return
			}
			// That port of the range is taken by someone else: try another.
			errs = errs[:before]
		}
	}
	for _, vip := range sp.ClusterIPs {
		if vip.Is4() != bind.Is4() && !bind.IsUnspecified() {
			continue // the proxy port lives on the bind address's family
		}
		openProxyPort(RoleProxyPort, vip)
		break // one proxy port serves every ClusterIP of the port
	}
	if s.CaptureExternal && len(nonLocal) > 0 && p.ext != p.target {
		openProxyPort(RoleExternalProxyPort, netip.Addr{})
	}
	return errs
}

func (s *Server) now() time.Time {
	if s.Clock != nil {
		return s.Clock.Now()
	}
	return time.Now()
}

// Unserved counts the listeners the state asks for that are not open.
// While it is above zero the data plane does not match the state, which
// /healthz reports as unhealthy (kube-proxy's healthz semantics).
func (s *Server) Unserved() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unserved // kept as failures come and go: O(1), called on every apply
}

// RetryFailed tries again each listener that failed to open and whose
// back-off has passed (1 s, doubling to 30 s). It returns how many are
// still not open and the errors of this round.
func (s *Server) RetryFailed() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var errs []error
	left := 0
	for p, failed := range s.failed {
		before := len(failed)
		kept := failed[:0]
		for _, f := range failed {
			if now.Before(f.next) {
				kept = append(kept, f)
				continue
			}
			ln, err := s.listen(p.sp.Name.Protocol, f.fe.Addr, f.t)
			if err != nil {
				errs = append(errs, fmt.Errorf("service %s (%s %s): listen on %s: %w", p.sp.Name, p.sp.Name.Protocol, f.fe.Role, f.fe.Addr, err))
				f.backoff = min(2*f.backoff, retryMax)
				f.next = now.Add(f.backoff)
				kept = append(kept, f)
				continue
			}
			fe := f.fe
			fe.Addr = netip.AddrPortFrom(fe.Addr.Addr(), ln.Addr().Port()) // as openPort
			own := p.mine()
			own.open = append(own.open, newOpenFrontend(fe, ln))
			s.frontendsVersion++
			s.log().Info("listener opened on retry", "service", p.sp.Name.String(), "protocol", p.sp.Name.Protocol, "role", fe.Role, "addr", fe.Addr.String())
		}
		if len(kept) == 0 {
			delete(s.failed, p)
		} else {
			s.failed[p] = kept
		}
		s.unserved += len(kept) - before
		left += len(kept)
	}
	return left, errors.Join(errs...)
}

// listen opens one listener: SCTP on its own listener, the rest on the engine.
func (s *Server) listen(proto lb.Protocol, addr netip.AddrPort, t *Target) (Listener, error) {
	if proto == lb.SCTP {
		return s.SCTP.Listen(addr, t)
	}
	return s.Engine.Listen(proto, addr, t)
}

func (s *Server) closePort(p *servedPort) {
	if own := p.own; own != nil {
		for _, o := range own.open {
			o.ln.Close()
			if o.proxyPort != 0 && s.ProxyPorts != nil {
				s.ProxyPorts.Release(int(o.proxyPort))
			}
		}
	}
	s.unserved -= len(s.failed[p])
	delete(s.failed, p)
	for _, dst := range p.captured {
		if t := s.captured.get(dst); t != nil && (t == p.target || t == p.ext) {
			s.captured.delete(dst)
		}
	}
	if p.frontendCount() > 0 {
		s.frontendsVersion++
	}
	if p.own != nil {
		p.own.open = nil
	}
	p.captured, p.capturedFEs = nil, 0
}

// OpenCapture opens the CapturePort listener on BindAddress; from then on
// TCP service ports opened are served through it. It is an error to call
// it twice.
func (s *Server) OpenCapture() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capture != nil {
		return errors.New("capture port already open")
	}
	addr := netip.AddrPortFrom(s.bindAddress(), s.CapturePort)
	ln, err := s.Engine.Listen(lb.TCP, addr, &Target{Hooks: &TargetHooks{Resolve: s.resolveCaptured}})
	if err != nil {
		return fmt.Errorf("capture port: listen on %s: %w", addr, err)
	}
	// The address asked for, not the listener's: Go's engine listens
	// on [::] for 0.0.0.0, and the capture maps by the bind family.
	s.capture, s.captureAddr = ln, netip.AddrPortFrom(addr.Addr(), ln.Addr().Port())
	return nil
}

// resolveCaptured is the capture listener's Resolve.
func (s *Server) resolveCaptured(orig netip.AddrPort) *Target { return s.captured.load(orig) }

// openCaptured serves a TCP service port through the capture listener:
// its ClusterIPs of the listener's family (and, with CaptureExternal, its
// non-local external and load-balancer IPs) resolve to its targets, and
// it gets the frontends the VIP capture maps to the capture port.
func (s *Server) openCaptured(p *servedPort, nonLocalExternal []netip.Addr) {
	sp := p.sp
	to := s.captureAddr
	register := func(ip netip.Addr, t *Target) {
		dst := netip.AddrPortFrom(ip, sp.Port)
		s.captured.store(dst, t)
		p.captured = append(p.captured, dst)
	}
	for _, ip := range sp.ClusterIPs {
		if capturable(ip, to) {
			register(ip, p.target)
		}
	}
	if capturedVIP(sp, to).IsValid() {
		p.capturedFEs |= captureProxyFE
		s.frontendsVersion++
	}
	if !s.CaptureExternal || len(nonLocalExternal) == 0 {
		return
	}
	for _, ip := range nonLocalExternal {
		if capturable(ip, to) {
			register(ip, p.ext)
		}
	}
	if p.ext != p.target {
		p.capturedFEs |= captureExternalFE
		s.frontendsVersion++
	}
}

// FrontendsVersion changes whenever the open frontends do (a listener
// opened or closed, on an update or a retry) and at no other time: an
// update that changes only endpoints leaves it as it was, so what is
// worked out from Frontends (the VIP capture's portals) need not be again.
func (s *Server) FrontendsVersion() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.frontendsVersion
}

// FrontendCount is how many listeners are open, without listing them.
func (s *Server) FrontendCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for p := range s.ports.Values() {
		n += p.frontendCount()
	}
	return n
}

// PortFrontends lists the open listeners of one service port (none when
// it is not served), without listing every port's.
func (s *Server) PortFrontends(name lb.ServicePortName) []Frontend {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.ports.Get(name); ok {
		return p.appendFrontends(nil, s.bindAddress(), s.captureAddr)
	}
	return nil
}

// Frontends lists every open listener, sorted by service and address.
func (s *Server) Frontends() []Frontend {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Sorted by service then address; the keys are built once per
	// frontend, not per comparison.
	type keyed struct {
		svc, addr string
		fe        Frontend
	}
	var ks []keyed
	var fes []Frontend
	for p := range s.ports.Values() {
		fes = p.appendFrontends(fes[:0], s.bindAddress(), s.captureAddr)
		for _, fe := range fes {
			ks = append(ks, keyed{fe.Service.String() + string(fe.Service.Protocol), fe.Addr.String(), fe})
		}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		if c := strings.Compare(a.svc, b.svc); c != 0 {
			return c
		}
		return strings.Compare(a.addr, b.addr)
	})
	out := make([]Frontend, len(ks))
	for i, k := range ks {
		out[i] = k.fe
	}
	return out
}

// ExpirePins drops affinity pins that outlived their timeout, so one-off
// clients do not accumulate. Lookups already ignore expired pins.
func (s *Server) ExpirePins() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.ports.Values() {
		p.target.Picker.ExpirePins()
		if p.ext != p.target {
			p.ext.Picker.ExpirePins()
		}
	}
}

// Close closes every listener.
func (s *Server) Close() {
	s.mu.Lock()
	for name, p := range s.ports.All() {
		s.closePort(p)
		s.dropPort(name)
	}
	s.captured.commit()
	if s.capture != nil {
		s.capture.Close()
		s.capture = nil
	}
	s.mu.Unlock()
	s.ejectMu.Lock()
	ch, done := s.ejections, s.ejectDone
	s.ejections = nil
	if done == nil {
		s.ejectDone = make(chan struct{}) // no queue will start
	}
	s.ejectMu.Unlock()
	if ch != nil {
		close(ch)
		<-done
	}
}

// PortView is the debug view of one served service port.
type PortView struct {
	Service   string   `json:"service"`
	Protocol  string   `json:"protocol"`
	Frontends []string `json:"frontends"`
	Endpoints []string `json:"endpoints"`
	Ejected   []string `json:"ejected,omitempty"`
	// EjectedLeft is how long each ejected endpoint stays skipped.
	EjectedLeft map[string]string `json:"ejectedLeft,omitempty"`
	// ExternalEndpoints is set when the traffic policies give external
	// frontends endpoints of their own.
	ExternalEndpoints []string `json:"externalEndpoints,omitempty"`
	Affinity          *string  `json:"affinityTimeout,omitempty"`
	// InternalLocal is internalTrafficPolicy Local: cluster traffic goes
	// only to this node's endpoints.
	InternalLocal bool `json:"internalTrafficPolicyLocal,omitempty"`
	// States is every endpoint the source gave, with its conditions and
	// whether it takes traffic (Endpoints are the ones that do).
	States []EndpointState `json:"endpointStates"`
}

// EndpointState is one endpoint's conditions and use, for status pages.
type EndpointState struct {
	Addr string `json:"address"`
	// Condition is ready, terminating (serving and terminating: used only
	// while no endpoint is ready), terminating-not-serving or not-ready.
	Condition string `json:"condition"`
	Local     bool   `json:"local,omitempty"`
	// InUse is set when cluster traffic goes to it.
	InUse bool `json:"inUse"`
	// OutOfTopology is set when the EndpointSlice's topology hints give it
	// to other zones or nodes, so that cluster traffic from this node does
	// not go to it while another endpoint is ready.
	OutOfTopology bool `json:"outOfTopology,omitempty"`
	// Pinned counts the clients ClientIP affinity keeps on it.
	Pinned int `json:"pinned,omitempty"`
}

// condition names an endpoint's EndpointSlice conditions.
func condition(ep lb.Endpoint) string {
	switch {
	case ep.Ready:
		return "ready"
	case ep.Serving && ep.Terminating:
		return "terminating"
	case ep.Terminating:
		return "terminating-not-serving"
	}
	return "not-ready"
}

// Dump returns what is being served, sorted, for /debug/sluice.
func (s *Server) Dump() []PortView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []PortView{}
	for name, p := range s.ports.All() {
		v := PortView{Service: name.String(), Protocol: string(name.Protocol), Frontends: []string{}, Endpoints: []string{},
			InternalLocal: p.sp.InternalLocal}
		for _, fe := range p.appendFrontends(nil, s.bindAddress(), s.captureAddr) {
			d := string(fe.Role) + " " + fe.Addr.String()
			if fe.VIP.IsValid() {
				d += " (for " + fe.VIP.String() + ")"
			}
			v.Frontends = append(v.Frontends, d)
		}
		for _, ep := range p.target.Picker.Endpoints() {
			v.Endpoints = append(v.Endpoints, ep.String())
			if left := p.target.Picker.EjectedFor(ep); left > 0 {
				v.Ejected = append(v.Ejected, ep.String())
				if v.EjectedLeft == nil {
					v.EjectedLeft = map[string]string{}
				}
				v.EjectedLeft[ep.String()] = left.Round(time.Second).String()
			}
		}
		if p.ext != p.target {
			v.ExternalEndpoints = []string{}
			for _, ep := range p.ext.Picker.Endpoints() {
				v.ExternalEndpoints = append(v.ExternalEndpoints, ep.String())
			}
		}
		if p.sp.Affinity.ClientIP {
			t := p.sp.Affinity.Timeout.String()
			v.Affinity = &t
		}
		pins := p.target.Picker.Pins()
		if p.ext != p.target {
			for a, n := range p.ext.Picker.Pins() {
				if pins == nil {
					pins = map[netip.AddrPort]int{}
				}
				pins[a] += n
			}
		}
		v.States = make([]EndpointState, 0, len(p.sp.Endpoints))
		for _, ep := range p.sp.Endpoints {
			v.States = append(v.States, EndpointState{Addr: ep.Addr.String(), Condition: condition(ep), Local: ep.Local,
				InUse: p.target.Picker.Has(ep.Addr.AddrPort()), OutOfTopology: !p.sp.InTopology(ep), Pinned: pins[ep.Addr.AddrPort()]})
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b PortView) int { return strings.Compare(a.Service+a.Protocol, b.Service+b.Protocol) })
	return out
}
