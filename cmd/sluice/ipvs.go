package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/kernel/ipvs"
	"github.com/sluice-proxy/sluice/kernel/portals"
	"github.com/sluice-proxy/sluice/lb"
)

// ipvsInterface is kube-proxy's dummy interface for IPVS service addresses.
const ipvsInterface = "kube-ipvs0"

// ipvsPlane programs IPVS for both families, binds service addresses to
// kube-ipvs0, drains removed TCP real servers every --ipvs-drain-interval
// and resyncs every --ipvs-sync-period (repairing what others changed).
type ipvsPlane struct {
	kernel   *ipvs.Netlink
	proxiers []*ipvs.Proxier
	filters  []*ipvs.Netfilter // per family, beside proxiers
	binder   *portals.Binder
	cfg      *config.Config
	local    *localAddrs
	metrics  *admin.Metrics
	log      *slog.Logger
	stop     chan struct{}
	done     chan struct{}

	latestState
	loopback  loopbackWarner
	noLocal   noLocalTally        // for sync_proxy_rules_no_local_endpoints_total
	conntrack conntrackReconciler // under latestState's mu, as the syncs are
	backoff   syncBackoff         // under latestState's mu, as the syncs are
	failed    bool                // the last sync failed in part

	// What the syncs keep between them, so that an update touches only
	// what changed (issue 16).
	svcAddrs     serviceAddrTally
	bound        map[netip.Addr]bool // the addresses kube-ipvs0 must hold, both families
	localVersion uint64              // p.local's version when others was listed
	others       []netip.Addr        // the local addresses but sluice's on kube-ipvs0, sorted
}

// newIPVSPlane returns an error wrapping ipvs.ErrUnavailable when the
// kernel cannot do IPVS mode (no ip_vs, no scheduler, no dummy link type).
func newIPVSPlane(cfg *config.Config, local *localAddrs, metrics *admin.Metrics, log *slog.Logger) (*ipvsPlane, error) {
	k, err := ipvs.NewNetlink()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ipvs.ErrUnavailable, err)
	}
	if err := ipvs.Detect(k, cfg.KubeProxy.IPVS.Scheduler); err != nil {
		k.Close()
		return nil, err
	}
	b := &portals.Binder{Table: portals.Netlink{}, Interface: ipvsInterface, DummyOnly: true, Adopt: true}
	if _, err := b.Init(); err != nil {
		k.Close()
		return nil, fmt.Errorf("%w: %v", ipvs.ErrUnavailable, err)
	}
	sysctls := map[string]string{
		"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
		"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/ip_forward": "1",
	}
	if cfg.KubeProxy.IPVS.StrictARP {
		sysctls["net/ipv4/conf/all/arp_ignore"] = "1"
		sysctls["net/ipv4/conf/all/arp_announce"] = "2"
	}
	for k, v := range sysctls {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			log.Warn("IPVS mode: sysctl not set", "sysctl", k, "value", v, "err", err)
		}
	}
	ip := cfg.KubeProxy.IPVS
	if ip.TCPTimeout.Duration > 0 || ip.TCPFinTimeout.Duration > 0 || ip.UDPTimeout.Duration > 0 {
		if err := k.SetTimeouts(int64(ip.TCPTimeout.Seconds()), int64(ip.TCPFinTimeout.Seconds()), int64(ip.UDPTimeout.Seconds())); err != nil {
			log.Warn("IPVS mode: timeouts not set", "err", err)
		}
	}
	exclude := ipvsExcludeCIDRs(cfg)
	p := &ipvsPlane{kernel: k, binder: b, cfg: cfg, local: local, metrics: metrics, log: log, stop: make(chan struct{}), done: make(chan struct{}),
		loopback: loopbackWarner{mode: "ipvs", log: log}, noLocal: noLocalTally{byService: true}, backoff: syncBackoff{max: resyncEvery(cfg.KubeProxy.IPVS.SyncPeriod.Duration)}}
	sets := &ipvs.IPSetExec{}
	if _, err := sets.List(); err != nil {
		k.Close()
		return nil, fmt.Errorf("%w: IPVS mode needs ipset for its masquerade rules: %v", ipvs.ErrUnavailable, err)
	}
	for _, fam := range probeFamilies(cfg.IPTablesBackend) {
		r := fam.runner
		if err := fam.err; err != nil {
			if !fam.v6 {
				k.Close()
				return nil, fmt.Errorf("%w: IPVS mode needs iptables for its masquerade rules: %v", ipvs.ErrUnavailable, err)
			}
			log.Warn("IPVS mode: IPv6 disabled", "err", err)
			continue
		}
		o := iptablesOptions(cfg, fam.v6, local.node)
		p.proxiers = append(p.proxiers, &ipvs.Proxier{Kernel: k, ExcludeCIDRs: exclude,
			Options: ipvs.Options{IPv6: fam.v6, Scheduler: ip.Scheduler}})
		p.filters = append(p.filters, &ipvs.Netfilter{Sets: sets, IPTables: r, IPv6: fam.v6,
			MasqueradeBit: o.MasqueradeBit, MasqueradeAll: o.MasqueradeAll, Local: o.Local, RandomFully: r.HasRandomFully()})
	}
	sched := ip.Scheduler
	if sched == "" {
		sched = "rr"
	}
	log.Info("IPVS mode", "scheduler", sched, "interface", ipvsInterface)
	go p.loop()
	return p, nil
}

