package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// vipCapture is how userspace mode gets traffic for service IPs to its
// listeners (see package portals). before runs ahead of the listeners'
// Apply, after it; resync repeats the last state (a firewall reload may
// have flushed it).
type vipCapture interface {
	before(snap *lb.Snapshot) error
	// after is told the listeners' FrontendsVersion and where to list them.
	after(snap *lb.Snapshot, version uint64, fes frontendLister) error
	resync() error
	close()
}

// chooseCapture picks the --userspace-capture method and says why, once.
// auto prefers nftables, then iptables (both precise: only VIP:port is
// captured), then bind (needs only netlink), then none. A forced method that cannot work is an
// error naming the flag.
func chooseCapture(cfg *config.Config, srv *listeners.Server, local *localAddrs, log *slog.Logger) (vipCapture, error) {
	want := cfg.UserspaceCapture
	if want == "" {
		want = portals.MethodAuto
	}
	var reasons []string
	if want == portals.MethodAuto || want == portals.MethodNFTables {
		c, err := newNFTablesCapture(local, log)
		if err == nil {
			why := "nft can program the " + portals.NFTablesTable + " table (" + c.families() + ")"
			if want == portals.MethodNFTables {
				why = "forced by --userspace-capture"
			}
			log.Info("userspace VIP capture: nftables", "why", why)
			srv.CaptureExternal = true
			go c.watch(cfg.KubeProxy.IPTables.SyncPeriod.Duration)
			return c, nil
		}
		if want == portals.MethodNFTables {
			return nil, fmt.Errorf("--userspace-capture=nftables: %w", err)
		}
		reasons = append(reasons, "nftables unusable: "+err.Error())
	}
	if want == portals.MethodAuto || want == portals.MethodIPTables {
		c, err := newIPTablesCapture(cfg, local, log)
		if err == nil {
			why := "iptables can program the nat table (" + c.families() + ")"
			if want == portals.MethodIPTables {
				why = "forced by --userspace-capture"
			}
			log.Info("userspace VIP capture: iptables", "why", why)
			srv.CaptureExternal = true
			go c.watch(cfg.KubeProxy.IPTables.SyncPeriod.Duration)
			return c, nil
		}
		if want == portals.MethodIPTables {
			return nil, fmt.Errorf("--userspace-capture=iptables: %w", err)
		}
		reasons = append(reasons, "iptables unusable: "+err.Error())
	}
	if want == portals.MethodAuto || want == portals.MethodBind {
		b := &portals.Binder{Table: portals.Netlink{}}
		where, err := b.Init()
		if err == nil {
			why := append(reasons, "service IPs are assigned to "+where)
			if want == portals.MethodBind {
				why = []string{"forced by --userspace-capture; service IPs are assigned to " + where}
			}
			log.Info("userspace VIP capture: bind", "why", strings.Join(why, "; "))
			srv.ListenOnVIPs = true
			return &bindCapture{binder: b}, nil
		}
		if want == portals.MethodBind {
			return nil, fmt.Errorf("--userspace-capture=bind: %w", err)
		}
		reasons = append(reasons, "bind unusable: "+err.Error())
	}
	if want == portals.MethodNone {
		reasons = []string{"forced by --userspace-capture; ClusterIPs are reachable only through their proxy ports"}
		log.Info("userspace VIP capture: none", "why", strings.Join(reasons, "; "))
		return noCapture{}, nil
	}
	// Chosen for want of privilege or kernel support: ClusterIPs will not
	// answer, which an operator must hear about.
	log.Warn("userspace VIP capture: none; ClusterIPs are reachable only through their proxy ports", "why", strings.Join(reasons, "; "))
	return noCapture{}, nil
}

// frontendLister lists the open listeners (listeners.Server): all of
// them, or one service port's.
type frontendLister interface {
	Frontends() []listeners.Frontend
	PortFrontends(lb.ServicePortName) []listeners.Frontend
}

type noCapture struct{}

func (noCapture) before(*lb.Snapshot) error                        { return nil }
func (noCapture) after(*lb.Snapshot, uint64, frontendLister) error { return nil }
func (noCapture) resync() error                                    { return nil }
func (noCapture) close()                                           {}

// portalFamily is one family's portals through the iptables or the
// nftables method: sync makes them exactly ps, present says whether they
// are still in place (a firewall reload flushes them).
type portalFamily interface {
	sync(ps []portals.Portal) error
	present() bool
}

