// Command sluice is a drop-in replacement for kube-proxy whose default mode
// is a userspace L4 load balancer. This package only wires the pieces
// together: flags and config file into config.Config, then run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/affinity"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/controlplane"
	"github.com/sluice-proxy/sluice/controlplane/kube"
	"github.com/sluice-proxy/sluice/handover"
	"github.com/sluice-proxy/sluice/lb"
	"github.com/sluice-proxy/sluice/listeners"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "v0.1.0-dev"

// kubeProxyCompat is the kube-proxy release whose flags and config we follow.
const kubeProxyCompat = "v1.34"

// cpuLimitEvery is how often the cgroup CPU limit is read again
// (cpuLimitWatch).
const cpuLimitEvery = 30 * time.Second

// kubeProxyEmulationVersion is the Kubernetes release whose kube-proxy
// sluice behaves as, for /statusz's emulation version (its binary version
// is sluice's own).
const kubeProxyEmulationVersion = "1.34"

// main runs until SIGTERM, SIGINT or SIGHUP, each of which drains up to
// --drain-timeout and exits 0. SIGHUP drains rather than reloads: the
// manifests and the API are watched, and a rewritten --config file ends
// the process as it ends kube-proxy (configWatch); Go's default for
// SIGHUP, an exit at once, cut streaming clients with what looked to them
// like a clean end of their data.
func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() { cancel(stopSignal{<-sigs}) }() // later signals are caught and ignored: the drain goes on
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	signal.Stop(sigs)
	os.Exit(code)
}

// errHandedOver ends a sluice whose successor serves (hitless restart).
var errHandedOver = errors.New("handed over to a successor")

// servedCounters wires the data path's counters to the metrics: the
// metrics make each port's, srv keeps them with the port and lists them
// at scrape time, and a removed port's series go with it.
func servedCounters(srv *listeners.Server, m *admin.Metrics) {
	srv.Counters = func(lb.ServicePortName) listeners.Counters { return m.NewPortCounters() }
	m.SetPortSeries(func(yield func(lb.ServicePortName, *admin.PortCounters)) {
		srv.EachCounters(func(n lb.ServicePortName, c listeners.Counters) {
			if pc, ok := c.(*admin.PortCounters); ok {
				yield(n, pc)
			}
		})
	})
}

// stopSignal is the cause of the run's end when a signal asked for it.
type stopSignal struct{ os.Signal }

func (s stopSignal) Error() string { return "signal " + s.String() }

// signalName names the signal that ended ctx, or "" when none did.
func signalName(ctx context.Context) string {
	switch s := context.Cause(ctx).(type) {
	case stopSignal:
		return s.String()
	case serviceStopped:
		return s.Error()
	}
	if errors.Is(context.Cause(ctx), errConfigChanged) {
		return "none: the --config file changed"
	}
	return ""
}

// modeOrigin says where the proxy mode came from, for the start-up log: a
// kube-proxy user expects iptables by default, and sluice's is userspace.
func modeOrigin(cfg *config.Config) string {
	switch {
	case slices.Contains(cfg.Changed, "proxy-mode"):
		return "the --proxy-mode flag"
	case cfg.ConfigFile != "" && cfg.FileMode != "":
		return "mode in " + cfg.ConfigFile
	case cfg.ConfigFile != "":
		return "the default: mode is empty in " + cfg.ConfigFile + ", which is userspace to sluice (iptables to kube-proxy)"
	}
	return "the default (sluice's is userspace; kube-proxy's is iptables)"
}

// manifestsRejected is why serve stops when the first load of --manifests
// is refused.
type manifestsRejected struct {
	path string
	err  error
}

func (e manifestsRejected) Error() string {
	return fmt.Sprintf("manifests rejected at start-up: %v", e.err)
}

func (e manifestsRejected) Unwrap() error { return e.err }

