package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/conntrack"
	"github.com/sluice-proxy/sluice/kernel/iptables"
	"github.com/sluice-proxy/sluice/kernel/nfacct"
	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// dataPlane is what a proxy mode does with snapshots.
type dataPlane interface {
	Apply(*lb.Snapshot) error
	Dump() any
	Tick() // once a minute
}

// userspacePlane is the listeners' server as a dataPlane, with its VIP
// capture around it; each listener that could not be opened is counted.
type userspacePlane struct {
	*listeners.Server
	capture vipCapture
	metrics *admin.Metrics
	health  *admin.Health
	log     *slog.Logger
}

// RetryListeners opens again, with back-off, the listeners that failed to
// open (a port another process held); /healthz is unhealthy until every
// one is open.
func (u userspacePlane) RetryListeners() {
	if u.Server.Unserved() == 0 {
		return
	}
	left, err := u.Server.RetryFailed()
	for _, e := range unjoin(err) {
		u.metrics.ListenerError()
		u.log.Warn("listener still cannot be opened; retrying with back-off", "err", e)
	}
	u.health.SetUnserved(left)
}

// captureError is a failure of the VIP capture, which the capture retries
// itself (its resync) and, once the retry has captured the newest state,
// tells (setResynced).
type captureError struct{ err error }

func (e *captureError) Error() string { return "VIP capture: " + e.err.Error() }
func (e *captureError) Unwrap() error { return e.err }

// setResynced passes on to the capture what its successful retry of a
// failed sync tells: the proxy's health, as a kernel mode's resync does.
func (u userspacePlane) setResynced(f func()) {
	if c, ok := u.capture.(interface{ setResynced(func()) }); ok {
		c.setResynced(f)
	}
}

// pendingAfter reports whether a failed Apply leaves its change pending
// until the capture's retry captures it: when the capture failed, since
// ClusterIPs are then not served as the state says, as a kernel mode's
// rules would not be; a listener that could not be opened makes /healthz
// 503 at once instead (SetUnserved) and clears it when a retry opens it.
func (u userspacePlane) pendingAfter(err error) bool {
	var ce *captureError
	_, tells := u.capture.(interface{ setResynced(func()) })
	return tells && errors.As(err, &ce)
}

func (u userspacePlane) Apply(snap *lb.Snapshot) error {
	var errs []error
	if err := u.capture.before(snap); err != nil {
		errs = append(errs, &captureError{err})
	}
	if err := u.Server.Apply(snap); err != nil {
		for range unjoin(err) {
			u.metrics.ListenerError()
		}
		errs = append(errs, err)
	}
	u.health.SetUnserved(u.Server.Unserved())
	// Frontends only when the capture asks: listing and sorting every
	// listener costs tens of milliseconds at 10k services.
	if err := u.capture.after(snap, u.Server.FrontendsVersion(), u.Server); err != nil {
		errs = append(errs, &captureError{err})
	}
	return errors.Join(errs...)
}

func (u userspacePlane) Dump() any { return u.Server.Dump() }

// Tick expires affinity pins and re-applies the VIP capture, which a
// firewall reload may have flushed.
func (u userspacePlane) Tick() {
	u.ExpirePins()
	if err := u.capture.resync(); err != nil {
		u.log.Warn("VIP capture resync failed", "err", err)
	}
}

// iptablesCommands returns the family's binaries for a backend.
func iptablesCommands(backend string) (v4, v6 string) {
	switch backend {
	case "nft", "legacy":
		return "iptables-" + backend, "ip6tables-" + backend
	}
	return "iptables", "ip6tables"
}

// ipFamily is one address family's iptables binary (of --iptables-backend)
// and whether its nat table can be read (err nil), with that table's
// chains.
type ipFamily struct {
	v6     bool
	runner *iptables.Exec
	err    error
	nat    []string
}

// probeFamilies returns IPv4, then IPv6, probed.
func probeFamilies(backend string) []ipFamily {
	v4, v6 := iptablesCommands(backend)
	var out []ipFamily
	for _, f := range []struct {
		cmd string
		v6  bool
	}{{v4, false}, {v6, true}} {
		r := &iptables.Exec{Command: f.cmd}
		nat, err := r.Chains("nat")
		out = append(out, ipFamily{v6: f.v6, runner: r, err: err, nat: nat})
	}
	return out
}