// portalChanger is a portalFamily that can also apply a change: the
// portals in del go and those in add come (a portal in both stays, with
// add's target). errWholeNeeded says it cannot (then sync with every
// portal).
type portalChanger interface {
	change(del, add []portals.Portal) error
}

// errWholeNeeded: a portal family cannot apply this change alone.
var errWholeNeeded = portals.ErrWholeNeeded

// portalCapture keeps the portals of the iptables or nftables method for
// each family that works. Every --iptables-sync-period it checks that they
// are still there and puts them back after a flush, as the iptables
// mode's canary does.
type portalCapture struct {
	fams  []portalFamily
	local *localAddrs
	log   *slog.Logger
	stop  chan struct{}
	done  chan struct{}

	mu sync.Mutex
	// byPort is where the ports with portals redirect to, by service
	// port: their portals are those of the port in snap (a port the
	// capture has not been told of a change of has the same addresses
	// there: lb.ServicePort.SameFrontend) redirected there, made again
	// when needed (portalsOf) rather than kept, which held some 240
	// bytes of every port (issue 16's memory budget). keys counts the
	// ports with a portal at each destination (more than one: they
	// collide, and which wins is the whole list's order).
	byPort map[lb.ServicePortName]heldTargets
	keys   map[portals.Dest]int32
	// addrs are the addresses byPort's targets name.
	addrs targetAddrs
	// The frontends' and local addresses' versions last worked out
	// (valid when worked), and the snapshot seen last.
	worked                bool
	frontsSeen, localSeen uint64
	snap                  *lb.Snapshot
	// failed: the last sync of the portals failed (Tick tries again);
	// resynced is told when a sync after one that failed, not an Apply's,
	// makes the portals the last worked out.
	failed   bool
	resynced func()
	// partials counts the updates worked out from the changed ports
	// alone (for tests).
	partials int
}

func newPortalCapture(fams []portalFamily, local *localAddrs, log *slog.Logger) *portalCapture {
	return &portalCapture{fams: fams, local: local, log: log, stop: make(chan struct{}), done: make(chan struct{})}
}

// iptablesPortals is KUBE-PORTALS-CONTAINER and -HOST of one family.
type iptablesPortals struct{ *portals.IPTables }

func (f iptablesPortals) sync(ps []portals.Portal) error { return f.Sync(ps) }

func (f iptablesPortals) present() bool {
	chains, err := f.Runner.Chains("nat")
	return err == nil && slices.Contains(chains, portals.ChainContainer) && slices.Contains(chains, portals.ChainHost)
}

func newIPTablesCapture(cfg *config.Config, local *localAddrs, log *slog.Logger) (*portalCapture, error) {
	if runtime.GOOS != "linux" {
		return nil, errors.New("iptables needs Linux")
	}
	var fams []portalFamily
	for _, fam := range probeFamilies(cfg.IPTablesBackend) {
		if err := fam.err; err != nil {
			if !fam.v6 {
				return nil, err
			}
			continue
		}
		fams = append(fams, iptablesPortals{&portals.IPTables{Runner: fam.runner, IPv6: fam.v6}})
	}
	// The capture a previous run made through nftables would redirect too.
	if err := cleanupNFTablesCapture(); err != nil {
		log.Warn("userspace VIP capture: cannot remove the nftables portals of an earlier run", "err", err)
	}
	return newPortalCapture(fams, local, log), nil
}

// watch resyncs when portals have vanished, until close.
func (c *portalCapture) watch(every time.Duration) {
	defer close(c.done)
	t := time.NewTicker(resyncEvery(every))
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if !slices.ContainsFunc(c.fams, func(f portalFamily) bool { return !f.present() }) {
			continue
		}
		c.log.Warn("VIP capture: portals are gone (rules flushed); resyncing")
		if err := c.retry(); err != nil {
			c.log.Error("VIP capture resync failed", "err", err)
		} else {
			c.log.Info("VIP capture: portals resynced")
		}
	}
}

func (c *portalCapture) close() {
	close(c.stop)
	<-c.done
}

func (c *portalCapture) families() string {
	if len(c.fams) == 2 {
		return "IPv4 and IPv6"
	}
	return "IPv4"
}

func (c *portalCapture) before(*lb.Snapshot) error { return nil }

