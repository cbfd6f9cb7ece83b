package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scaleManifest writes services [from, to) of the scale test, 1,000 to a
// file: each a ClusterIP Service with an EndpointSlice of 10 endpoints
// (TEST-NET-3 addresses, never dialled), except service 0, the first of
// each file and the last, whose endpoint is the backend at probe.
func scaleManifest(t *testing.T, dir string, from, to int, probe string) {
	t.Helper()
	var m strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&m, "apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: scale}\nspec:\n  clusterIP: %s\n  ports: [{name: p, port: 80}]\n---\n", i, scaleIP(i))
		fmt.Fprintf(&m, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s%d, namespace: scale, labels: {kubernetes.io/service-name: s%d}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints:\n", i, i)
		if i%1000 == 0 || i == to-1 {
			fmt.Fprintf(&m, "- addresses: [%q]\n---\n", probe)
			continue
		}
		for e := range 10 {
			fmt.Fprintf(&m, "- addresses: [\"198.18.%d.%d\"]\n", i%250, e+1)
		}
		m.WriteString("---\n")
	}
	writeFile(t, filepath.Join(dir, fmt.Sprintf("s%06d.yaml", from)), m.String())
}

// scaleIP is service i's ClusterIP, inside the node's route to 10.96/16.
func scaleIP(i int) string { return fmt.Sprintf("10.96.%d.%d", i/250, i%250+1) }

// Userspace mode with one capture port loads and serves more Services
// than the process may hold descriptors (20,000 here; with a proxy-port
// listener each it could not): SLUICE_SCALE_SERVICES of them (default
// 20,000; issue 16 asks for 50,000) with 10 endpoints each, from
// manifests, captured by nftables. Probed through the first, a middle and
// the last ClusterIP from the client namespace; then one Service's
// endpoint moves by a manifest edit, and a Service is added. It logs the time to ready, the
// resident memory and the edit's time to effect.
func TestUserspaceCapturePortAtScale(t *testing.T) {
	n := 20000
	if s := os.Getenv("SLUICE_SCALE_SERVICES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 2000 || n > 64000 || n%1000 != 0 {
			t.Fatalf("SLUICE_SCALE_SERVICES=%q: want a multiple of 1000, 2000-64000 (the edited file is not the first)", s)
		}
	}
	b := newNetnsBed(t)
	b.startBackends("b", "10.244.0.5", "10.244.0.6")
	dir := t.TempDir()
	for from := 0; from < n; from += 1000 {
		scaleManifest(t, dir, from, from+1000, "10.244.0.5")
	}
	// SLUICE_SCALE_HEAP_PROFILE=FILE also writes the settled process's
	// heap profile there (go tool pprof -sample_index=inuse_space FILE),
	// and its text form, MemStats included, to FILE.txt.
	heapOut := os.Getenv("SLUICE_SCALE_HEAP_PROFILE")
	args := []string{"--manifests", dir, "--healthz-bind-address=", "--metrics-bind-address=", "--manifest-coalesce=1ms"}
	// SLUICE_SCALE_MODE=nftables or iptables runs the same in that mode
	// instead (for its memory and sync figures; the probes are the same).
	mode := "userspace mode, one capture port"
	switch m := os.Getenv("SLUICE_SCALE_MODE"); m {
	case "":
		args = append([]string{"--proxy-mode=userspace", "--userspace-capture=nftables", "--userspace-capture-port=15001"}, args...)
	case "nftables", "iptables":
		args, mode = append([]string{"--proxy-mode=" + m}, args...), m+" mode"
	default:
		t.Fatalf("SLUICE_SCALE_MODE=%q: want nftables, iptables or nothing", m)
	}
	if heapOut != "" {
		args = append(args, "--profiling", "--metrics-bind-address=127.0.0.1:10249")
	}
	start := time.Now()
	p := b.start(b.node, nil, append([]string{sluiceBin}, args...)...)
	applied := p.waitLogWithin(5*time.Minute, "state applied")
	tookReady := time.Since(start)
	for _, i := range []int{0, n / 2 / 1000 * 1000, n - 1} { // the services with the probe backend: each file's first and last
		if d := distinct(b.tries("tcp", scaleIP(i)+":80", 3)); d["b@10.244.0.5"] != 3 {
			t.Fatalf("service %d of %d (%s): %v, want the backend", i, n, scaleIP(i), d)
		}
	}
	// Read once the start-up's garbage is handed back (run does it
	// handBackDelay after the first large state, on a goroutine of its
	// own).
	p.waitLogWithin(handBackDelay+time.Minute, "garbage handed back")
	rss := residentKiB(t, p.cmd.Process.Pid)
	if heapOut != "" {
		b.in(b.node, "curl", "-sSfo", heapOut, "http://127.0.0.1:10249/debug/pprof/heap?gc=1")
		// The text form ends with the runtime's MemStats: HeapAlloc is the
		// live heap, exactly.
		b.in(b.node, "curl", "-sSfo", heapOut+".txt", "http://127.0.0.1:10249/debug/pprof/heap?gc=1&debug=1")
	}
	// One Service's endpoint moves: the file holding it is rewritten.
	edit := n / 2 / 1000 * 1000
	scaleManifest(t, dir, edit, edit+1000, "10.244.0.6")
	edited := time.Now()
	for {
		if got := b.tries("tcp", scaleIP(edit)+":80", 1)[0]; got == "b@10.244.0.6" {
			break
		}
		if time.Since(edited) > time.Minute {
			t.Fatalf("service %d still not on its new endpoint a minute after the edit", edit)
		}
	}
	tookEdit := time.Since(edited)
	// A Service comes: a new file with it. Timed to sluice's log line
	// (a probe sent before the capture has its portal is lost and waits
	// for the client's timeout), then probed.
	scaleManifest(t, dir, n, n+1, "10.244.0.6")
	added := time.Now()
	addLine := p.waitLogWithin(time.Minute, "state applied", fmt.Sprintf("scale/s%d:", n))
	tookAdd := time.Since(added)
	if d := distinct(b.tries("tcp", scaleIP(n)+":80", 2)); d["b@10.244.0.6"] != 2 {
		t.Fatalf("the added service %d: %v", n, d)
	}
	t.Log(addLine)
	if d := distinct(b.tries("tcp", scaleIP(0)+":80", 2)); d["b@10.244.0.5"] != 2 {
		t.Fatalf("after the edit, service 0: %v", d)
	}
	t.Logf("%d Services x 10 endpoints in %s: first state applied %s after start (%s), %d MiB resident, a one-Service edit served in %s (probe included), an added Service applied in %s",
		n, mode, tookReady.Round(time.Millisecond), applied, rss/1024, tookEdit.Round(time.Millisecond), tookAdd.Round(time.Millisecond))
}

// residentKiB is a process's VmRSS.
func residentKiB(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kib
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