// loopbackWarner warns, once per service port, about endpoints on
// loopback addresses: the kernel modes' DNAT cannot reach them (the API
// server refuses them; manifests do not).
type loopbackWarner struct {
	mode   string
	log    *slog.Logger
	warned map[lb.ServicePortName]bool
	// checked is the snapshot checked last: the next one's delta over it
	// names the only ports to check (6 ms for every endpoint at 10k
	// Services x 10).
	checked uint64
}

func (w *loopbackWarner) check(snap *lb.Snapshot) {
	if w.warned == nil {
		w.warned = map[lb.ServicePortName]bool{}
	}
	defer func() { w.checked = snap.ID }()
	if names, ok := snap.DeltaSince(w.checked); ok {
		for _, name := range names {
			if sp := snap.Ports.Get(name); sp != nil {
				w.checkPort(name, sp)
			}
		}
		return
	}
	for name, sp := range snap.Ports.All() {
		w.checkPort(name, sp)
	}
}

func (w *loopbackWarner) checkPort(name lb.ServicePortName, sp *lb.ServicePort) {
	for _, ep := range sp.Endpoints {
		if ep.Addr.Addr().IsLoopback() && !w.warned[name] {
			w.warned[name] = true
			w.log.Warn("endpoints on loopback addresses are not reachable in "+w.mode+" mode (use userspace mode for them)",
				"service", name.String(), "endpoint", ep.Addr.String())
		}
	}
}

// iptablesPlane programs iptables per family. Each Apply is a full sync;
// a failed sync is retried, and a vanished canary (a firewall reload)
// forces a resync, every --iptables-sync-period.
type iptablesPlane struct {
	proxiers []*iptables.Proxier
	cfg      *config.Config
	local    *localAddrs
	metrics  *admin.Metrics
	log      *slog.Logger
	stop     chan struct{}
	done     chan struct{}

	latestState
	failed    bool
	loopback  loopbackWarner
	noLocal   noLocalTally
	conntrack conntrackReconciler // under latestState's mu, as the syncs are
	backoff   syncBackoff
}

// latestState is a kernel plane's newest snapshot and the lock its syncs
// run under (which also guards the plane's other sync state). A periodic
// resync re-applies the newest snapshot read under that same lock, so it
// can never put an older state back over a newer one.
type latestState struct {
	mu   sync.Mutex
	last *lb.Snapshot
	// resynced is told when a resync has applied the newest state: the
	// proxy's health, which a failed sync leaves pending (applier.publish).
	resynced func()
}

// setResynced sets what a successful resync tells.
func (l *latestState) setResynced(f func()) {
	l.mu.Lock()
	l.resynced = f
	l.mu.Unlock()
}

// pendingAfter: every failed sync of a kernel plane is retried by its
// resync.
func (l *latestState) pendingAfter(error) bool { return true }

// applyNewest records snap as the newest and applies it with apply, under
// the lock.
func (l *latestState) applyNewest(snap *lb.Snapshot, apply func(*lb.Snapshot) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = snap
	return apply(snap)
}

// reapplyNewest applies the newest snapshot again, if there is one.
func (l *latestState) reapplyNewest(apply func(*lb.Snapshot) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		return nil
	}
	if err := apply(l.last); err != nil {
		return err
	}
	if l.resynced != nil {
		l.resynced()
	}
	return nil
}

func iptablesOptions(cfg *config.Config, v6 bool, node nodeFacts) iptables.Options {
	o := iptables.Options{IPv6: v6, MasqueradeBit: 14, MasqueradeAll: cfg.KubeProxy.IPTables.MasqueradeAll}
	if b := cfg.KubeProxy.IPTables.MasqueradeBit; b != nil {
		o.MasqueradeBit = int(*b)
	}
	o.LocalhostNodePorts = localhostNodePorts(cfg) && !v6
	o.Local = localMatch(cfg, v6, node.podCIDRs)
	return o
}