// run is the whole program; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return runStatus(ctx, args[1:], stdout, stderr)
	}
	cfg, usage, err := config.Parse(args)
	if config.IsHelp(err) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice: %v\n", err)
		return 1
	}
	switch cfg.Version {
	case "true":
		fmt.Fprintf(stdout, "sluice %s (kube-proxy %s compatible, %s %s/%s)\n", version, kubeProxyCompat, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "raw":
		json.NewEncoder(stdout).Encode(map[string]string{"gitVersion": version, "kubeProxyCompatibility": kubeProxyCompat,
			"goVersion": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH})
		return 0
	}
	if cfg.WriteConfigTo != "" {
		if err := cfg.WriteFile(cfg.WriteConfigTo); err != nil {
			fmt.Fprintf(stderr, "sluice: --write-config-to: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote configuration to %s\n", cfg.WriteConfigTo)
		return 0
	}
	body := func(ctx context.Context) int { return runConfigured(ctx, cfg, args, stdout, stderr) }
	if cfg.KubeProxy.WindowsRunAsService && runtime.GOOS == "windows" {
		code, err := serveAsWindowsService(ctx, body)
		if err != nil {
			fmt.Fprintf(stderr, "sluice: --windows-service: %v\n", err)
			return 1
		}
		return code
	}
	return body(ctx)
}

// runConfigured runs sluice with a parsed configuration until ctx ends; it
// returns the exit code.
func runConfigured(ctx context.Context, cfg *config.Config, args []string, stdout, stderr io.Writer) int {
	log, verbosity := newLogger(cfg, stdout, stderr)
	klog.SetSlogLogger(log) // client-go logs through klog: one log stream
	routeLogrus(log)        // and moby/ipvs through logrus
	for _, w := range cfg.ConfigWarnings {
		log.Warn(w) // kube-proxy's "Using lenient decoding as strict decoding failed"
	}
	if cfg.Cleanup {
		if err := cleanup(cfg, log); err != nil {
			log.Error("cleanup failed", "err", err)
			return 1
		}
		return 0
	}
	if unused := cfg.UnusedFlags(); len(unused) > 0 {
		log.Info("flags accepted for kube-proxy compatibility but not used in this mode", "mode", cfg.Mode(), "flags", strings.Join(unused, ","))
	}
	if cfg.InitOnly {
		return 0 // userspace mode needs no privileged initialisation
	}
	if err := prepareProcess(cfg, log); err != nil {
		log.Warn("process setup", "err", err)
	}
	if cfg.ConfigFile != "" {
		// The configuration as parsed, before this process adjusts it, is
		// what a rewritten file is compared with.
		running, _, _ := config.Parse(args)
		watched, stopWatch := context.WithCancelCause(ctx)
		watch := configWatch{path: cfg.ConfigFile, log: log, after: time.After, parse: func() (*config.Config, error) {
			c, _, err := config.Parse(args)
			return c, err
		}}
		watching := make(chan struct{})
		go func() {
			defer close(watching)
			if err := watch.run(watched, running, func() { stopWatch(errConfigChanged) }); err != nil {
				log.Warn("cannot watch the --config file; a change will be read at the next restart", "path", cfg.ConfigFile, "err", err)
			}
		}()
		defer func() { stopWatch(nil); <-watching }()
		ctx = watched
	}
	cfg.HandoverSocket = handoverPath(cfg.HandoverSocket, args)
	if err := serve(ctx, cfg, log, verbosity, stdout); err != nil {
		var rej manifestsRejected
		if errors.As(err, &rej) {
			// One line per problem, each naming its file, object and field
			// (joined, they were one line with literal \n in it).
			problems := unjoin(rej.err)
			for _, e := range problems {
				log.Error("manifest rejected at start-up", "err", e)
			}
			log.Error("nothing served: fix the manifests above and start again", "path", rej.path, "problems", len(problems))
			return 1
		}
		log.Error(err.Error())
		return 1
	}
	if errors.Is(context.Cause(ctx), errConfigChanged) {
		log.Error(errConfigChanged.Error(), "path", cfg.ConfigFile)
		return 1 // as kube-proxy: its supervisor starts it again
	}
	return 0
}

func apiConfigured(cfg *config.Config) bool {
	return cfg.KubeProxy.ClientConnection.Kubeconfig != "" || cfg.Master != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != ""
}

// primaryWildcard is the any-address of the node's primary family, from
// --bind-address: where the health-check node ports listen when
// --nodeport-addresses selects none, as kube-proxy's do.
func primaryWildcard(cfg *config.Config) string {
	if a, err := netip.ParseAddr(cfg.KubeProxy.BindAddress); err == nil && a.Is6() && !a.Is4In6() {
		return "::"
	}
	return "0.0.0.0"
}

// halfCloseTimeout is how long a connection one side of which has closed
// may stay silent in userspace mode: the CLOSE_WAIT timeout kube-proxy
// gives conntrack (--conntrack-tcp-timeout-close-wait, 1 h by default),
// which is when a kernel mode forgets such a connection; 0 there leaves
// the kernel's own default, 60 s.
func halfCloseTimeout(cfg *config.Config) time.Duration {
	if d := cfg.KubeProxy.Conntrack.TCPCloseWaitTimeout; d != nil {
		if d.Duration == 0 {
			return 60 * time.Second
		}
		return d.Duration
	}
	return time.Hour
}

// manifestMaxBytes maps --manifest-max-bytes (0: no limit) onto
// ManifestSource.MaxBytes (0: the default, negative: no limit).
func manifestMaxBytes(cfg *config.Config) int64 {
	if cfg.ManifestMaxBytes == 0 {
		return -1
	}
	return cfg.ManifestMaxBytes
}

// serve runs userspace mode until ctx ends, then drains.
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger, verbosity *logVerbosity, stdout io.Writer) error {
	switch {
	case cfg.Manifests != "" && apiConfigured(cfg):
		return errors.New("two service sources given: --manifests and the Kubernetes API (--kubeconfig, --master or in-cluster KUBERNETES_SERVICE_HOST); choose one")
	case cfg.Manifests == "" && !apiConfigured(cfg):
		return errors.New("no service source: pass --kubeconfig (or --master, or run in a cluster) to watch the Kubernetes API, or --manifests PATH (a file or directory of Service and EndpointSlice manifests)")
	}
	metrics := admin.NewMetrics()
	metrics.ProcessStart = time.Now()
	syncEvery, minSync := cfg.SyncPeriods()
	health := admin.NewHealth(2*syncEvery, nil) // kube-proxy's healthz timeout
	local := &localAddrs{}
	if w, err := newAddrWatch(); err == nil {
		local.watch = w
		defer w.Close()
	} else {
		log.Info("local addresses are listed before every apply", "why", err)
	}

	// Hitless restart: take the listening sockets of a sluice running with
	// the same command line before binding anything; it retires once this
	// one serves.
	ctx, retire := context.WithCancelCause(ctx)
	defer retire(nil)
	broker := &handover.Broker{}
	var pred *handover.Predecessor
	if path := cfg.HandoverSocket; path != "" {
		p, err := handover.Connect(path, broker, 10*time.Second)
		switch {
		case err != nil:
			log.Warn("hand-over: the running sluice did not answer; binding anew", "path", path, "err", err)
		case p != nil:
			log.Info("hand-over: took the listening sockets of the running sluice", "path", path)
			pred = p
		}
	}

	var (
		plane    dataPlane
		srv      *listeners.Server
		engineOf = "kernel"

		drain = func() {}
	)
	mode := cfg.Mode()
	log.Info("proxy mode", "mode", mode, "from", modeOrigin(cfg))
	// fallback moves to the next mode when the kernel lacks what this one
	// needs, saying why, unless --mode-fallback=false.
	fallback := func(err error, to string) error {
		if !cfg.ModeFallback {
			return fmt.Errorf("--proxy-mode=%s: %w (--mode-fallback=false)", mode, err)
		}
		log.Warn(fmt.Sprintf("proxy mode %s is unavailable; falling back to %s mode", mode, to), "why", err.Error())
		mode = to
		return nil
	}
	if mode == config.ModeKernelspace { // taken on Windows only (config.Validate)
		if ferr := fallback(errors.New("sluice has no HNS load balancers (kube-proxy's kernelspace); its userspace mode serves the Services"), config.ModeUserspace); ferr != nil {
			return ferr
		}
	}
	// kube-proxy's PreferSameTrafficDistribution gate (beta, on by
	// default): off, the node hints are not read.
	ignoreNodeHints := !cfg.GateEnabled("PreferSameTrafficDistribution")
	// With --manifests, the source is made here: the Node is in its files,
	// and what its first read decoded for the Node, Load does not decode
	// again.
	var manifests *controlplane.ManifestSource
	if cfg.Manifests != "" {
		manifests = &controlplane.ManifestSource{Path: cfg.Manifests, Log: log, NodeName: nodeName(cfg), IgnoreNodeHints: ignoreNodeHints,
			MaxBytes: manifestMaxBytes(cfg)}
	}
	// What the Node says (its addresses for "primary", its pod CIDRs for
	// NodeCIDR) is learnt before the planes read it, as kube-proxy's
	// NodeManager does before its proxiers are made.
	if needPods, needIPs := nodeFactsNeeded(cfg, mode); needPods || needIPs {
		facts, err := learnNodeFacts(ctx, cfg, needPods, kubeProxyNodeWait(), manifests)
		if ctx.Err() != nil {
			log.Info("stopped while waiting for the Node")
			return nil
		}
		if err != nil {
			return err
		}
		local.node = facts
		if needPods {
			log.Info("detect-local-mode NodeCIDR", "node", nodeName(cfg), "podCIDRs", strings.Join(facts.podCIDRs, ","))
		}
	}
	cfg.KubeProxy.NodePortAddresses = local.node.nodePortAddresses(cfg.KubeProxy.NodePortAddresses, cfg.KubeProxy.BindAddress, func(msg string) { log.Warn(msg) })
	if mode != config.ModeUserspace {
		// The kernel modes' NAT lives in conntrack; set before the planes
		// read it (nf_conntrack_tcp_be_liberal decides the INVALID drop).
		applyConntrack(cfg, log)
	}
	if mode == config.ModeNFTables {
		pn, err := newNFTablesPlane(cfg, local, metrics, log)
		if err != nil {
			if ferr := fallback(err, config.ModeIPTables); ferr != nil {
				return ferr
			}
		} else {
			plane = pn
			defer pn.Close()
		}
	}
	if mode == config.ModeIPVS {
		pv, err := newIPVSPlane(cfg, local, metrics, log)
		if err != nil {
			if ferr := fallback(err, config.ModeIPTables); ferr != nil {
				return ferr
			}
		} else {
			plane = pv
			defer pv.Close()
		}
	}
	if mode == config.ModeIPTables {
		ipt, err := newIPTablesPlane(cfg, local, metrics, log)
		if err != nil {
			if ferr := fallback(err, config.ModeUserspace); ferr != nil {
				return ferr
			}
		} else {
			plane = ipt
			defer ipt.Close()
		}
	}
	// The mode is settled, fall-backs included (no plane has synced yet):
	// what the other modes left goes, as kube-proxy's start-up removes it.
	if runtime.GOOS == "linux" {
		cleanupOtherModes(cfg, mode, log)
	}
	if mode == config.ModeUserspace {
		// A container's CPU limit bounds the default number of event loops
		// (an explicit --event-loops is kept as given).
		var cpuLimit float64
		sizedByLimit := cfg.Engine == listeners.EngineEventLoop && cfg.EventLoops == 0
		readLimit := func() (float64, error) { return listeners.CgroupCPULimit(os.DirFS("/")) }
		// The CPUs the engine sizes its loops by (it raises GOMAXPROCS):
		// the watch below counts loops as a restart would.
		loopCPUs := min(runtime.GOMAXPROCS(0), runtime.NumCPU())
		if sizedByLimit {
			var err error
			if cpuLimit, err = readLimit(); err != nil {
				log.Warn("cannot read the cgroup CPU limit; event loops are sized by the CPUs alone", "err", err)
			}
		}
		engine, err := listeners.New(cfg.Engine, listeners.Options{BusyPoll: cfg.BusyPoll, NoIOUring: !cfg.IOUring, Loops: cfg.EventLoops,
			CPULimit: cpuLimit, HalfCloseTimeout: halfCloseTimeout(cfg), Sockets: broker, Log: log})
		if err != nil {
			return fmt.Errorf("--engine: %w", err)
		}
		engineOf = engine.Name() + " engine"
		if l, ok := engine.(interface{ Loops() int }); ok {
			ioUring := "on: each turn's reads and writes batched"
			if r, ok := engine.(ringEngine); ok {
				if r.IOUring() != nil {
					ioUring = "off: " + r.IOUring().Error()
				}
				metrics.EventLoopRings(r.IOUringLoops, r.IOUringFailures, r.IOUringOps)
			}
			metrics.EventLoops(l.Loops(), cpuLimit)
			attrs := []any{"engine", engine.Name(), "loops", l.Loops(), "busyPoll", cfg.BusyPoll, "ioUring", ioUring}
			if cpuLimit > 0 {
				attrs = append(attrs, "cpuLimit", cpuLimit)
			}
			log.Info("userspace engine", attrs...)
			engineOf = fmt.Sprintf("%s engine (%d loops)", engine.Name(), l.Loops())
			if sizedByLimit && runtime.GOOS == "linux" {
				w := &cpuLimitWatch{read: readLimit, cpus: loopCPUs, loops: l.Loops(), limit: cpuLimit, log: log}
				tick := time.NewTicker(cpuLimitEvery)
				defer tick.Stop()
				go w.run(ctx, tick.C)
			}
		}
		// Validated in userspace mode; after a fall-back from a kernel mode,
		// which does not use it, an invalid one means random proxy ports.
		pr, _ := config.ParsePortRange(cfg.KubeProxy.PortRange)
		proxyPorts := listeners.NewPortAllocator(pr.Base, pr.Size)
		if pr.Base == 0 {
			// Random proxy ports, picked from the kernel's ephemeral range
			// by sluice rather than by a bind to port 0 (see
			// listeners.NewEphemeralPortAllocator for why).
			var err error
			if proxyPorts, err = ephemeralProxyPorts(os.ReadFile); err != nil {
				log.Debug("random proxy ports left to the kernel", "err", err)
			}
		}
		srv = &listeners.Server{
			Engine:      engine,
			BindAddress: netip.MustParseAddr(cfg.KubeProxy.BindAddress),
			ProxyPorts:  proxyPorts,
			IsLocal:     local.has,
			NodePortAddrs: func() []netip.Addr {
				return selectNodePortAddrs(cfg.KubeProxy.NodePortAddresses, local.list())
			},
			Retry:      lb.RetryPolicy{Attempts: cfg.ConnectAttempts, TryTimeouts: cfg.ConnectTimeouts, Budget: cfg.ConnectBudget},
			Ejection:   lb.EjectionPolicy{Failures: cfg.EjectAfter, Backoff: cfg.EjectBackoff, MaxBackoff: cfg.EjectMaxBackoff},
			UDPTimeout: cfg.UDPTimeout,
			Clock:      affinity.SystemClock{},
			Log:        log,
		}
		servedCounters(srv, metrics)
		srv.SCTPSkipped = metrics.SCTPSkipped
		var sctpEngine *listeners.SCTP
		if err := listeners.SCTPSupported(); err != nil {
			srv.SCTPWhy = err.Error()
		} else {
			sctpEngine = listeners.NewSCTP(listeners.Options{Sockets: broker}, nil)
			srv.SCTP = sctpEngine
		}
		capture, err := chooseCapture(cfg, srv, local, log)
		if err != nil {
			return err
		}
		defer capture.close()
		if port := cfg.UserspaceCapturePort; port != 0 {
			if !srv.CaptureExternal { // bind or none: nothing redirects to a port
				return fmt.Errorf("--userspace-capture-port=%d: the VIP capture in use does not redirect (it needs nftables or iptables)", port)
			}
			srv.CapturePort = uint16(port)
			if err := srv.OpenCapture(); err != nil {
				return fmt.Errorf("--userspace-capture-port=%d: %w", port, err)
			}
			log.Info("userspace capture port: every TCP service port is served on one listener", "port", port)
		}
		plane = userspacePlane{Server: srv, capture: capture, metrics: metrics, health: health, log: log}
		drain = func() {
			dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
			defer cancel()
			if err := engine.Shutdown(dctx); err != nil {
				log.Warn("drain cut open connections", "after", cfg.DrainTimeout)
			}
			if sctpEngine != nil {
				if err := sctpEngine.Shutdown(dctx); err != nil {
					log.Warn("drain cut open SCTP associations", "after", cfg.DrainTimeout)
				}
			}
		}
	}
	svcHealth := &admin.ServiceHealth{
		Addrs:        func() []netip.Addr { return selectNodePortAddrs(cfg.KubeProxy.NodePortAddresses, local.list()) },
		ProxyHealthy: func() bool { ok, _, _ := health.Healthy(); return ok },
		Listen:       brokerListen(broker),
		Wildcard:     primaryWildcard(cfg),
	}
	defer svcHealth.Close()
	sink := &applier{plane: plane, local: local, health: health, metrics: metrics, log: log, first: make(chan struct{}), svcHealth: svcHealth,
		release: make(chan struct{}, 1)}
	sink.followResyncs()

	ep := &admin.Endpoints{Health: health, Metrics: metrics, ProxyMode: mode, Profiling: cfg.KubeProxy.EnableProfiling,
		SetVerbosity: verbosity.Set, Dump: plane.Dump, NodeName: nodeName(cfg), Configz: cfg.Configz()}
	// kube-proxy's zpages, behind its alpha gates.
	if cfg.GateEnabled("ComponentFlagz") {
		ep.Flagz = cfg.FlagValues
	}
	if cfg.GateEnabled("ComponentStatusz") {
		ep.Statusz = &admin.Statusz{Started: metrics.ProcessStart, GoVersion: runtime.Version(),
			BinaryVersion: version, EmulationVersion: kubeProxyEmulationVersion}
	}
	hz, err := admin.ServeWith(cfg.HealthzAddress(), ep.HealthzHandler(), brokerListen(broker))
	if err != nil {
		return fmt.Errorf("--healthz-bind-address %s: %w", cfg.HealthzAddress(), err)
	}
	defer hz.Close()
	ms, err := admin.ServeWith(cfg.MetricsAddress(), ep.MetricsHandler(), brokerListen(broker))
	if err != nil {
		return fmt.Errorf("--metrics-bind-address %s: %w", cfg.MetricsAddress(), err)
	}
	defer ms.Close()

	startCollection{getenv: os.Getenv, setPercent: debug.SetGCPercent, log: log}.until(ctx, sink.first)
	var (
		run    func(context.Context) error
		source string
	)
	if src := manifests; src != nil {
		sink.source = "manifests"
		src.Sink, src.Resync, src.Coalesce, src.Reserved = sink, cfg.KubeProxy.ConfigSyncPeriod.Duration, cfg.ManifestCoalesce, ownHostPorts(cfg, mode)
		src.NodePodCIDRs = podCIDRsWatch(cfg, mode, local.node.podCIDRs, func() { retire(errPodCIDRsChanged) })
		src.NodeEligible, src.NodeZone = health.SetNodeEligible, health.SetNodeZone
		if err := src.Load(); err != nil {
			drain()
			return manifestsRejected{path: cfg.Manifests, err: err}
		}
		run, source = src.Run, cfg.Manifests
	} else {
		sink.source = "kubernetes"
		client, host, err := newKubeClient(cfg)
		if err != nil {
			return err
		}
		src := &kube.Source{Client: client, Sink: sink, Log: log, NodeName: nodeName(cfg), IgnoreNodeHints: ignoreNodeHints,
			Resync: cfg.KubeProxy.ConfigSyncPeriod.Duration, MinSyncPeriod: minSync,
			NodeEligible: health.SetNodeEligible, NodeZone: health.SetNodeZone, Changes: metrics,
			NodePodCIDRs: podCIDRsWatch(cfg, mode, local.node.podCIDRs, func() { retire(errPodCIDRsChanged) }),
			Skipped:      func(err error) { metrics.Rejected("kubernetes", controlplane.Culprits(err)) },
			// The applier's hand-back, delayed, does it: one collection
			// for the initial list and the first state.
			ReleaseMemory: sink.askRelease}
		if np, ok := plane.(*nftablesPlane); ok && np != nil {
			src.ServiceCIDRs = np.SetServiceCIDRs
		}
		run, source = src.Run, "the Kubernetes API at "+host
		log.Info("watching the Kubernetes API", "server", host, "node", src.NodeName)
		sink.events = newKubeEvents(client, src.NodeName)
		defer sink.events.stop()
		sink.events.starting()
	}

	var wg sync.WaitGroup
	srcCtx, stopSrc := context.WithCancel(ctx)
	defer stopSrc()
	wg.Go(func() {
		handBack{asks: sink.release, after: time.After, delay: handBackDelay, free: debug.FreeOSMemory, log: log}.run(srcCtx)
	})
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := run(srcCtx); err != nil {
			log.Error("service source stopped; serving the last good state", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		// Listeners that failed to open are retried on their own
		// back-off; this only wakes to look.
		retry := time.NewTicker(time.Second)
		defer retry.Stop()
		r, _ := plane.(interface{ RetryListeners() })
		for {
			select {
			case <-srcCtx.Done():
				return
			case <-t.C:
				plane.Tick()
			case <-retry.C:
				if r != nil {
					r.RetryListeners()
				}
			}
		}
	}()
	stopAll := func() {
		stopSrc()
		wg.Wait()
		drain()
		if srv != nil {
			srv.Close()
		}
	}
	// Nothing is served before the source's first full state.
	select {
	case <-sink.first:
	case <-ctx.Done():
		log.Info("stopped before the first sync")
		stopAll()
		if errors.Is(context.Cause(ctx), errPodCIDRsChanged) {
			return errPodCIDRsChanged
		}
		return nil
	}
	if err := sink.lastErr(); err != nil && cfg.KubeProxy.BindAddressHardFail {
		stopAll()
		return fmt.Errorf("--bind-address-hard-fail: %w", err)
	}
	nListeners := 0
	if srv != nil {
		nListeners = logListeners(ctx, log, srv)
	}
	fmt.Fprintf(stdout, "sluice %s ready: %s mode, %s, %d listeners, watching %s\n", version, mode, engineOf, nListeners, source)

	// Serving: offer the sockets to a successor, and retire the
	// predecessor (it stops accepting and drains).
	if path := cfg.HandoverSocket; path != "" {
		offer, err := handover.Serve(path, broker, func() { retire(errHandedOver) })
		if err != nil {
			log.Warn("hand-over: a successor will have to bind anew", "err", err)
		} else {
			defer offer.Close()
		}
	}
	if pred != nil {
		if n := broker.Untaken(); n > 0 {
			log.Info("hand-over: closed sockets no longer served", "sockets", n)
		}
		if err := pred.Retire(); err != nil {
			log.Warn("hand-over: could not tell the previous sluice to retire; stop it yourself", "err", err)
		} else {
			log.Info("hand-over: the previous sluice retires")
		}
	}

	<-ctx.Done()
	if errors.Is(context.Cause(ctx), errPodCIDRsChanged) {
		log.Info("the Node's pod CIDRs changed: no new connections; draining open ones", "timeout", cfg.DrainTimeout)
		stopAll()
		return errPodCIDRsChanged
	}
	if errors.Is(context.Cause(ctx), errHandedOver) {
		log.Info("handed over to a new sluice: no new connections; draining open ones", "timeout", cfg.DrainTimeout)
	} else {
		log.Info("shutting down: no new connections; draining open ones", "signal", signalName(ctx), "timeout", cfg.DrainTimeout)
	}
	stopAll()
	log.Info("stopped")
	return nil
}

// listenerLinesMax is how many listeners get a line each at the default
// verbosity. Past it the start logs one summary line and leaves the
// per-listener lines to --v=1: at 10,000 Services, formatting and
// writing 10,000 lines is tens of milliseconds of CPU right when the
// first updates arrive, for a log nobody reads line by line (kube-proxy
// logs no line per Service at its default verbosity either).
const listenerLinesMax = 64

// logListeners logs what the server listens on at start and returns how
// many listeners there are.
func logListeners(ctx context.Context, log *slog.Logger, srv *listeners.Server) int {
	n := srv.FrontendCount()
	level := slog.LevelInfo
	if n > listenerLinesMax {
		level = slog.LevelDebug
		log.Info("listening", "listeners", n, "each", "logged with --v=1")
	}
	if log.Enabled(ctx, level) {
		for _, fe := range srv.Frontends() {
			log.Log(ctx, level, "listening", "service", fe.Service.String(), "protocol", fe.Service.Protocol, "role", fe.Role, "addr", fe.Addr.String())
		}
	}
	return n
}

// ownHostPorts are the host ports this sluice listens on itself, which a
// manifest NodePort must not take: the health and metrics servers' (TCP),
// and in userspace mode a set --proxy-port-range (every protocol).
func ownHostPorts(cfg *config.Config, mode string) []controlplane.HostPort {
	var out []controlplane.HostPort
	for _, a := range []struct{ flag, addr string }{
		{"--healthz-bind-address", cfg.HealthzAddress()}, {"--metrics-bind-address", cfg.MetricsAddress()}} {
		if ap, err := netip.ParseAddrPort(a.addr); err == nil && ap.Port() != 0 {
			out = append(out, controlplane.HostPort{Proto: lb.TCP, First: ap.Port(), Last: ap.Port(), Owner: a.flag + " " + a.addr})
		}
	}
	if mode == config.ModeUserspace {
		if r, err := config.ParsePortRange(cfg.KubeProxy.PortRange); err == nil && r.Size > 0 {
			out = append(out, controlplane.HostPort{First: uint16(r.Base), Last: uint16(r.Base + r.Size - 1),
				Owner: "--proxy-port-range " + cfg.KubeProxy.PortRange})
		}
	}
	return out
}

// nodeName is kube-proxy's: --hostname-override, else the host name,
// lower-cased.
func nodeName(cfg *config.Config) string {
	if n := strings.TrimSpace(cfg.KubeProxy.HostnameOverride); n != "" {
		return strings.ToLower(n)
	}
	n, _ := os.Hostname()
	return strings.ToLower(strings.TrimSpace(n))
}

// newKubeClient builds the API client from --kubeconfig and --master (or
// the in-cluster configuration when both are empty), with kube-proxy's
// QPS, burst and content types.
func newKubeClient(cfg *config.Config) (kubernetes.Interface, string, error) {
	cc := cfg.KubeProxy.ClientConnection
	rc, err := clientcmd.BuildConfigFromFlags(cfg.Master, cc.Kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes API client (--kubeconfig %q, --master %q): %w", cc.Kubeconfig, cfg.Master, err)
	}
	rc.QPS, rc.Burst = cc.QPS, int(cc.Burst)
	rc.ContentType, rc.AcceptContentTypes = cc.ContentType, cc.AcceptContentTypes
	rc.UserAgent = "sluice/" + version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes API client: %w", err)
	}
	return client, rc.Host, nil
}

