//go:build linux

// Command sluice-bench runs sluice's benchmark: backends, sluice in each
// engine, a naive Go proxy, HAProxy and nginx side by side, in interleaved
// rounds, with results written to bench/results/<timestamp>/. It is also
// the naive proxy itself (`sluice-bench naive-proxy LISTEN=B1,B2 ...`).
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/bench/harness"
	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
	"github.com/sluice-proxy/sluice/vmtest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "naive-proxy" {
		if err := naiveProxy(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "naive-proxy:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "sync" {
		os.Exit(syncBench(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "kube-sync" {
		os.Exit(kubeSyncBench(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "vm" {
		os.Exit(vmBench(os.Args[2:]))
	}
	os.Exit(run())
}

// reexecInNetns runs this command again in a private network namespace
// (CLONE_NEWNET; the namespace dies with the child), so nothing is ever
// written to the machine's own tables. In the parent it returns the
// child's exit code and true; in the child, false.
func reexecInNetns(sub, what string) (int, bool) {
	if os.Getenv("SLUICE_SYNC_NETNS") != "" {
		return 0, false
	}
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "sluice-bench %s: needs root (it creates a private network namespace and %s)\n", sub, what)
		return 1, true
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), "SLUICE_SYNC_NETNS=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), true
		}
		fmt.Fprintf(os.Stderr, "sluice-bench %s: %v\n", sub, err)
		return 1, true
	}
	return 0, true
}

// syncBench runs the iptables sync benchmark in a private network
// namespace: the command re-executes itself with CLONE_NEWNET (the
// namespace dies with the child), so no rule is ever written to the
// machine's own tables.
func syncBench(args []string) int {
	fs := flag.NewFlagSet("sync", flag.ExitOnError)
	sizes := fs.String("sizes", "1000,10000", "service counts, comma-separated")
	backends := fs.String("backends", "nft,legacy", "iptables backends, comma-separated")
	rounds := fs.Int("rounds", 3, "rounds per backend and size (medians are reported)")
	out := fs.String("out", "bench/results", "results root; the run writes <out>/<timestamp>-sync/")
	limit := fs.Duration("limit", 10*time.Minute, "longest one iptables-restore may take; a slower sync is reported as failed")
	fs.Parse(args)
	if code, parent := reexecInNetns("sync", "programs iptables inside it"); parent {
		return code
	}
	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err != nil || n < 1 || n > 60000 {
			fmt.Fprintf(os.Stderr, "sluice-bench sync: --sizes: %q is not a service count (1-60000)\n", s)
			return 1
		}
		ns = append(ns, n)
	}
	var bes []string
	for _, b := range strings.Split(*backends, ",") {
		b = strings.TrimSpace(b)
		if b != "nft" && b != "legacy" {
			fmt.Fprintf(os.Stderr, "sluice-bench sync: --backends: %q is not nft or legacy\n", b)
			return 1
		}
		if _, err := exec.LookPath("iptables-" + b + "-restore"); err != nil {
			fmt.Fprintf(os.Stderr, "sluice-bench sync: iptables-%s-restore is not installed (apt-get install iptables)\n", b)
			return 1
		}
		bes = append(bes, b)
	}
	res, err := harness.RunSyncBench(bes, ns, max(1, *rounds), *limit, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench sync:", err)
		return 1
	}
	dir := filepath.Join(*out, time.Now().UTC().Format("20060102-150405")+"-sync")
	md, err := harness.WriteSyncResults(dir, res, harness.Machine())
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench sync:", err)
		return 1
	}
	fmt.Print(md)
	fmt.Println("\nwrote", dir)
	return 0
}