func newIPTablesPlane(cfg *config.Config, local *localAddrs, metrics *admin.Metrics, log *slog.Logger) (*iptablesPlane, error) {
	p := &iptablesPlane{cfg: cfg, local: local, metrics: metrics, log: log, stop: make(chan struct{}), done: make(chan struct{}),
		backoff:  syncBackoff{max: resyncEvery(cfg.KubeProxy.IPTables.SyncPeriod.Duration)},
		loopback: loopbackWarner{mode: "iptables", log: log}}
	// As kube-proxy: the INVALID drop and localhost NodePorts count into
	// nfacct counters, for their metrics, when the kernel has
	// nfnetlink_acct.
	invalid := ensureNFAcct(nfacct.InvalidDropped, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
		"Packets dropped by iptables mode because conntrack found them invalid.", metrics, log)
	localhost := ensureNFAcct(nfacct.LocalhostNodePortsAccepted, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
		"Packets accepted on NodePorts of the loopback interface (IPv4).", metrics, log)
	var families []string
	for _, fam := range probeFamilies(cfg.IPTablesBackend) {
		r := fam.runner
		if err := fam.err; err != nil {
			if !fam.v6 {
				return nil, fmt.Errorf("iptables mode: %s cannot read the nat table: %w", r.Command, err)
			}
			log.Warn("iptables mode: IPv6 rules disabled", "err", err)
			continue
		}
		o := iptablesOptions(cfg, fam.v6, local.node)
		o.RandomFully = r.HasRandomFully() // as kube-proxy: when iptables has it
		o.TCPBeLiberal = tcpBeLiberal()
		o.InvalidDropCounter = invalid
		o.LocalhostNodePortCounter = localhost
		p.proxiers = append(p.proxiers, &iptables.Proxier{Runner: r, Options: o, Log: log})
		families = append(families, familyName(fam.v6))
	}
	metrics.SetFamilies(families...)
	if localhostNodePorts(cfg) {
		// kube-proxy sets this so DNAT of 127.0.0.1:NodePort works.
		if err := setRouteLocalnet(); err != nil {
			log.Warn("localhost NodePorts: cannot set net.ipv4.conf.all.route_localnet=1", "err", err)
		} else {
			log.Info("Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses")
		}
	}
	log.Info("iptables mode", "backend", cfg.IPTablesBackend, "families", len(p.proxiers))
	go p.loop(cfg.KubeProxy.IPTables.SyncPeriod.Duration)
	return p, nil
}

// Apply syncs every family.
func (p *iptablesPlane) Apply(snap *lb.Snapshot) error { return p.applyNewest(snap, p.applyLocked) }

func (p *iptablesPlane) applyLocked(snap *lb.Snapshot) error {
	if d := p.backoff.wait(); d > 0 {
		return fmt.Errorf("iptables mode: %w", errBackingOff{p.backoff.failures, d})
	}
	p.loopback.check(snap)
	p.noLocal.update(snap)
	var errs []error
	nodeIPs := p.local.list()
	for _, px := range p.proxiers {
		px.Options.NodePortAddresses = nodePortAddrsFor(p.cfg.KubeProxy.NodePortAddresses, nodeIPs, px.Options.IPv6)
		px.Options.NodeIPs = nodeIPs
		start := time.Now()
		st, err := px.SyncStats(snap)
		if err != nil {
			p.metrics.RestoreFailed(family(px), !st.Full)
			errs = append(errs, &familyError{family(px), fmt.Errorf("%s: %w", family(px), err)})
			continue
		}
		familySynced(p.metrics, &p.noLocal, px.Options.IPv6, st.Full, time.Since(start))
		p.metrics.IPTablesRules(family(px), st.FilterRules, st.NATRules, st.NATRulesTotal)
		p.conntrack.reconcile(snap, px.Options.IPv6, p.local, p.metrics, p.log)
	}
	p.failed = len(errs) > 0
	p.backoff.done(p.failed)
	return errors.Join(errs...)
}

// ensureNFAcct creates the nfacct counter name and exports it as metric,
// returning name, or "" (and a log line) when the kernel has no
// nfnetlink_acct: the rules then count nothing, as kube-proxy's.
func ensureNFAcct(name, metric, help string, m *admin.Metrics, log *slog.Logger) string {
	if err := (nfacct.Netlink{}).Ensure(name); err != nil {
		log.Info("iptables mode: no nfacct counter; its metric is not exported", "counter", name, "metric", metric, "err", err)
		return ""
	}
	m.NFAcctCounter(metric, help, func() (uint64, error) { return nfacct.Netlink{}.Packets(name) })
	return name
}