// ringEngine is the event loop engine's io_uring state (on Linux).
type ringEngine interface {
	IOUring() error
	IOUringLoops() int
	IOUringFailures() int64
	IOUringOps() uint64
}

// healthCheckPorts tracks the service ports that have a health check
// node port, following each snapshot's delta, so that an update costs
// O(changed) rather than a walk of every service port (at 10k ports the
// walk was most of the applier's share of an update; issue 16).
type healthCheckPorts struct {
	id    uint64 // the snapshot ports reflects (0: none yet)
	ports map[lb.ServicePortName]*lb.ServicePort
}

// update brings the tracked ports to snap and lists the Services with a
// health check node port and how many distinct ready local endpoint
// addresses each has.
func (h *healthCheckPorts) update(snap *lb.Snapshot) []admin.HealthCheckService {
	names, delta := snap.DeltaSince(h.id)
	if h.ports == nil || h.id == 0 || !delta {
		h.ports = map[lb.ServicePortName]*lb.ServicePort{}
		for name, sp := range snap.Ports.All() {
			if sp.HealthCheckNodePort != 0 {
				h.ports[name] = sp
			}
		}
	} else {
		for _, name := range names {
			if sp := snap.Ports.Get(name); sp != nil && sp.HealthCheckNodePort != 0 {
				h.ports[name] = sp
			} else {
				delete(h.ports, name)
			}
		}
	}
	h.id = snap.ID
	return healthCheckServices(maps.Values(h.ports))
}