// nodeIPs are the addresses NodePorts get virtual servers on: the
// --nodeport-addresses selection, else every local address but loopback,
// link-local and the service addresses (on kube-ipvs0). p.svcAddrs and
// p.others must have been brought up to date.
func (p *ipvsPlane) nodeIPs() []netip.Addr {
	all := p.others
	if sel := selectNodePortAddrs(p.cfg.KubeProxy.NodePortAddresses, all); sel != nil {
		all = sel
	}
	var out []netip.Addr
	for _, a := range all {
		if !a.IsLoopback() && !a.IsLinkLocalUnicast() && !p.svcAddrs.has(a) {
			out = append(out, a)
		}
	}
	return out
}

func (p *ipvsPlane) Apply(snap *lb.Snapshot) error {
	return p.applyNewest(snap, func(s *lb.Snapshot) error { return p.sync(s, false) })
}

// applyLocked applies snap comparing everything with the kernel, as the
// periodic resync does.
func (p *ipvsPlane) applyLocked(snap *lb.Snapshot) error { return p.sync(snap, true) }

// sync brings IPVS, kube-ipvs0 and the sets to snap. Unless full, each
// proxier and set sync touches only the ports snap says changed, when it
// can (ipvs.Proxier.SyncChanged, ipvs.Netfilter.SyncChanged).
func (p *ipvsPlane) sync(snap *lb.Snapshot, full bool) error {
	// As the iptables and nftables planes (issue 18): after failed syncs,
	// wait 1 s, 2 s, ... (at most the resync period) before the next one,
	// which the loop runs with the newest state.
	if d := p.backoff.wait(); d > 0 {
		return fmt.Errorf("IPVS mode: %w", errBackingOff{p.backoff.failures, d})
	}
	p.loopback.check(snap)
	p.noLocal.update(snap)
	p.svcAddrs.update(snap)
	if v := p.local.version(); v != p.localVersion || p.bound == nil {
		// The host's addresses changed, if only by what the last sync
		// bound to kube-ipvs0 (so look again only then: at 10,000
		// Services there are 10,000 of those). When those of other
		// interfaces changed, IsLocal's answers and the node IPs may
		// have too: compare everything.
		p.localVersion = v
		if others := p.local.listExcept(p.binder.Has); !slices.Equal(others, p.others) || p.bound == nil {
			p.others = others
			full = true
		}
	}
	if p.bound == nil {
		p.bound = map[netip.Addr]bool{}
	}
	nodeIPs := p.nodeIPs()
	var errs []error
	changes := make([]ipvs.BindChange, len(p.proxiers))
	anyFull := false
	var add, del []netip.Addr
	for i, px := range p.proxiers {
		px.Options.NodeIPs = nodeIPs
		// Local on another interface than kube-ipvs0.
		px.Options.IsLocal = func(a netip.Addr) bool { _, ok := slices.BinarySearchFunc(p.others, a, netip.Addr.Compare); return ok }
		var bc ipvs.BindChange
		var err error
		if full {
			bc.Full = true
			bc.All, err = px.Sync(snap)
		} else {
			bc, err = px.SyncChanged(snap)
		}
		if err != nil {
			errs = append(errs, err)
		}
		changes[i] = bc
		if bc.Full {
			anyFull = true
			for a := range p.bound {
				if a.Is6() == px.Options.IPv6 {
					delete(p.bound, a)
				}
			}
			for _, a := range bc.All {
				p.bound[a] = true
			}
			continue
		}
		for _, a := range bc.Del {
			delete(p.bound, a)
		}
		for _, a := range bc.Add {
			p.bound[a] = true
		}
		add, del = append(add, bc.Add...), append(del, bc.Del...)
	}
	var listed []netip.Addr // boundList's, once made
	boundList := func() []netip.Addr {
		if listed != nil {
			return listed
		}
		out := make([]netip.Addr, 0, len(p.bound))
		for a := range p.bound {
			out = append(out, a)
		}
		slices.SortFunc(out, netip.Addr.Compare)
		listed = out
		return out
	}
	if anyFull {
		bind := boundList()
		if err := p.binder.Ensure(bind); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ipvsInterface, err))
		}
		if err := p.binder.Prune(bind); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ipvsInterface, err))
		}
	} else if err := p.binder.Change(add, del); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", ipvsInterface, err))
	}
	for i, nf := range p.filters {
		var err error
		if full {
			err = nf.Sync(snap, p.proxiers[i].Options, boundList())
		} else {
			_, err = nf.SyncChanged(snap, p.proxiers[i].Options, changes[i], boundList)
		}
		if err != nil {
			p.metrics.RestoreFailed(familyName(nf.IPv6), false)
			errs = append(errs, err)
		}
		p.conntrack.reconcile(snap, nf.IPv6, p.local, p.metrics, p.log) // as in iptables mode
		in, ex := p.noLocal.get(nf.IPv6)
		p.metrics.NoLocalEndpoints(familyName(nf.IPv6), in, ex)
	}
	p.failed = len(errs) > 0
	p.backoff.done(p.failed)
	return errors.Join(errs...)
}