// kubeSyncBench runs the kernel modes' syncs beside upstream kube-proxy in
// a private network namespace (re-executing itself with CLONE_NEWNET, as
// sync does).
func kubeSyncBench(args []string) int {
	fs := flag.NewFlagSet("kube-sync", flag.ExitOnError)
	sizes := fs.String("sizes", "1000", "service counts, comma-separated")
	modes := fs.String("modes", "iptables,nftables", "kernel modes, comma-separated")
	rounds := fs.Int("rounds", 2, "rounds per mode and size (medians are reported); the proxies alternate which runs first")
	out := fs.String("out", "bench/results", "results root; the run writes <out>/<timestamp>-kube-sync/")
	limit := fs.Duration("limit", 15*time.Minute, "longest one sync may take before it is reported as failed")
	sluice := fs.String("sluice", "bin/sluice", "the sluice binary")
	backend := fs.String("backend", "", "iptables mode's backends for both proxies, comma-separated, each run in turn: nft, legacy (empty: the system's iptables)")
	proxies := fs.String("proxies", "kube-proxy,sluice", "the proxies run, comma-separated (kube-proxy, sluice), in the first round's order")
	fs.Parse(args)
	if code, parent := reexecInNetns("kube-sync", "programs its tables"); parent {
		return code
	}
	kp, err := kubetest.KubeProxyBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench kube-sync:", err)
		return 1
	}
	abs, err := filepath.Abs(*sluice)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench kube-sync:", err)
		return 1
	}
	cfg := harness.KubeSyncConfig{Sluice: abs, KubeProxy: kp, Rounds: max(1, *rounds), Limit: *limit,
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }}
	if *backend != "" {
		var ok bool
		if cfg.Backends, ok = oneOf("--backend", *backend, "nft", "legacy"); !ok {
			return 1
		}
	}
	for _, s := range strings.Split(*sizes, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err != nil || n < 1 || n > 60000 {
			fmt.Fprintf(os.Stderr, "sluice-bench kube-sync: --sizes: %q is not a service count (1-60000)\n", s)
			return 1
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	var ok bool
	if cfg.Proxies, ok = oneOf("--proxies", *proxies, "kube-proxy", "sluice"); !ok {
		return 1
	}
	if cfg.Modes, ok = oneOf("--modes", *modes, "iptables", "nftables"); !ok {
		return 1
	}
	res, err := harness.RunKubeSyncBench(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench kube-sync:", err)
	}
	dir := filepath.Join(*out, time.Now().UTC().Format("20060102-150405")+"-kube-sync")
	md, werr := harness.WriteKubeSyncResults(dir, res, *limit, harness.Machine())
	if werr != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench kube-sync:", werr)
		return 1
	}
	fmt.Print(md)
	fmt.Println("\nwrote", dir)
	if err != nil {
		return 1
	}
	return 0
}

// oneOf splits a kube-sync flag's comma-separated list, each item one of
// allowed; it says which item is not.
func oneOf(flagName, list string, allowed ...string) ([]string, bool) {
	var out []string
	for _, v := range strings.Split(list, ",") {
		v = strings.TrimSpace(v)
		if !slices.Contains(allowed, v) {
			fmt.Fprintf(os.Stderr, "sluice-bench kube-sync: %s: %q is not %s\n", flagName, v, strings.Join(allowed, " or "))
			return nil, false
		}
		out = append(out, v)
	}
	return out, true
}