// healthCheckServices lists the Services with a healthCheckNodePort among
// ports and how many distinct ready local endpoint addresses each has.
func healthCheckServices(ports iter.Seq[*lb.ServicePort]) []admin.HealthCheckService {
	type key struct {
		ns, name string
		port     uint16
	}
	local := map[key]map[netip.Addr]bool{}
	type families struct{ v4, v6 bool }
	fams := map[key]families{}
	for sp := range ports {
		if sp.HealthCheckNodePort == 0 {
			continue
		}
		k := key{sp.Name.Namespace, sp.Name.Name, sp.HealthCheckNodePort}
		if local[k] == nil {
			local[k] = map[netip.Addr]bool{}
		}
		f := fams[k]
		for _, ip := range sp.ClusterIPs {
			f.v4, f.v6 = f.v4 || ip.Unmap().Is4(), f.v6 || !ip.Unmap().Is4()
		}
		fams[k] = f
		for _, ep := range sp.Endpoints {
			if ep.Local && ep.Ready {
				local[k][ep.Addr.Addr()] = true
			}
		}
	}
	out := make([]admin.HealthCheckService, 0, len(local))
	for k, eps := range local {
		out = append(out, admin.HealthCheckService{Namespace: k.ns, Name: k.name, Port: k.port, LocalEndpoints: len(eps),
			IPv4: fams[k].v4, IPv6: fams[k].v6})
	}
	slices.SortFunc(out, func(a, b admin.HealthCheckService) int { return int(a.Port) - int(b.Port) })
	return out
}