// after works out the portals again when a listener opened or closed or
// the node's addresses changed since it last did, or its last sync
// failed; otherwise they are as
// they were (portalsFor reads nothing of a port that a change keeping its
// listeners can change: lb.ServicePort.SameFrontend), and an update of
// endpoints alone costs nothing here (issue 16: it cost a listing and a
// sort of every frontend, then a walk of every port). When snap says
// which ports changed since the snapshot it saw last, only those ports'
// portals are worked out again, and families that can (nftables) write
// only their change: a Service added to 50,000 cost a listing of every
// frontend and a walk of every port, some 300 ms.
func (c *portalCapture) after(snap *lb.Snapshot, version uint64, fes frontendLister) error {
	local := c.local.version()
	c.mu.Lock()
	prev := c.snap
	c.snap = snap
	same := c.worked && !c.failed && version == c.frontsSeen && local == c.localSeen
	canChange := c.worked && !c.failed && local == c.localSeen && prev != nil
	c.mu.Unlock()
	if same {
		return nil
	}
	if canChange {
		if names, ok := snap.DeltaSince(prev.ID); ok {
			if done, err := c.afterChanged(prev, snap, names, version, fes); done {
				return err
			}
		}
	}
	byPort := targetsByPort(fes.Frontends(), &c.addrs)
	keys := map[portals.Dest]int32{}
	for name, t := range byPort {
		ps := portalsOf(snap.Ports.Get(name), c.addrs.get(t), c.local.has)
		if len(ps) == 0 {
			delete(byPort, name)
		}
		for _, p := range ps {
			keys[portals.DestOf(p)]++
		}
	}
	c.mu.Lock()
	c.byPort, c.keys = byPort, keys
	c.worked, c.frontsSeen, c.localSeen = true, version, local
	c.mu.Unlock()
	return c.syncAll() // on failure the next update tries again, as Tick does
}