func run() int {
	mode := flag.String("mode", "short", "smoke (proves the harness works, < 2 min, asserts no numbers) or short (about 25 min with every system and the target rounds)")
	out := flag.String("out", "bench/results", "results root; each run writes <out>/<timestamp>/")
	sluiceBin := flag.String("sluice", "bin/sluice", "the sluice binary")
	sluiceBase := flag.String("sluice-base", "", "an earlier sluice binary, run beside --sluice as sluice-eventloop-base, and as sluice-goroutine-base when --systems names it (before and after a change, in one run)")
	rounds := flag.Int("rounds", 0, "measured rounds (default: 1 for smoke, 3 for short)")
	targetRounds := flag.Int("target-rounds", -1, "rounds of the workloads the targets judge (the cost workloads, and the throughput and TCP RR workloads with a target), for the systems they compare: the event loop, HAProxy, nginx, the other peers in tcp-rr and the C floor in the cost workloads (default: 7 in short mode with the default rounds, else --rounds)")
	flag.IntVar(targetRounds, "cost-rounds", -1, "the former name of --target-rounds")
	pin := flag.Bool("pin", false, "pin load balancers to CPU 0 and the harness to the other CPUs (needs 2+ CPUs)")
	only := flag.String("systems", "", "comma-separated systems to run (default: all)")
	onlyWorkloads := flag.String("workloads", "", "comma-separated workloads to run (default: all)")
	apiServices := flag.Int("api-services", 0, "services the churn-api workload loads into kube-apiserver (default: the mode's: 100 smoke, 1000 short)")
	apiEndpoints := flag.Int("api-endpoints", 0, "endpoints each of those services has (default 2)")
	topology := flag.String("topology", "auto", "loopback (unprivileged; no kernel modes), netns (root: client, node and backend network namespaces, and a node per kernel mode), or auto (netns when root)")
	kernelModes := flag.String("kernel-modes", "auto", "with --topology netns: the kernel modes to run, comma-separated (iptables, nftables, ipvs), none, or auto (iptables when iptables-restore is installed, nftables when nft is, ipvs when the kernel has IPVS)")
	iptablesBackend := flag.String("iptables-backend", "", "passed to sluice's kernel modes (nft or legacy; empty: sluice detects)")
	note := flag.String("note", "", "a sentence for the head of the report (where and how it ran)")
	rerender := flag.String("rerender", "", "re-write the reports of an earlier run from its results.json, then exit")
	flag.Parse()
	if *rerender != "" {
		if err := harness.Rerender(*rerender); err != nil {
			fmt.Fprintln(os.Stderr, "sluice-bench:", err)
			return 1
		}
		return 0
	}

	raiseFileLimit()
	switch *topology {
	case "auto":
		*topology = "loopback"
		if _, err := exec.LookPath("ip"); err == nil && os.Geteuid() == 0 {
			*topology = "netns"
		}
	case "loopback", "netns":
	default:
		fmt.Fprintf(os.Stderr, "sluice-bench: --topology %q: want loopback, netns or auto\n", *topology)
		return 2
	}
	topo := harness.Loopback()
	if *topology == "netns" {
		prefix := os.Getenv("SLUICE_BENCH_NETNS")
		if prefix == "" {
			modes, err := chooseKernelModes(*kernelModes)
			if err != nil {
				fmt.Fprintln(os.Stderr, "sluice-bench:", err)
				return 2
			}
			return inNetns(modes)
		}
		var modes []string
		if m := os.Getenv("SLUICE_BENCH_KERNEL_MODES"); m != "" {
			modes = strings.Split(m, ",")
		}
		topo = harness.InNetns(prefix, modes...)
	}

	if *targetRounds < 0 {
		*targetRounds = 0
		if *mode == "short" && *rounds == 0 {
			*targetRounds = 7
		}
	}
	if *rounds == 0 {
		*rounds = map[string]int{"smoke": 1}[*mode]
		if *rounds == 0 {
			*rounds = 3
		}
	}
	lbCPU := -1
	if os.Getenv("SLUICE_BENCH_PINNED") != "" {
		lbCPU = 0 // we are the re-run harness, on the other CPUs
	} else if *pin && runtime.NumCPU() >= 2 {
		lbCPU = 0
		{
			// Re-run the harness itself on the other CPUs.
			if _, err := exec.LookPath("taskset"); err == nil {
				cmd := exec.Command("taskset", append([]string{"-c", fmt.Sprintf("1-%d", runtime.NumCPU()-1), os.Args[0]}, os.Args[1:]...)...)
				cmd.Env = append(os.Environ(), "SLUICE_BENCH_PINNED=1")
				cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
				if err := cmd.Run(); err != nil {
					var ee *exec.ExitError
					if errors.As(err, &ee) {
						return ee.ExitCode()
					}
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
				return 0
			}
			lbCPU = -1
		}
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sl, err := filepath.Abs(*sluiceBin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := os.Stat(sl); err != nil {
		fmt.Fprintf(os.Stderr, "sluice binary %s: %v (run make build)\n", sl, err)
		return 1
	}
	base := ""
	if *sluiceBase != "" {
		if base, err = filepath.Abs(*sluiceBase); err == nil {
			_, err = os.Stat(base)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "--sluice-base: %v\n", err)
			return 1
		}
	}
	// Each sluice binary runs from a copy made here, the same way for
	// both: how a file came into the page cache moves the pages its
	// process maps, and so its resident memory, by up to 6 MiB for the
	// same bytes (bin/sluice as the linker left it mapped 35-37 MiB at
	// rest, a copy of it 30.7-30.9).
	binDir, err := os.MkdirTemp("", "sluice-bench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if sl, err = copyBinary(sl, filepath.Join(binDir, "sluice")); err == nil && base != "" {
		base, err = copyBinary(base, filepath.Join(binDir, "sluice-base"))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := filepath.Abs(filepath.Join(*out, time.Now().UTC().Format("20060102-150405")+"-"+*mode))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts := harness.Options{APIServices: *apiServices, APIEndpoints: *apiEndpoints, Mode: *mode, Dir: dir, Rounds: *rounds, TargetRounds: *targetRounds, NoWarmup: *mode == "smoke", LBCPU: lbCPU,
		Config: harness.Config{Sluice: sl, SluiceBase: base, Self: self, IPTablesBackend: *iptablesBackend}, Log: os.Stdout, Topology: topo, Note: *note}
	if *only != "" {
		opts.Only = map[string]bool{}
		for _, s := range strings.Split(*only, ",") {
			opts.Only[strings.TrimSpace(s)] = true
		}
	}
	if *onlyWorkloads != "" {
		opts.OnlyWorkloads = map[string]bool{}
		for _, w := range strings.Split(*onlyWorkloads, ",") {
			opts.OnlyWorkloads[strings.TrimSpace(w)] = true
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	runs, systems, err := harness.Execute(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		return 1
	}
	md, err := harness.Write(dir, opts, runs, systems, harness.Machine())
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench: writing results:", err)
		return 1
	}
	fmt.Printf("\n%s\nresults in %s (%s)\n", md, dir, time.Since(start).Round(time.Second))
	// The harness worked if every system started (checked above) and
	// sluice completed every workload; a peer failing a workload is a
	// result (a loss for it), not a harness failure. No number is asserted.
	failed := 0
	for _, r := range runs {
		if r.Err != "" && strings.HasPrefix(r.System, "sluice") {
			failed++
		}
	}
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "sluice-bench: sluice failed %d runs (see Errors in results.md)\n", failed)
		return 1
	}
	return 0
}

// vmBench runs the harness inside the VM suite's Debian guest, where the
// kernel has IPVS: the netns topology with a node for the iptables mode
// and one for the IPVS mode, beside direct and the event loop, under
// emulation (TCG). The numbers are the guest's: compare the systems with
// one another, never with a run on the host. The results come back over
// the serial console into <out>/<timestamp>-vm/.
func vmBench(args []string) int {
	fs := flag.NewFlagSet("vm", flag.ExitOnError)
	mode := fs.String("mode", "smoke", "harness mode inside the guest")
	systems := fs.String("systems", "direct,sluice-eventloop,sluice-iptables,sluice-ipvs", "systems to run in the guest (haproxy, haproxy-splice and nginx are copied in with their libraries when named)")
	workloads := fs.String("workloads", "", "workloads to run in the guest (default: all)")
	rounds := fs.Int("rounds", 0, "measured rounds in the guest (default: the mode's)")
	memMB := fs.Int("mem", 2048, "guest memory, MiB")
	why := fs.String("note", "", "a further sentence for the head of the report (why this ran in the guest)")
	out := fs.String("out", "bench/results", "results root")
	timeout := fs.Duration("timeout", 40*time.Minute, "longest the VM may run")
	fs.Parse(args)
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "sluice-bench vm: needs root (it fetches and unpacks the guest kernel)")
		return 1
	}
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench vm:", err)
		return 1
	}
	work, err := os.MkdirTemp("", "sluice-bench-vm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench vm:", err)
		return 1
	}
	defer os.RemoveAll(work)
	for _, b := range [][2]string{{"sluice", "./cmd/sluice"}, {"sluice-bench", "./bench/cmd/sluice-bench"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(work, b[0]), b[1])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if o, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "sluice-bench vm: go build %s: %v\n%s", b[1], err, o)
			return 1
		}
	}
	g, err := guestSetup(*systems)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench vm:", err)
		return 1
	}
	var tools []string
	for _, t := range g.tools {
		p := t
		if !filepath.IsAbs(t) {
			if p, err = exec.LookPath(t); err != nil {
				fmt.Fprintf(os.Stderr, "sluice-bench vm: %s is not installed (make bench-deps)\n", t)
				return 1
			}
		} else if _, err := os.Stat(t); err != nil {
			fmt.Fprintf(os.Stderr, "sluice-bench vm: %s is missing (make bench-deps)\n", t)
			return 1
		}
		tools = append(tools, p)
	}
	note := "Run inside the VM suite's Debian guest under qemu TCG emulation, 2 vCPUs: the numbers are the guest's, so compare the systems with one another, never with a run on the host. Emulation slows user-space code far more than the kernel's own forwarding."
	if *why != "" {
		note += " " + *why
	}
	extra := ""
	if *workloads != "" {
		extra += " --workloads " + *workloads
	}
	if *rounds > 0 {
		extra += fmt.Sprintf(" --rounds %d", *rounds)
	}
	script := fmt.Sprintf(`cd /tmp
%s
/sluice-bench --mode %s --topology netns --kernel-modes %s --iptables-backend legacy --systems %s%s --sluice /sluice --out /tmp/r --note %q
rc=$?
echo BEGIN-RESULTS-MD; cat /tmp/r/*/results.md; echo END-RESULTS-MD
echo BEGIN-RESULTS-JSON; base64 /tmp/r/*/results.json; echo END-RESULTS-JSON
return $rc`, g.prepare, *mode, g.kernelModes, *systems, extra, note)
	img, err := vmtest.Build(vmtest.Spec{Root: root, Work: work, Tools: tools, Script: script,
		Files: map[string]string{"sluice": filepath.Join(work, "sluice"), "sluice-bench": filepath.Join(work, "sluice-bench")}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench vm:", err)
		return 1
	}
	start := time.Now()
	fmt.Fprintf(os.Stderr, "sluice-bench vm: booting the guest (up to %s)\n", *timeout)
	log, err := vmtest.Boot(img, work, *memMB, *timeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s\nsluice-bench vm: %v\n", log, err)
		return 1
	}
	serial := strings.ReplaceAll(log, "\r", "") // the console ends lines with CR LF
	between := func(begin, end string) string {
		_, rest, ok := strings.Cut(serial, begin+"\n")
		if !ok {
			return ""
		}
		body, _, _ := strings.Cut(rest, end)
		return body
	}
	dir := filepath.Join(*out, time.Now().UTC().Format("20060102-150405")+"-vm")
	md := between("BEGIN-RESULTS-MD", "END-RESULTS-MD")
	js, jerr := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(between("BEGIN-RESULTS-JSON", "END-RESULTS-JSON")), ""))
	if md == "" || jerr != nil || len(js) == 0 {
		fmt.Fprintf(os.Stderr, "%s\nsluice-bench vm: the guest printed no results (marker %d)\n", log, vmtest.ExitCode(log))
		return 1
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench vm:", err)
		return 1
	}
	os.WriteFile(filepath.Join(dir, "results.json"), js, 0o644)
	os.WriteFile(filepath.Join(dir, "guest.log"), []byte(log), 0o644)
	// The report is re-written here (plots, CSV) from the guest's runs,
	// headed as a guest run.
	if err := harness.Rerender(dir); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench vm:", err)
		return 1
	}
	final, _ := os.ReadFile(filepath.Join(dir, "results.md"))
	fmt.Printf("%s\nresults in %s (VM ran %s)\n", final, dir, time.Since(start).Round(time.Second))
	if code := vmtest.ExitCode(log); code != 0 {
		fmt.Fprintf(os.Stderr, "sluice-bench vm: the harness in the guest exited %d\n", code)
		return 1
	}
	return 0
}