// serviceAddrTally counts the service ports that have each address as a
// cluster, external or load-balancer IP, kept in step with the snapshots
// from their deltas (a walk of every port took about 2 ms at 10,000).
type serviceAddrTally struct {
	snap   *lb.Snapshot
	counts map[netip.Addr]int
}

func (t *serviceAddrTally) update(snap *lb.Snapshot) {
	defer func() { t.snap = snap }()
	if eachChanged(t.snap, snap, func(old, sp *lb.ServicePort) { t.add(old, -1); t.add(sp, +1) }) {
		return
	}
	t.counts = map[netip.Addr]int{}
	for _, sp := range snap.Ports.All() {
		t.add(sp, +1)
	}
}

func (t *serviceAddrTally) add(sp *lb.ServicePort, sign int) {
	if sp == nil {
		return
	}
	for _, ip := range slices.Concat(sp.ClusterIPs, sp.ExternalIPs(), sp.LoadBalancerIPs()) {
		if t.counts[ip] += sign; t.counts[ip] == 0 {
			delete(t.counts, ip)
		}
	}
}

func (t *serviceAddrTally) has(a netip.Addr) bool { return t.counts[a] > 0 }

func (p *ipvsPlane) backoffWait() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.backoff.wait()
}

func (p *ipvsPlane) loop() {
	defer close(p.done)
	drain := time.NewTicker(p.cfg.IPVSDrainInterval)
	defer drain.Stop()
	every := resyncEvery(p.cfg.KubeProxy.IPVS.SyncPeriod.Duration)
	resync := time.NewTimer(every)
	defer resync.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-drain.C:
			for _, px := range p.proxiers {
				if n, err := px.Drain(); err != nil {
					p.log.Warn("IPVS: draining real servers", "err", err)
				} else if n > 0 {
					p.log.Info("IPVS: drained real servers deleted", "count", n)
				}
			}
		case <-resync.C:
			// IPVS mode reapplies its state every period, as kube-proxy's;
			// after a failure, sooner: when the back-off lets it.
			if d := p.backoffWait(); d > 0 {
				resync.Reset(min(d, every))
				continue
			}
			if err := p.reapplyNewest(p.applyLocked); err != nil {
				p.log.Error("IPVS resync failed", "err", err)
			}
			next := every
			if d := p.backoffWait(); d > 0 {
				next = min(d, every)
			}
			resync.Reset(next)
		}
	}
}