// afterChanged works out the portals of the ports named again and applies
// the change; false when it cannot (two ports' portals collide at one
// destination), leaving everything as it was.
func (c *portalCapture) afterChanged(prev, snap *lb.Snapshot, names []lb.ServicePortName, version uint64, fes frontendLister) (bool, error) {
	now := make(map[lb.ServicePortName][]portals.Portal, len(names))
	targets := make(map[lb.ServicePortName]portalTargets, len(names))
	for _, name := range names {
		t := targetsOf(fes.PortFrontends(name))
		now[name], targets[name] = portalsOf(snap.Ports.Get(name), t, c.local.has), t
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var del, add []portals.Portal
	keys := map[portals.Dest]int32{} // the counts of the destinations touched, after the change
	for _, name := range names {
		var was []portals.Portal
		if t, ok := c.byPort[name]; ok {
			was = portalsOf(prev.Ports.Get(name), c.addrs.get(t), c.local.has)
		}
		for _, p := range was {
			k := portals.DestOf(p)
			if _, ok := keys[k]; !ok {
				keys[k] = c.keys[k]
			}
			keys[k]--
			del = append(del, p)
		}
		for _, p := range now[name] {
			k := portals.DestOf(p)
			if _, ok := keys[k]; !ok {
				keys[k] = c.keys[k]
			}
			keys[k]++
			add = append(add, p)
		}
	}
	for k, n := range keys {
		if n > 1 || n == 1 && !slices.ContainsFunc(add, func(p portals.Portal) bool { return portals.DestOf(p) == k }) {
			return false, nil // collides with a port not in the change
		}
	}
	for k, n := range keys {
		if n == 0 {
			delete(c.keys, k)
		} else {
			c.keys[k] = n
		}
	}
	for name, ps := range now {
		if len(ps) == 0 {
			delete(c.byPort, name)
		} else {
			c.byPort[name] = c.addrs.hold(targets[name])
		}
	}
	c.frontsSeen = version
	c.partials++
	var errs []error
	for _, f := range c.fams {
		err := errWholeNeeded
		if ch, ok := f.(portalChanger); ok {
			err = ch.change(del, add)
		}
		if errors.Is(err, errWholeNeeded) {
			err = f.sync(c.allLocked())
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	c.failed = len(errs) > 0
	return true, errors.Join(errs...)
}

// allLocked is every portal worked out, by service port name.
func (c *portalCapture) allLocked() []portals.Portal {
	if c.snap == nil {
		return nil
	}
	return allPortals(c.snap, c.byPort, &c.addrs, c.local.has)
}

// allPortals is the portals of every port of byPort in snap, redirected
// where byPort says (its addresses in addrs), by service port name.
func allPortals(snap *lb.Snapshot, byPort map[lb.ServicePortName]heldTargets, addrs *targetAddrs, isLocal func(netip.Addr) bool) []portals.Portal {
	var out []portals.Portal
	for _, n := range slices.SortedFunc(maps.Keys(byPort), lb.ServicePortName.Compare) {
		out = append(out, portalsOf(snap.Ports.Get(n), addrs.get(byPort[n]), isLocal)...)
	}
	return out
}

// resync is the plane's Tick (once a minute): it syncs the portals again
// only when the last sync failed. A flush behind sluice's back is the
// watch's (every --iptables-sync-period); syncing every family each
// minute anyway was a whole iptables-restore of the portal chains a
// minute with the iptables method.
func (c *portalCapture) resync() error {
	c.mu.Lock()
	failed := c.failed
	c.mu.Unlock()
	if !failed {
		return nil
	}
	return c.retry()
}

// retry syncs every family outside an Apply, and tells resynced when it
// mends a failed sync.
func (c *portalCapture) retry() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	failed := c.failed
	err := c.syncAllLocked()
	if err == nil && failed && c.resynced != nil {
		c.resynced()
	}
	return err
}

func (c *portalCapture) setResynced(f func()) {
	c.mu.Lock()
	c.resynced = f
	c.mu.Unlock()
}

// syncAll makes every family's portals the last worked out.
func (c *portalCapture) syncAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.syncAllLocked()
}

func (c *portalCapture) syncAllLocked() error {
	var errs []error
	for _, f := range c.fams {
		if err := f.sync(c.allLocked()); err != nil {
			errs = append(errs, err)
		}
	}
	c.failed = len(errs) > 0
	return errors.Join(errs...)
}

// portalTargets are where a port's portals redirect: its proxy port
// (to), and its external proxy port (eto; to when it has none).
type portalTargets struct{ to, eto netip.AddrPort }

// heldTargets are portalTargets as the capture keeps them, by port: each
// address's IP as its index in a targetAddrs (0: no address) and its port.
// The listeners' addresses are a few IPs (the bind address, with one
// capture port a single address), and two netip.AddrPorts per port made
// the capture's map of every port 128 bytes a slot (issue 16's memory
// budget); these make it 80.
type heldTargets struct{ to, eto heldAddr }

type heldAddr struct {
	ip   uint32
	port uint16
}

// targetAddrs numbers the IPs portal targets name, from 1. It only grows:
// the IPs are those listeners were bound to.
type targetAddrs struct {
	mu    sync.Mutex
	ips   []netip.Addr // by number less one
	index map[netip.Addr]uint32
}

func (a *targetAddrs) hold(t portalTargets) heldTargets {
	a.mu.Lock()
	defer a.mu.Unlock()
	return heldTargets{a.holdAddr(t.to), a.holdAddr(t.eto)}
}

func (a *targetAddrs) holdAddr(ap netip.AddrPort) heldAddr {
	if !ap.IsValid() {
		return heldAddr{}
	}
	ip := ap.Addr()
	n, ok := a.index[ip]
	if !ok {
		if a.index == nil {
			a.index = map[netip.Addr]uint32{}
		}
		a.ips = append(a.ips, ip)
		n = uint32(len(a.ips))
		a.index[ip] = n
	}
	return heldAddr{n, ap.Port()}
}

func (a *targetAddrs) get(h heldTargets) portalTargets {
	a.mu.Lock()
	defer a.mu.Unlock()
	return portalTargets{a.addr(h.to), a.addr(h.eto)}
}

func (a *targetAddrs) addr(h heldAddr) netip.AddrPort {
	if h.ip == 0 {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a.ips[h.ip-1], h.port)
}

// targetsOf is where the portals of a port with these frontends redirect
// (to invalid: nowhere, it has no proxy port).
func targetsOf(fes []listeners.Frontend) portalTargets {
	var t portalTargets
	for _, fe := range fes {
		switch fe.Role {
		case listeners.RoleProxyPort:
			t.to = fe.Addr
		case listeners.RoleExternalProxyPort:
			t.eto = fe.Addr
		}
	}
	if !t.eto.IsValid() {
		t.eto = t.to
	}
	return t
}

// targetsByPort is targetsOf for every port with a proxy port among fes,
// its addresses held in addrs.
func targetsByPort(fes []listeners.Frontend, addrs *targetAddrs) map[lb.ServicePortName]heldTargets {
	byPort := map[lb.ServicePortName][]listeners.Frontend{}
	for _, fe := range fes {
		if fe.Role == listeners.RoleProxyPort || fe.Role == listeners.RoleExternalProxyPort {
			byPort[fe.Service] = append(byPort[fe.Service], fe)
		}
	}
	out := make(map[lb.ServicePortName]heldTargets, len(byPort))
	for name, fes := range byPort {
		if t := targetsOf(fes); t.to.IsValid() {
			out[name] = addrs.hold(t)
		}
	}
	return out
}

// portalsFor is every portal, by service port name: each service port's
// ClusterIPs redirected to its proxy port, and its non-local external
// and load-balancer IPs to its external proxy port (or the proxy port
// when it has none). An address of the other family than its proxy
// port's listener is not captured.
func portalsFor(snap *lb.Snapshot, fes []listeners.Frontend, isLocal func(netip.Addr) bool) []portals.Portal {
	var addrs targetAddrs
	return allPortals(snap, targetsByPort(fes, &addrs), &addrs, isLocal)
}

// portalsOf is portalsFor for one port (nil: gone) redirected to t.
func portalsOf(sp *lb.ServicePort, t portalTargets, isLocal func(netip.Addr) bool) []portals.Portal {
	if sp == nil || !t.to.IsValid() {
		return nil
	}
	to, eto := t.to, t.eto
	var out []portals.Portal
	add := func(ip netip.Addr, to netip.AddrPort, ranges []netip.Prefix) {
		if !to.IsValid() || ip.Is4() != to.Addr().Is4() {
			return
		}
		out = append(out, portals.Portal{Service: sp.Name.String(), Protocol: sp.Name.Protocol, IP: ip, Port: sp.Port, To: to, SourceRanges: ranges})
	}
	for _, ip := range sp.ClusterIPs {
		add(ip, to, nil)
	}
	for _, ip := range sp.ExternalIPs() {
		if isLocal == nil || !isLocal(ip) {
			add(ip, eto, nil)
		}
	}
	for _, ip := range sp.LoadBalancerIPs() {
		if isLocal == nil || !isLocal(ip) {
			add(ip, eto, sp.SourceRanges())
		}
	}
	return out
}

// bindCapture assigns every service IP to the capture interface before
// the listeners bind them, and removes the ones no longer used after.
type bindCapture struct {
	mu     sync.Mutex // Apply and Tick run on different goroutines
	binder *portals.Binder
	last   []netip.Addr
	// failed: the last assignment or removal failed; resynced is told
	// when a resync then makes the addresses last's.
	failed   bool
	resynced func()
}

func (c *bindCapture) setResynced(f func()) {
	c.mu.Lock()
	c.resynced = f
	c.mu.Unlock()
}

func serviceIPs(snap *lb.Snapshot) []netip.Addr {
	set := map[netip.Addr]bool{}
	for _, sp := range snap.Ports.All() {
		for _, ip := range slices.Concat(sp.ClusterIPs, sp.ExternalIPs(), sp.LoadBalancerIPs()) {
			set[ip] = true
		}
	}
	out := make([]netip.Addr, 0, len(set))
	for ip := range set {
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func (c *bindCapture) before(snap *lb.Snapshot) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = serviceIPs(snap)
	err := c.binder.Ensure(c.last)
	c.failed = err != nil
	return err
}

func (c *bindCapture) after(*lb.Snapshot, uint64, frontendLister) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.binder.Prune(c.last)
	c.failed = c.failed || err != nil
	return err
}

// resync assigns the service IPs again (an address removed behind
// sluice's back comes back), and after a failure removes the unused ones
// too; one that mends a failure tells resynced.
func (c *bindCapture) resync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.binder.Ensure(c.last)
	if err == nil && c.failed {
		err = c.binder.Prune(c.last)
	}
	if err == nil && c.failed && c.resynced != nil {
		c.resynced()
	}
	c.failed = err != nil
	return err
}
func (c *bindCapture) close() {}