// guest is what the VM image needs for a set of systems.
type guest struct {
	tools       []string // host binaries (names looked up on PATH, or absolute paths) copied in with their libraries
	prepare     string   // shell run in the guest before the harness
	kernelModes string   // --kernel-modes for the harness in the guest
}

// guestSetup works out the guest for a comma-separated system list: the
// load generators always, the peers' binaries when they are named (nginx
// with its stream module and the user its workers switch to), and a node
// namespace only for the kernel modes named.
func guestSetup(systems string) (guest, error) {
	g := guest{tools: []string{"ip", "iperf3", "wrk"}}
	var modes []string
	for _, s := range strings.Split(systems, ",") {
		switch s = strings.TrimSpace(s); s {
		case "sluice-iptables":
			modes = append(modes, "iptables")
		case "sluice-ipvs":
			modes = append(modes, "ipvs")
		case "haproxy", "haproxy-splice":
			if !slices.Contains(g.tools, "haproxy") {
				g.tools = append(g.tools, "haproxy")
			}
		case "nginx":
			g.tools = append(g.tools, "nginx", harness.NginxStreamModule)
			g.prepare = `printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > /etc/passwd; printf 'root:x:0:\nnogroup:x:65534:\n' > /etc/group; mkdir -p /var/lib/nginx /var/log/nginx`
		case "", "direct", "sluice-eventloop", "sluice-goroutine", "naive-go":
		default:
			return guest{}, fmt.Errorf("--systems: %q is not a system the guest can run", s)
		}
	}
	g.kernelModes = "none"
	if len(modes) > 0 {
		g.kernelModes = strings.Join(modes, ",")
	}
	return g, nil
}