// Close stops the loops; virtual servers stay until --cleanup, as
// kube-proxy's do.
func (p *ipvsPlane) Close() {
	close(p.stop)
	<-p.done
	p.kernel.Close()
}

func (p *ipvsPlane) Dump() any {
	p.mu.Lock()
	defer p.mu.Unlock()
	draining := map[string][]string{}
	for _, px := range p.proxiers {
		for k, as := range px.Draining() {
			for _, a := range as {
				draining[k.String()] = append(draining[k.String()], a.String())
			}
		}
	}
	n := 0
	if p.last != nil {
		n = p.last.Ports.Len()
	}
	return map[string]any{"mode": "ipvs", "servicePorts": n, "draining": draining}
}

func (p *ipvsPlane) Tick() {}

// ipvsExcludeCIDRs parses --ipvs-exclude-cidrs (validated at start-up).
func ipvsExcludeCIDRs(cfg *config.Config) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cfg.KubeProxy.IPVS.ExcludeCIDRs {
		if pf, err := netip.ParsePrefix(c); err == nil {
			out = append(out, pf)
		}
	}
	return out
}

// cleanupIPVS removes IPVS mode's iptables rules and ipsets, then deletes
// every virtual server outside --ipvs-exclude-cidrs (as kube-proxy's
// cleanup flushes IPVS) and kube-ipvs0, when the kernel has IPVS at all.
// It runs before the iptables mode's clean-up: IPVS mode's chains jump to
// chains the two modes share.
func cleanupIPVS(cfg *config.Config, log *slog.Logger) error {
	var nfErrs []error
	var sets ipvs.SetRunner
	if _, err := (&ipvs.IPSetExec{}).List(); err == nil {
		sets = &ipvs.IPSetExec{}
	}
	for _, fam := range probeFamilies(cfg.IPTablesBackend) {
		r := fam.runner
		if err := fam.err; err != nil {
			continue
		}
		if err := ipvs.CleanupNetfilter(r, sets, fam.v6); err != nil {
			nfErrs = append(nfErrs, err)
		}
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		return errors.Join(nfErrs...) // no IPVS here: no virtual server can have been installed
	}
	k, err := ipvs.NewNetlink()
	if err != nil {
		return err
	}
	defer k.Close()
	errs := nfErrs
	if err := ipvs.Cleanup(k, ipvsExcludeCIDRs(cfg)); err != nil {
		errs = append(errs, err)
	}
	if err := (portals.Netlink{}).DeleteLink(ipvsInterface); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		log.Info("cleanup: IPVS virtual servers outside --ipvs-exclude-cidrs and kube-ipvs0 removed")
	}
	return errors.Join(errs...)
}