// noLocalEndpoint is one port's count toward kube-proxy's
// sync_proxy_rules_no_local_endpoints_total, for one IP family: 1 for each
// Local policy (internal, external) of a port that has endpoints but none
// on this node (nil: none).
func noLocalEndpoint(sp *lb.ServicePort, v6 bool) (internal, external int) {
	if sp == nil || !slices.ContainsFunc(sp.ClusterIPs, func(a netip.Addr) bool { return (a.Is6() && !a.Is4In6()) == v6 }) {
		return 0, 0
	}
	if !sp.HasUsable(false) || sp.HasUsable(true) {
		return 0, 0
	}
	if sp.InternalLocal {
		internal = 1
	}
	if sp.ExternalLocal && (sp.NodePort != 0 || len(sp.ExternalIPs()) > 0 || len(sp.LoadBalancerIPs()) > 0) {
		external = 1
	}
	return internal, external
}

// eachChanged calls move with the version in prev and in snap (either
// nil) of each port snap says changed since prev, and reports whether
// it could: false when snap is not prev with changes (then walk every
// port instead).
func eachChanged(prev, snap *lb.Snapshot, move func(old, sp *lb.ServicePort)) bool {
	if prev == nil {
		return false
	}
	names, ok := snap.DeltaSince(prev.ID)
	if !ok {
		return false
	}
	for _, n := range names {
		move(prev.Ports.Get(n), snap.Ports.Get(n))
	}
	return true
}

// noLocalTally keeps the noLocalEndpoint counts of both families in step
// with the snapshots a kernel plane applies: from each snapshot's delta
// over the one before (issue 16: O(changed) per sync, where the walk took
// 17 ms per family at 10k Services), else by walking every port.
type noLocalTally struct {
	snap   *lb.Snapshot
	counts [2][2]int // IPv4, IPv6: internal, external
	// byService counts Services rather than service ports, as kube-proxy's
	// IPVS mode does (it keeps a set of Service names; its iptables and
	// nftables modes count ports).
	byService bool
	ports     [2][2]map[string]int // with byService: each Service's ports counted
}

func (t *noLocalTally) update(snap *lb.Snapshot) {
	defer func() { t.snap = snap }()
	if eachChanged(t.snap, snap, func(old, sp *lb.ServicePort) { t.add(old, -1); t.add(sp, +1) }) {
		return
	}
	t.counts, t.ports = [2][2]int{}, [2][2]map[string]int{}
	for _, sp := range snap.Ports.All() {
		t.add(sp, +1)
	}
}

func (t *noLocalTally) add(sp *lb.ServicePort, sign int) {
	for f, v6 := range []bool{false, true} {
		in, ex := noLocalEndpoint(sp, v6)
		if !t.byService {
			t.counts[f][0] += sign * in
			t.counts[f][1] += sign * ex
			continue
		}
		for p, n := range [2]int{in, ex} {
			if n == 0 {
				continue
			}
			m := t.ports[f][p]
			if m == nil {
				m = map[string]int{}
				t.ports[f][p] = m
			}
			key := sp.Name.Namespace + "/" + sp.Name.Name
			if m[key] += sign; m[key] == 0 {
				delete(m, key)
			}
			t.counts[f][p] = len(m)
		}
	}
}

// get returns one family's counts.
func (t *noLocalTally) get(v6 bool) (internal, external int) {
	f := 0
	if v6 {
		f = 1
	}
	return t.counts[f][0], t.counts[f][1]
}

func family(px *iptables.Proxier) string { return familyName(px.Options.IPv6) }

// familyError is a failed sync of one IP family of a kernel mode whose
// families sync apart: the others may have synced (applier.publish).
type familyError struct {
	family string
	err    error
}

func (e *familyError) Error() string { return e.err.Error() }
func (e *familyError) Unwrap() error { return e.err }

// failedFamilies names the families err says failed alone (familyError),
// each once.
func failedFamilies(err error) []string {
	var out []string
	for _, e := range unjoin(err) {
		var fe *familyError
		if errors.As(e, &fe) && !slices.Contains(out, fe.family) {
			out = append(out, fe.family)
		}
	}
	return out
}

// familyName is an IP family as the metrics and logs name it.
func familyName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// perFamilySyncs marks a plane whose families sync apart: their
// durations go into the sync histogram per ip_family (familySynced).
func (p *iptablesPlane) perFamilySyncs() {}