// handBackDelay is how long after a large state is applied its garbage is
// handed back to the system. Not at once: the collection it forces (and
// the scavenging) took the CPU right when a restarted proxy's first
// updates came (the API churn bench's first flip, 12.6 ms from the write
// with it at once, with the API server's watch at 3.3 ms), as the API
// source found for its own release, which comes 30 s after its first
// build and now asks for this one (one collection for both).
const handBackDelay = 30 * time.Second

// startGCPercent is the collector's goal, in percent of the live heap,
// while sluice loads and applies its first state: the objects it keeps
// are made among the decoding's and the build's garbage, and the more
// garbage lies between two collections, the more spans each keeps with
// few live objects in them. From manifests at 10,000 Services x 10
// endpoints, the heap in use per Service once loaded was 3354 bytes at
// 400, 2116 at Go's default 100, 1855 at 50 and 1748 at 25, for the same
// 1600 live (BenchmarkManifestHeldBytesPerService with GOGC set).
const startGCPercent = 50

// startCollection runs the collector at startGCPercent until the first
// state is applied, unless the user chose a GOGC of their own.
type startCollection struct {
	getenv     func(string) string
	setPercent func(int) int // debug.SetGCPercent
	log        *slog.Logger
}

// lower sets the start-up goal and returns what puts Go's default back
// (once; a no-op when the user's GOGC was left alone). The default, not
// the goal lower found: two serves in one process (the tests run many)
// would otherwise leave the second's start-up goal behind.
func (c startCollection) lower() (restore func()) {
	if c.getenv("GOGC") != "" {
		return func() {}
	}
	c.setPercent(startGCPercent)
	var once sync.Once
	return func() {
		once.Do(func() {
			c.setPercent(defaultGCPercent)
			c.log.Debug("collector back to its default goal after the first state", "percent", defaultGCPercent)
		})
	}
}