// chooseKernelModes resolves --kernel-modes.
func chooseKernelModes(flagValue string) ([]string, error) {
	switch flagValue {
	case "none", "":
		return nil, nil
	case "auto":
		var modes []string
		for _, b := range []string{"iptables-nft-restore", "iptables-legacy-restore", "iptables-restore"} {
			if _, err := exec.LookPath(b); err == nil {
				modes = append(modes, "iptables")
				break
			}
		}
		if _, err := exec.LookPath("nft"); err == nil {
			modes = append(modes, "nftables")
		}
		if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
			modes = append(modes, "ipvs")
		}
		return modes, nil
	}
	var modes []string
	for _, m := range strings.Split(flagValue, ",") {
		m = strings.TrimSpace(m)
		if m != "iptables" && m != "nftables" && m != "ipvs" {
			return nil, fmt.Errorf("--kernel-modes: %q is not iptables, nftables or ipvs", m)
		}
		modes = append(modes, m)
	}
	return modes, nil
}

// inNetns creates the namespace topology, re-runs this command inside its
// client namespace, and deletes the namespaces when it ends, however it
// ends (the processes inside die with the harness: Pdeathsig).
func inNetns(kernelModes []string) int {
	prefix := fmt.Sprintf("sluice-bench-%d", os.Getpid())
	cleanup, err := harness.SetupNetns(prefix, kernelModes...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		return 1
	}
	defer cleanup()
	client, _, _ := harness.NetnsNames(prefix)
	cmd := exec.Command("ip", append([]string{"netns", "exec", client, os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), "SLUICE_BENCH_NETNS="+prefix, "SLUICE_BENCH_KERNEL_MODES="+strings.Join(kernelModes, ","))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// Signals go on to the harness, which stops its systems and writes
	// what it has; this process waits for it and then cleans up.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		return 1
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return max(ee.ExitCode(), 1)
		}
		fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		return 1
	}
	return 0
}