// familySynced records a kernel mode's sync of one family: its duration,
// full or partial, and the Local ports left without a local endpoint (as
// counted by noLocal, brought to the snapshot synced).
func familySynced(m *admin.Metrics, noLocal *noLocalTally, v6, full bool, took time.Duration) {
	m.FamilySynced(familyName(v6), full, took)
	in, ex := noLocal.get(v6)
	m.NoLocalEndpoints(familyName(v6), in, ex)
}

// conntrackReconciler deletes, after a kernel mode's sync of one family,
// the UDP and SCTP conntrack entries still DNATed to endpoints that are
// gone (or never translated, from before the port had endpoints), which
// would keep their clients stuck until they idle out. Only a change to a
// UDP or SCTP port (or to the host's addresses, for NodePorts) can leave
// such entries, so when the snapshot says what changed since the one last
// reconciled and none of it is UDP or SCTP, the whole conntrack table is
// not read at all, and otherwise only the changed ports are matched
// (issue 16: each sync read the table and built maps of every port).
type conntrackReconciler struct {
	// del deletes one family's entries that stale matches; default the
	// kernel's table (conntrack.Netlink).
	del func(v6 bool, stale func(conntrack.Flow) bool) (int, error)

	snapID   [2]uint64 // per family, the snapshot last reconciled (0: none)
	localVer [2]uint64 // and the host addresses' version then
}

func (r *conntrackReconciler) reconcile(snap *lb.Snapshot, v6 bool, local *localAddrs, m *admin.Metrics, log *slog.Logger) {
	f := 0
	if v6 {
		f = 1
	}
	ver := local.version()
	match := snap // the ports whose flows may be stale
	if names, ok := snap.DeltaSince(r.snapID[f]); ok && r.snapID[f] != 0 && ver == r.localVer[f] {
		changed := map[lb.ServicePortName]*lb.ServicePort{}
		for _, n := range names {
			if n.Protocol != lb.UDP && n.Protocol != lb.SCTP {
				continue
			}
			if sp := snap.Ports.Get(n); sp != nil {
				changed[n] = sp
			}
		}
		if len(changed) == 0 {
			r.snapID[f] = snap.ID
			return
		}
		match = lb.NewSnapshot(changed)
	}
	del := r.del
	if del == nil {
		del = func(v6 bool, stale func(conntrack.Flow) bool) (int, error) {
			return conntrack.Netlink{IPv6: v6}.DeleteMatching(stale)
		}
	}
	start := time.Now()
	n, err := del(v6, conntrack.Stale(match, local.has))
	m.ConntrackReconciled(familyName(v6), time.Since(start), n)
	r.snapID[f], r.localVer[f] = 0, ver
	switch {
	case err != nil:
		log.Warn("conntrack: stale entries not deleted", "family", familyName(v6), "err", err)
		return // the next sync reads the whole table again
	case n > 0:
		log.Info("conntrack: deleted stale UDP entries", "family", familyName(v6), "entries", n)
	}
	r.snapID[f] = snap.ID
}

// resyncLoop is a kernel plane's periodic check: every period it asks why
// the newest state must be applied again ("" for no reason) and, if there
// is a reason, reapplies it: logged as a full resync unless the reason is
// routine (stale nftables chains to delete). It returns when stop closes.
func resyncLoop(every time.Duration, stop <-chan struct{}, mode string, log *slog.Logger, why func() (reason string, routine bool), resync func() error, backoff func() time.Duration) {
	every = resyncEvery(every)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		// The next check comes at the period, or when a sync deferred by
		// the back-off may run, if that is sooner.
		next := every
		if d := backoff(); d > 0 && d < next {
			next = d
		}
		t.Reset(next)
		if d := backoff(); d > 0 {
			continue
		}
		reason, routine := why()
		switch {
		case reason == "":
			continue
		case routine:
			log.Debug(mode+": sync", "why", reason)
		default:
			log.Warn(mode+": full resync", "why", reason)
		}
		if err := resync(); err != nil {
			log.Error(mode+" resync failed", "err", err)
		} else if !routine {
			log.Info(mode + ": resynced")
		}
	}
}

func (p *iptablesPlane) loop(every time.Duration) {
	defer close(p.done)
	resyncLoop(every, p.stop, "iptables", p.log, func() (string, bool) { return p.resyncReason(), false }, func() error { return p.reapplyNewest(p.applyLocked) }, p.backoffWait)
}