// defaultGCPercent is Go's goal when GOGC is not set.
const defaultGCPercent = 100

// until lowers the goal now and puts it back once first is closed (the
// first state applied) or ctx ends.
func (c startCollection) until(ctx context.Context, first <-chan struct{}) {
	restore := c.lower()
	go func() {
		select {
		case <-first:
		case <-ctx.Done():
		}
		restore()
	}()
}

// handBack hands the garbage of large applied states back to the system
// (debug.FreeOSMemory), delay after the first ask and once for every ask
// until then, on a goroutine of its own, off the publishing one: the
// collection takes a while at that size, and no update waits for it.
type handBack struct {
	asks  <-chan struct{}
	after func(time.Duration) <-chan time.Time
	delay time.Duration
	free  func()
	log   *slog.Logger
}

func (h handBack) run(ctx context.Context) {
	var due <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.asks:
			if due == nil {
				due = h.after(h.delay)
			}
		case <-due:
			due = nil
			start := time.Now()
			h.free()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			h.log.Info("garbage handed back after a large state", "heapInUseMiB", ms.HeapInuse>>20, "took", time.Since(start).Round(time.Millisecond))
		}
	}
}

// applier is the control plane's sink: it applies snapshots to the
// listeners and keeps health and metrics up to date.
// bigApply is the number of changed service ports from which an applied
// state's garbage is handed back to the system at once. The first state of
// a large node leaves the heap at about twice what it holds live, and the
// runtime's scavenger keeps up to its next goal, so without a release the
// resident memory stays there: 20,000 Services x 10 endpoints in userspace
// mode held 318 MiB, and 234 MiB after one (the sources' own releases
// come before the data plane's apply, which makes most of it).
const bigApply = 1000