// raiseFileLimit lifts the descriptor limit that every process started
// from here inherits: 10k idle connections through a proxy need 20k
// descriptors in the proxy and as many in the harness. Root may raise the
// hard limit (up to fs.nr_open); anyone may raise the soft one to it.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return
	}
	if os.Geteuid() == 0 && l.Max < 1<<18 {
		want := syscall.Rlimit{Cur: 1 << 18, Max: 1 << 18}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) == nil {
			return
		}
	}
	l.Cur = l.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
}

// naiveProxy is the baseline: a goroutine pair with io.Copy per
// connection, round robin, no retry, and the first direction to finish
// closes both (legacy kube-proxy userspace, tcpproxy-class proxies).
func naiveProxy(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: naive-proxy LISTEN=BACKEND[,BACKEND]... [LISTEN=BACKEND...]")
	}
	var wg sync.WaitGroup
	var lns []net.Listener
	for _, a := range args {
		listen, backends, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("bad mapping %q", a)
		}
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		bs := strings.Split(backends, ",")
		var next atomic.Uint64
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if errors.Is(err, net.ErrClosed) {
					return
				}
				if err != nil { // out of descriptors: back off, as net/http does
					time.Sleep(10 * time.Millisecond)
					continue
				}
				b := bs[(next.Add(1)-1)%uint64(len(bs))]
				go func() {
					defer c.Close()
					s, err := net.DialTimeout("tcp", b, 250*time.Millisecond)
					if err != nil {
						return
					}
					defer s.Close()
					done := make(chan struct{}, 2)
					go func() { io.Copy(s, c); done <- struct{}{} }()
					go func() { io.Copy(c, s); done <- struct{}{} }()
					<-done
				}()
			}
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	for _, ln := range lns {
		ln.Close()
	}
	wg.Wait()
	return nil
}

// copyBinary copies the executable from to to and returns to.
func copyBinary(from, to string) (string, error) {
	src, err := os.Open(from)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return "", fmt.Errorf("copy %s: %w", from, err)
	}
	return to, dst.Close()
}