// resyncEvery is a plane's resync period (kube-proxy's default 30 s).
func resyncEvery(d time.Duration) time.Duration {
	if d <= 0 {
		return 30 * time.Second
	}
	return d
}

func (p *iptablesPlane) backoffWait() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.backoff.wait()
}

// resyncReason: a failed last sync, or a flush (the canary gone). It only
// decides; reapplyNewest takes the newest state itself.
func (p *iptablesPlane) resyncReason() string {
	p.mu.Lock()
	last, failed := p.last, p.failed
	p.mu.Unlock()
	if last == nil {
		return ""
	}
	reason := ""
	if failed {
		reason = "the last sync failed"
	}
	for _, px := range p.proxiers {
		if px.CanaryGone() {
			reason = "KUBE-PROXY-CANARY is gone (tables flushed)"
		}
	}
	return reason
}

// Close stops the resync loop; the rules stay (as kube-proxy's do) until
// --cleanup.
func (p *iptablesPlane) Close() {
	close(p.stop)
	<-p.done
}

func (p *iptablesPlane) Dump() any {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	if p.last != nil {
		n = p.last.Ports.Len()
	}
	fams := []string{}
	for _, px := range p.proxiers {
		fams = append(fams, family(px))
	}
	return map[string]any{"mode": "iptables", "families": fams, "servicePorts": n, "lastSyncFailed": p.failed}
}

func (p *iptablesPlane) Tick() {}

// cleanup removes what every sluice mode installs: the iptables mode's and
// the userspace portals' chains and jump rules, for both families, with
// the binaries of --iptables-backend, and the bind capture's interface and
// addresses. A family whose binary is missing or whose kernel
// support is absent has nothing to remove.
// tcpBeLiberal reads net.netfilter.nf_conntrack_tcp_be_liberal, as
// kube-proxy does at start-up: when set, out-of-window packets are not
// INVALID and the INVALID drop is left out.
func tcpBeLiberal() bool {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")
	return err == nil && strings.TrimSpace(string(b)) != "0"
}

// routeLocalnet is the node-wide (per network namespace) sysctl that lets
// traffic to 127.0.0.0/8 be routed: what localhost NodePorts need, and
// what lets neighbours reach 127.0.0.1 services (CVE-2020-8558), so it is
// set only when needed and put back by --cleanup.
const routeLocalnet = "/proc/sys/net/ipv4/conf/all/route_localnet"

// localhostNodePorts is kube-proxy's effective iptables.localhostNodePorts:
// the setting, forced off unless --nodeport-addresses lets NodePorts
// answer on 127.0.0.1 (no selection at all, or a CIDR holding it).
func localhostNodePorts(cfg *config.Config) bool {
	if lnp := cfg.KubeProxy.IPTables.LocalhostNodePorts; lnp == nil || !*lnp {
		return false
	}
	specs := cfg.KubeProxy.NodePortAddresses
	if len(specs) == 0 {
		return true
	}
	for _, s := range specs {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil && p.Contains(netip.MustParseAddr("127.0.0.1")) {
			return true
		}
	}
	return false
}

// routeLocalnetMark is where the sysctl's value before sluice changed it
// is kept, per network namespace, for --cleanup.
func routeLocalnetMark() string {
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		ns = "unknown"
	}
	return filepath.Join(handoverDir, "route_localnet-"+strings.Trim(strings.TrimPrefix(ns, "net:"), "[]")+".was")
}

// setRouteLocalnet sets route_localnet to 1, remembering that it was 0.
func setRouteLocalnet() error {
	was, err := os.ReadFile(routeLocalnet)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(was)) == "1" {
		return nil
	}
	if err := os.MkdirAll(handoverDir, 0o700); err == nil {
		os.WriteFile(routeLocalnetMark(), was, 0o600)
	}
	return os.WriteFile(routeLocalnet, []byte("1"), 0o644)
}

// restoreRouteLocalnet puts back the value setRouteLocalnet changed.
func restoreRouteLocalnet(log *slog.Logger) {
	mark := routeLocalnetMark()
	was, err := os.ReadFile(mark)
	if err != nil {
		return // not changed by sluice
	}
	if err := os.WriteFile(routeLocalnet, was, 0o644); err != nil {
		log.Warn("cleanup: cannot restore net.ipv4.conf.all.route_localnet", "err", err)
		return
	}
	os.Remove(mark)
	log.Info("cleanup: net.ipv4.conf.all.route_localnet restored", "value", strings.TrimSpace(string(was)))
}