type applier struct {
	plane   dataPlane
	local   *localAddrs
	health  *admin.Health
	metrics *admin.Metrics
	log     *slog.Logger
	source  string // the metric label of rejected updates
	// svcHealth serves healthCheckNodePorts (nil: none), for the ports
	// hcPorts tracks.
	svcHealth *admin.ServiceHealth
	hcMu      sync.Mutex // guards hcPorts
	hcPorts   healthCheckPorts
	first     chan struct{} // closed by the first Publish
	// release is signalled after a state of at least bigApply changed
	// ports is applied (nil: never), for run to hand the garbage back.
	release chan struct{}
	// clock is the time source (nil: time.Now).
	clock func() time.Time
	// events records kube-proxy's Kubernetes Events (nil: no API).
	events *kubeEvents
	// staleOnFailure says whether a failed apply leaves health pending,
	// not updated (followResyncs); nil: never.
	staleOnFailure func(error) bool

	mu        sync.Mutex
	err       error
	published bool
	last      *lb.Snapshot // the previous Publish, for the changed-ports log
}

// changedPorts counts the service ports that differ between two snapshots
// (added, removed or changed) and returns the first shownPorts of them in
// name order, for the log: the ones next says changed when it is prev with
// changes, else found by comparing both. A list of them all is not made: a
// first apply at 10k built and sorted 10,000 strings to show eight
// (BenchmarkFirstPublishAt10k's allocations).
func changedPorts(prev, next *lb.Snapshot) (int, []lb.ServicePortName) {
	n := 0
	var first []lb.ServicePortName // grown as found: most updates change one port
	note := func(name lb.ServicePortName) {
		n++
		i, _ := slices.BinarySearchFunc(first, name, lb.ServicePortName.Compare)
		if i < shownPorts {
			if len(first) == shownPorts {
				first = first[:shownPorts-1]
			}
			first = slices.Insert(first, i, name)
		}
	}
	if prev != nil {
		if names, ok := next.DeltaSince(prev.ID); ok {
			for _, name := range names {
				note(name)
			}
			return n, first
		}
	}
	for name, sp := range next.Ports.All() {
		// The same pointer is the same port (the API source reuses the ports
		// of Services that did not change); only other ones are compared.
		if prev == nil || (prev.Ports.Get(name) != sp && !reflect.DeepEqual(prev.Ports.Get(name), sp)) {
			note(name)
		}
	}
	if prev != nil {
		for name := range prev.Ports.All() {
			if next.Ports.Get(name) == nil {
				note(name)
			}
		}
	}
	return n, first
}

// shownPorts is how many changed ports the "state applied" line names.
const shownPorts = 8

// portNames is the changed-ports log's list of names, each with its
// protocol.
func portNames(names []lb.ServicePortName) string {
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n.String() + "/" + string(n.Protocol))
	}
	return b.String()
}

func (a *applier) Publish(snap *lb.Snapshot) { a.publish(snap) }

// followResyncs makes a failed sync leave the proxy's health pending when
// the plane retries it itself (the kernel modes' resync loops, the
// userspace VIP capture's), and a successful retry mark it updated, as
// kube-proxy's syncs do: a node whose rules cannot be written answers 503
// on /healthz once the change has waited twice the sync period. In
// userspace mode a listener that could not be opened makes /healthz 503
// at once (SetUnserved), and such a failure alone counts as processed.
func (a *applier) followResyncs() {
	if r, ok := a.plane.(interface {
		setResynced(func())
		pendingAfter(error) bool
	}); ok {
		r.setResynced(a.health.Updated)
		a.staleOnFailure = r.pendingAfter
	}
}

// PublishTimed is Publish, then, if the state was applied, the time from
// each change to the moment the data plane had it into kube-proxy's
// network programming latency and sluice's update apply histogram. That
// moment is the plane's Apply returning, before the health-check ports'
// sync and the log line that follow it: kube-proxy observes its latency
// at the same point, right after its rules are in the kernel and before
// it syncs its service health servers.
func (a *applier) PublishTimed(snap *lb.Snapshot, times controlplane.UpdateTimes) {
	applied, err := a.publish(snap)
	if err != nil {
		return
	}
	for _, t := range times.Triggers {
		a.metrics.NetworkProgrammed(t.Family, applied.Sub(t.At))
	}
	for _, t := range times.Arrived {
		a.metrics.UpdateApplied(applied.Sub(t))
	}
}

// now is the applier's clock.
func (a *applier) now() time.Time {
	if a.clock != nil {
		return a.clock()
	}
	return time.Now()
}

// publish applies snap; it returns when the data plane had it and what
// failed.
func (a *applier) publish(snap *lb.Snapshot) (time.Time, error) {
	start := a.now()
	a.local.refresh()
	err := a.plane.Apply(snap)
	applied := a.now()
	if err != nil {
		for _, e := range unjoin(err) {
			a.log.Error("part of the state not applied", "err", e)
		}
	}
	if a.svcHealth != nil {
		a.hcMu.Lock()
		svcs := a.hcPorts.update(snap)
		a.hcMu.Unlock()
		if herr := a.svcHealth.Sync(svcs); herr != nil {
			for _, e := range unjoin(herr) {
				a.log.Warn("FailedToStartServiceHealthcheck", "err", e)
				a.events.healthCheckFailed(e)
			}
		}
	}
	a.mu.Lock()
	changed, shown := changedPorts(a.last, snap)
	a.last = snap
	a.err = err
	if !a.published {
		a.published = true
		close(a.first)
	}
	a.mu.Unlock()
	took := a.now().Sub(start) // the whole sync, as kube-proxy's duration is
	if err != nil && a.staleOnFailure != nil && a.staleOnFailure(err) {
		// As kube-proxy: the change stays pending until a sync applies it
		// (the plane's resync, followResyncs), and /healthz answers 503
		// once it has waited the health timeout; where only some of the
		// families that sync apart failed, only they wait, as each of
		// kube-proxy's per-family proxiers marks its own health.
		a.health.QueuedUpdate()
		if failed := failedFamilies(err); len(failed) > 0 && len(failed) < len(a.metrics.SyncedFamilies()) {
			a.health.Behind(failed...)
		}
	} else {
		a.health.Updated()
	}
	if err != nil {
		// Not "state applied", and not counted as a sync: what failed
		// (each part logged above) is retried by the plane's resync, and
		// what was applied before it stays (issue 18: a killed restore
		// was followed by "state applied" and counted as a sync).
		a.log.Error("state not applied in full; the failed parts keep what they had and are retried", "servicePorts", snap.Ports.Len(), "changed", changed, "ports", portNames(shown), "failures", len(unjoin(err)), "took", took)
		return applied, err
	}
	_, perFamily := a.plane.(interface{ perFamilySyncs() })
	// The last sync's time is when the plane had it, as kube-proxy stamps
	// it right after its latency, before its health servers' sync.
	a.metrics.Synced(took, applied, !perFamily)
	a.log.Info("state applied", "servicePorts", snap.Ports.Len(), "changed", changed, "ports", portNames(shown), "took", took)
	if changed >= bigApply {
		a.askRelease()
	}
	return applied, nil
}

