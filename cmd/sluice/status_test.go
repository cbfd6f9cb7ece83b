package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/admin"
	"github.com/sluice-proxy/sluice/listeners"
)

// `sluice status` shows what a running sluice serves: each service port
// with its frontends, its endpoints (a dead one ejected) and its counters;
// --json the same as data; and says plainly when nothing answers.
func TestStatusShowsWhatIsServed(t *testing.T) {
	bport, dead, np, mp, np2 := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp")
	httpBackend(t, fmt.Sprintf("127.0.0.1:%d", bport), "ok")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, nodePort: %d, protocol: TCP}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: web, namespace: e2e}
subsets:
- addresses: [{ip: 127.0.0.1}]
  ports: [{name: http, port: %d}]
- addresses: [{ip: 127.0.0.1}]
  ports: [{name: http, port: %d}]
- notReadyAddresses: [{ip: 127.0.0.2}]
  ports: [{name: http, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 10.96.0.11
  sessionAffinity: ClientIP
  ports: [{port: 80, nodePort: %d, protocol: TCP}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: sticky, namespace: e2e}
subsets:
- addresses: [{ip: 127.0.0.1}]
  ports: [{port: %d}]
`, np, bport, dead, np2, bport))
	metrics := fmt.Sprintf("127.0.0.1:%d", mp)
	p := start(t, "--manifests", dir, "--bind-address", "127.0.0.1", "--userspace-capture=none", "--eject-after=1", "--eject-backoff=1h",
		"--healthz-bind-address=", "--metrics-bind-address="+metrics)
	engine := p.waitLog("userspace engine")
	p.waitLog("state applied")
	var loops int
	_, after, _ := strings.Cut(engine, " loops=")
	if _, err := fmt.Sscan(after, &loops); err != nil {
		t.Fatalf("the engine's log line has no loop count (%v): %s", err, engine)
	}
	ringLine := fmt.Sprintf("\nio_uring: %d event loops batch their reads and writes on it\n", loops)
	ringLoops := loops
	if !strings.Contains(engine, `ioUring="on`) {
		ringLine, ringLoops = "\nio_uring: off, a syscall per read and write (the start-up log says why)\n", 0
	}
	for i := 0; i < 4; i++ {
		if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); got != "ok" {
			t.Fatalf("try %d: %q", i, got)
		}
	}
	if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", np2)); got != "ok" {
		t.Fatalf("sticky: %q", got)
	}
	// No traffic while status measures its rates (1s): they are 0.
	out, err := exec.Command(sluiceBin, "status", "--metrics-bind-address="+metrics).CombinedOutput()
	text := string(out)
	for _, want := range []string{
		"userspace mode; state applied ",
		fmt.Sprintf("\nevent loops: %d\n", loops),
		ringLine,
		"2 service ports\n",
		"TCP  e2e/web:http  active 0, connections 4 (0.0/s), retried 1, failed connects 1, refused 0, errors 0.0/s\n",
		fmt.Sprintf("  <- nodePort 127.0.0.1:%d\n", np),
		fmt.Sprintf("  -> %-24s ready\n", fmt.Sprintf("127.0.0.1:%d", bport)),
		fmt.Sprintf("  -> %-24s ready; ejected (connects failed; probed again in 59m5", fmt.Sprintf("127.0.0.1:%d", dead)), // of 1h
		fmt.Sprintf("  -> %-24s not-ready; not used\n", "127.0.0.2:8080"),
		"TCP  e2e/sticky affinity ClientIP 3h0m0s  active 0, connections 1 (0.0/s)",
		fmt.Sprintf("  -> %-24s ready; 1 client pinned\n", fmt.Sprintf("127.0.0.1:%d", bport)),
	} {
		if err != nil || !strings.Contains(text, want) {
			t.Fatalf("sluice status (%v) lacks %q:\n%s", err, want, text)
		}
	}
	out, err = exec.Command(sluiceBin, "status", "-o", "json", "--metrics-bind-address="+metrics).Output()
	var st instanceStatus
	if err != nil || json.Unmarshal(out, &st) != nil || st.Mode != "userspace" || len(st.Ports) != 2 || st.Ports[1].Connections != 4 ||
		len(st.Ports[1].Ejected) != 1 || len(st.Ports[1].States) != 3 || st.Ports[0].States[0].Pinned != 1 || st.Ports[1].ConnRate == nil ||
		st.IOUring == nil || st.IOUring.Loops != float64(ringLoops) || st.IOUring.Failures != 0 ||
		st.EventLoops == nil || st.EventLoops.Loops != float64(loops) {
		t.Fatalf("sluice status -o json (%v):\n%s", err, out)
	}
	// --watch prints again until interrupted.
	w := exec.Command(sluiceBin, "status", "--watch=10ms", "--rate-interval=0", "--metrics-bind-address="+metrics)
	stdout, _ := w.StdoutPipe()
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	for seen := 0; seen < 3 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "sluice at ") {
			seen++
		}
	}
	w.Process.Signal(os.Interrupt)
	if err := w.Wait(); err != nil {
		t.Fatalf("status --watch after SIGINT: %v", err)
	}
	closed := freePort(t, "tcp")
	out, err = exec.Command(sluiceBin, "status", fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", closed)).CombinedOutput()
	if code := exitCode(err); code != 1 || !strings.Contains(string(out), "no sluice answers at") {
		t.Fatalf("status with nothing there: exit %d\n%s", code, out)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// Rates come from two samples: new connections, and errors (failed
// connects plus refused clients), per second; a port new since the first
// sample, or whose counters went back (a restarted sluice), gets none.
func TestStatusRatesFromTwoSamples(t *testing.T) {
	port := func(svc string, conns, fails, refused float64) portStatus {
		return portStatus{PortView: listeners.PortView{Service: svc, Protocol: "TCP"}, Connections: conns, Failures: fails, Refused: refused}
	}
	prev := &instanceStatus{Ports: []portStatus{port("a", 100, 1, 0), port("b", 50, 0, 0)}}
	cur := &instanceStatus{Ports: []portStatus{port("a", 300, 3, 2), port("b", 10, 0, 0), port("c", 5, 0, 0)}}
	cur.withRates(prev, 2*time.Second)
	a, b, c := cur.Ports[0], cur.Ports[1], cur.Ports[2]
	if a.ConnRate == nil || *a.ConnRate != 100 || a.ErrorRate == nil || *a.ErrorRate != 2 {
		t.Fatalf("a: %v %v", a.ConnRate, a.ErrorRate)
	}
	if b.ConnRate != nil || c.ConnRate != nil {
		t.Fatalf("rates for a restarted or new port: %v %v", b.ConnRate, c.ConnRate)
	}
	var buf strings.Builder
	cur.Mode = "userspace"
	cur.print(&buf, time.Now())
	if !strings.Contains(buf.String(), "connections 300 (100.0/s), retried 0, failed connects 3, refused 2, errors 2.0/s\n") ||
		!strings.Contains(buf.String(), "connections 10, retried 0, failed connects 0, refused 0\n") {
		t.Fatalf("printed:\n%s", buf.String())
	}
}

// The engine's lines: the event loops, with the CPU limit that bounded
// their number when there is one; and io_uring, saying when the loops make
// plain syscalls, and when a ring was given up since start-up (its batch's
// connections reset). A status without the engine's figures (the goroutine
// engine, a kernel mode) has neither line.
func TestStatusGivesTheEngine(t *testing.T) {
	for _, c := range []struct {
		loops *eventLoopStatus
		ring  *ioUringStatus
		want  string
	}{
		{&eventLoopStatus{Loops: 4}, &ioUringStatus{Loops: 4}, "event loops: 4\nio_uring: 4 event loops batch their reads and writes on it\n"},
		{&eventLoopStatus{Loops: 1, CPULimit: 0.5}, &ioUringStatus{Loops: 0},
			"event loops: 1 (the cgroup CPU limit, 0.5 CPUs, rounded up, bounds them)\nio_uring: off, a syscall per read and write (the start-up log says why)\n"},
		{&eventLoopStatus{Loops: 3}, &ioUringStatus{Loops: 3, Failures: 1},
			"event loops: 3\nio_uring: 3 event loops batch on it; 1 gave it up after a failed io_uring_enter (see the log)\n"},
		{nil, nil, ""},
	} {
		st := &instanceStatus{Address: "http://127.0.0.1:10249", Mode: "userspace", LastSync: map[string]time.Time{}, EventLoops: c.loops, IOUring: c.ring}
		var out strings.Builder
		st.print(&out, time.Now())
		got := ""
		for _, l := range strings.SplitAfter(out.String(), "\n") {
			if strings.HasPrefix(l, "event loops") || strings.HasPrefix(l, "io_uring") {
				got += l
			}
		}
		if got != c.want {
			t.Errorf("%+v %+v: lines %q, want %q; all:\n%s", c.loops, c.ring, got, c.want, out.String())
		}
	}
}

// `sluice status` says why a ready endpoint takes no cluster traffic: the
// topology hints give it to another zone (here from this node's Node in
// the manifests, whose zone it shows), or internalTrafficPolicy Local
// keeps traffic on this node; an endpoint the hints leave this node is
// used.
func TestStatusSaysWhyAReadyEndpointIsNotUsed(t *testing.T) {
	np, np2, mp := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: z1}
---
apiVersion: v1
kind: Service
metadata: {name: zoned, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: zoned-1, namespace: e2e, labels: {kubernetes.io/service-name: zoned}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [127.0.0.2]
  hints: {forZones: [{name: z1}]}
- addresses: [127.0.0.3]
  hints: {forZones: [{name: z2}]}
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 10.96.0.21
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: e2e, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [127.0.0.4]
  nodeName: node-a
- addresses: [127.0.0.5]
  nodeName: node-b
`, np, np2))
	metrics := fmt.Sprintf("127.0.0.1:%d", mp)
	p := start(t, "--manifests", dir, "--hostname-override", "node-a", "--bind-address", "127.0.0.1", "--userspace-capture=none",
		"--healthz-bind-address=", "--metrics-bind-address="+metrics)
	p.waitLog("state applied")
	out, err := exec.Command(sluiceBin, "status", "--rate-interval=0", "--metrics-bind-address="+metrics).CombinedOutput()
	text := string(out)
	for _, want := range []string{
		"\nnode node-a: zone z1\n",
		fmt.Sprintf("  -> %-24s ready\n", "127.0.0.2:8080"),
		fmt.Sprintf("  -> %-24s ready; not used (its topology hints are for other zones or nodes)\n", "127.0.0.3:8080"),
		fmt.Sprintf("  -> %-24s ready, local\n", "127.0.0.4:8080"),
		fmt.Sprintf("  -> %-24s ready; not used (internal traffic policy Local, and it is on another node)\n", "127.0.0.5:8080"),
	} {
		if err != nil || !strings.Contains(text, want) {
			t.Fatalf("sluice status (%v) lacks %q:\n%s", err, want, text)
		}
	}
	out, err = exec.Command(sluiceBin, "status", "-o", "json", "--rate-interval=0", "--metrics-bind-address="+metrics).Output()
	var st instanceStatus
	if err != nil || json.Unmarshal(out, &st) != nil || len(st.Ports) != 2 || st.Node == nil || *st.Node != (admin.NodeView{Name: "node-a", Zone: "z1", Eligible: true}) {
		t.Fatalf("sluice status -o json (%v):\n%s", err, out)
	}
	local, zoned := st.Ports[0], st.Ports[1]
	if !local.InternalLocal || zoned.InternalLocal || len(zoned.States) != 2 || zoned.States[0].OutOfTopology || !zoned.States[1].OutOfTopology {
		t.Fatalf("sluice status -o json: the policy or the topology is not as written:\n%s", out)
	}
}