// cleanupOtherModes removes what the other kernel modes leave behind, as
// kube-proxy does when it starts (platformCleanup): a kernel mode's rules
// stay after its process exits, so a node switched from one mode to
// another (or from kube-proxy in one mode to sluice in another) would go
// on serving the old mode's rules, with endpoints that no longer change,
// beside the new ones. In nftables mode that is iptables mode's and IPVS
// mode's rules; in iptables and IPVS mode, nftables mode's table. Best
// effort, as kube-proxy's: a failure is logged and the mode starts.
//
// kube-proxy has no userspace mode. There every kernel mode's rules are in
// the way (their filter rules reject Services that had no endpoints when
// they stopped, their NAT rules send traffic to the endpoints of then):
// as the node's proxy, with the Kubernetes API for its source, sluice
// removes them all; standalone, on manifests, it may share the host with
// a cluster's own kube-proxy, and only warns.
func cleanupOtherModes(cfg *config.Config, mode string, log *slog.Logger) {
	if mode == config.ModeUserspace && !apiConfigured(cfg) {
		var found []string
		for _, fam := range probeFamilies(cfg.IPTablesBackend) {
			if slices.Contains(fam.nat, iptables.ChainServices) {
				found = append(found, fam.runner.Command)
			}
		}
		for _, fam := range nftablesLeftover() {
			found = append(found, "nftables "+fam)
		}
		if len(found) > 0 {
			log.Warn("kube-proxy rules on this host (another proxy's, or left by one) may take Service traffic before sluice's capture; sluice --cleanup removes them", "in", strings.Join(found, ", "))
		}
		return
	}
	quiet := slog.New(slog.DiscardHandler) // the clean-ups' own lines are --cleanup's
	var errs []error
	if mode == config.ModeNFTables || mode == config.ModeUserspace {
		if err := cleanupIPVS(cfg, quiet); err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode's: %w", err))
		}
		for _, fam := range probeFamilies(cfg.IPTablesBackend) {
			if fam.err != nil {
				continue // no usable iptables: no iptables mode's rules
			}
			if err := iptables.CleanupLeftovers(fam.runner, iptablesOptions(cfg, fam.v6, nodeFacts{})); err != nil {
				errs = append(errs, fmt.Errorf("iptables mode's (%s): %w", fam.runner.Command, err))
			}
		}
	}
	if mode != config.ModeNFTables {
		if err := cleanupNFTables(quiet); err != nil {
			errs = append(errs, fmt.Errorf("nftables mode's: %w", err))
		}
	}
	for _, err := range errs {
		log.Warn("cannot remove another proxy mode's leftover rules", "err", err)
	}
}

func cleanup(cfg *config.Config, log *slog.Logger) error {
	var errs []error
	if runtime.GOOS == "linux" {
		restoreRouteLocalnet(log)
	}
	if err := cleanupIPVS(cfg, log); err != nil {
		errs = append(errs, fmt.Errorf("IPVS: %w", err))
	}
	if runtime.GOOS == "linux" {
		if err := cleanupNFTables(log); err != nil {
			errs = append(errs, err)
		}
		if err := cleanupNFTablesCapture(); err != nil {
			errs = append(errs, fmt.Errorf("nftables portals: %w", err))
		}
	}
	for _, fam := range probeFamilies(cfg.IPTablesBackend) {
		r := fam.runner
		if err := fam.err; err != nil {
			log.Info("cleanup: skipping a family with no usable iptables", "command", r.Command, "err", err)
			continue
		}
		// kubelet's KUBE-FIREWALL stays, as kube-proxy's --cleanup leaves it.
		if err := errors.Join(iptables.CleanupLeftovers(r, iptablesOptions(cfg, fam.v6, nodeFacts{})), portals.CleanupIPTables(r)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Command, err))
			continue
		}
		log.Info("cleanup: iptables chains and jump rules removed (iptables mode and userspace portals)", "command", r.Command)
	}
	if runtime.GOOS == "linux" {
		if err := portals.CleanupAddrs(portals.Netlink{}, ""); err != nil {
			errs = append(errs, fmt.Errorf("bind capture: %w", err))
		} else {
			log.Info("cleanup: bind capture interface and addresses removed", "interface", portals.DefaultInterface)
		}
	}
	return errors.Join(errs...)
}