// askRelease asks run to hand garbage back to the system (handBack).
func (a *applier) askRelease() {
	if a.release == nil {
		return
	}
	select {
	case a.release <- struct{}{}:
	default: // one is pending
	}
}

// Unchanged: a re-read found nothing new; what is applied is current.
func (a *applier) Unchanged() { a.health.Updated() }

func (a *applier) Reject(err error) {
	a.metrics.Rejected(a.source, controlplane.Culprits(err))
	// The update was processed (and refused); the data plane is current
	// with the last good state, so health is not stale.
	a.health.Updated()
}

func (a *applier) Queued() {
	a.health.QueuedUpdate()
	a.metrics.Queued(time.Now())
}

func (a *applier) lastErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// unjoin lists the errors joined in err (none for nil: a retry that was
// not due yet logged "err=<nil>" every second and counted it as a
// listener error).
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// localAddrs is the set of this host's addresses, refreshed before each
// apply, so external and load-balancer IPs that are local get listeners.
// With a watch, a refresh lists the addresses only when the watch says
// they changed.
type localAddrs struct {
	// node is what the Node object said at start-up (set before the
	// planes are made, and not changed after).
	node nodeFacts
	// watch says whether the addresses may have changed since it was
	// last asked; nil: always list them.
	watch interface{ Changed() bool }
	// dump lists the addresses; default net.InterfaceAddrs.
	dump func() ([]net.Addr, error)

	mu     sync.Mutex
	set    map[netip.Addr]bool
	listed bool // the last refresh listed the addresses (not failed)
	// changes counts the refreshes that found another set (version).
	changes uint64
}

// version changes whenever the set of addresses does.
func (l *localAddrs) version() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changes
}

func (l *localAddrs) refresh() {
	if l.watch != nil && !l.watch.Changed() {
		l.mu.Lock()
		listed := l.listed
		l.mu.Unlock()
		if listed {
			return
		}
	}
	dump := l.dump
	if dump == nil {
		dump = net.InterfaceAddrs
	}
	set := map[netip.Addr]bool{}
	addrs, err := dump()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			set[p.Addr().Unmap()] = true
		}
	}
	l.mu.Lock()
	if !maps.Equal(set, l.set) {
		l.changes++
	}
	l.set, l.listed = set, err == nil
	l.mu.Unlock()
}

func (l *localAddrs) list() []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]netip.Addr, 0, len(l.set))
	for a := range l.set {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// listExcept is list without the addresses skip reports.
func (l *localAddrs) listExcept(skip func(netip.Addr) bool) []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []netip.Addr
	for a := range l.set {
		if !skip(a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// selectNodePortAddrs applies --nodeport-addresses, its "primary"
// resolved (nodeFacts.nodePortAddresses): the local addresses inside any
// of the CIDRs. Empty means "not restricted" (nil). IPv6 link-local
// addresses are never selected, as kube-proxy's IPVS mode leaves them out
// of its node addresses: one is bound only with its interface (a zone),
// so a NodePort or health check listener on one failed, and with it the
// state's apply, on every node with IPv6 whose flag named only IPv4 CIDRs.
func selectNodePortAddrs(spec []string, local []netip.Addr) []netip.Addr {
	if len(spec) == 0 {
		return nil
	}
	local = slices.DeleteFunc(slices.Clone(local), func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && a.IsLinkLocalUnicast() })
	picked := map[netip.Addr]bool{}
	for _, s := range spec {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			continue // validated at start-up
		}
		for _, a := range local {
			if p.Contains(a) {
				picked[a] = true
			}
		}
	}
	// kube-proxy reads the flag per family: a family none of whose CIDRs
	// is listed answers on every address of that family.
	for _, a := range local {
		if !familyRestricted(spec, a.Is6() && !a.Is4In6()) {
			picked[a] = true
		}
	}
	out := make([]netip.Addr, 0, len(picked))
	for a := range picked {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	if len(out) == 0 {
		return []netip.Addr{} // restricted, and nothing matches: no NodePort listeners
	}
	return out
}

// familyRestricted says whether --nodeport-addresses restricts NodePorts
// in one family: it does when it lists a CIDR of that family ("primary"
// is resolved to CIDRs at start-up). kube-proxy builds its NodePort addresses per family
// and, when none of the CIDRs is of the family, matches every address.
func familyRestricted(spec []string, v6 bool) bool {
	for _, s := range spec {
		if p, err := netip.ParsePrefix(s); err == nil && (p.Addr().Is6() && !p.Addr().Is4In6()) == v6 {
			return true
		}
	}
	return false
}

// nodePortAddrsFor is the selection for one family's kernel rules: nil
// (every local address, kube-proxy's match-all rules) when the flag does
// not restrict the family.
func nodePortAddrsFor(spec []string, local []netip.Addr, v6 bool) []netip.Addr {
	if !familyRestricted(spec, v6) {
		return nil
	}
	return selectNodePortAddrs(spec, local)
}

func (l *localAddrs) has(a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.set[a.Unmap()]
}
