package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
	"github.com/sluice-proxy/sluice/listeners"
)

// End-to-end tests: the built binary, driven from outside as a user would.

var sluiceBin string

func TestMain(m *testing.M) {
	if runHelper() {
		return
	}
	if code, ok := reexecInPrivateNetns(); ok {
		os.Exit(code)
	}
	if err := setUpPrivateNetns(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		panic(err)
	}
	sluiceBin = filepath.Join(dir, "sluice")
	// Built as the image and `make build` build it, so that a cold
	// machine compiles its dependencies once for all three.
	build := exec.Command("go", "build", "-trimpath", "-o", sluiceBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build sluice: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	began := time.Now()
	code := m.Run()
	os.RemoveAll(dir)
	removeStaleHandoverSockets()
	// route_localnet marks of the tests' namespaces, deleted by now.
	marks, _ := filepath.Glob(filepath.Join(handoverDir, "route_localnet-*.was"))
	for _, f := range marks {
		if fi, err := os.Stat(f); err == nil && !fi.ModTime().Before(began) {
			os.Remove(f)
		}
	}
	os.Exit(code)
}

// removeStaleHandoverSockets removes the hand-over socket files under
// /run/sluice that no process answers on (sluice processes the tests
// killed with SIGKILL; startCmd users that pass no --handover-socket).
func removeStaleHandoverSockets() {
	files, _ := filepath.Glob(filepath.Join(handoverDir, "handover-*.sock"))
	for _, f := range files {
		c, err := net.Dial("unixpacket", f)
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			os.Remove(f)
		}
	}
}

// drawnPorts are the ports freePort has handed out in this test process.
// A port is free when drawn but bound only later, by sluice or a backend,
// so two draws (in one test, or in tests running in parallel) could name
// the same port, and the second to bind failed (CI: sluice's metrics
// listener, "address already in use"). Ports are process-wide, and so is
// this record of them: test code only.
var drawnPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// drawPort records port as handed out, and reports false if it was.
func drawPort(port int) bool {
	drawnPorts.Lock()
	defer drawnPorts.Unlock()
	if drawnPorts.m[port] {
		return false
	}
	drawnPorts.m[port] = true
	return true
}

// freePort is a port free for network now (kubetest.FreePort), none
// drawn twice in this test process.
func freePort(t *testing.T, network string) int {
	return kubetest.FreePort(t, network, drawPort)
}

// httpBackend serves "name" on addr until the test ends.
func httpBackend(t *testing.T, addr, name string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func udpBackend(t *testing.T, addr, name string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte(name+":"), buf[:n]...), from)
		}
	}()
}

type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string
	stdout chan string
	done   chan error
	// seen are the last log lines waitLog read, for its failures.
	seen []string
}

func start(t *testing.T, args ...string) *proc {
	t.Helper()
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--handover-socket") }) {
		// Tests kill sluice with SIGKILL, which leaves the socket file: keep
		// it in the test's directory rather than /run/sluice.
		args = append(args, "--handover-socket", filepath.Join(t.TempDir(), "handover.sock"))
	}
	return startCmd(t, exec.Command(sluiceBin, args...))
}

// startCmd starts cmd, collecting its stderr lines and stdout, and kills it
// by PID when the test ends.
func startCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	stderr, _ := cmd.StderrPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, lines: make(chan string, 1000), stdout: make(chan string, 100), done: make(chan error, 1)}
	scan := func(r io.Reader, ch chan string) {
		s := bufio.NewScanner(r)
		s.Buffer(nil, 64<<20) // an error line that names thousands of listeners
		for s.Scan() {
			ch <- s.Text()
		}
		close(ch)
	}
	// Nothing a test has not read yet ever blocks the process's writes to
	// stderr: kube-proxy at --v=2 logs thousands of lines that no test
	// reads, and once a bounded buffer and the pipe filled, it stopped
	// syncing mid-test.
	unread := make(chan string)
	go relay(unread, p.lines)
	go scan(stderr, unread)
	go scan(stdout, p.stdout)
	go func() {
		// Wait only after both pipes are drained.
		for range p.stdout {
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// relay passes src's lines on to dst in order, queueing without bound
// the ones dst has no room for, and closes dst after src.
func relay(src <-chan string, dst chan<- string) {
	var queue []string
	for src != nil || len(queue) > 0 {
		var out chan<- string
		var next string
		if len(queue) > 0 {
			out, next = dst, queue[0]
		}
		select {
		case l, ok := <-src:
			if !ok {
				src = nil
				continue
			}
			queue = append(queue, l)
		case out <- next:
			queue = queue[1:]
		}
	}
	close(dst)
}

// waitLog consumes log lines until one contains all of subs.
func (p *proc) waitLog(subs ...string) string {
	p.t.Helper()
	return p.waitLogWithin(30*time.Second, subs...) // a safety net, never a synchronisation
}

// waitLogWithin is waitLog with another safety net (a start-up that reads
// tens of thousands of Services).
func (p *proc) waitLogWithin(d time.Duration, subs ...string) string {
	p.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("sluice exited before logging %q; its last lines:\n%s", subs, strings.Join(p.seen, "\n"))
			}
			if p.seen = append(p.seen, l); len(p.seen) > 20 {
				p.seen = p.seen[1:]
			}
			match := true
			for _, s := range subs {
				match = match && strings.Contains(l, s)
			}
			if match {
				return l
			}
		case <-deadline:
			p.t.Fatalf("no log line with %q; the last lines:\n%s", subs, strings.Join(p.seen, "\n"))
		}
	}
}

func (p *proc) exitCode() int {
	p.t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			p.t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		p.t.Fatal("sluice did not exit")
	}
	return -1
}

func get(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func manifest(nodePort, udpNodePort, backendPort, udpBackendPort int, addrs ...string) string {
	var eps strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&eps, "- addresses: [%q]\n", a)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: e2e}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports:
  - {name: http, port: 80, nodePort: %d}
  - {name: dns, port: 53, protocol: UDP, nodePort: %d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: e2e
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: %d}, {name: dns, port: %d, protocol: UDP}]
endpoints:
%s`, nodePort, udpNodePort, backendPort, udpBackendPort, eps.String())
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestEndToEndManifestsHotReloadBadReloadAndSIGTERM(t *testing.T) {
	for _, engine := range []string{"eventloop", "goroutine"} {
		t.Run(engine, func(t *testing.T) { endToEnd(t, engine) })
	}
}

func endToEnd(t *testing.T, engine string) {
	bport, uport := freePort(t, "tcp"), freePort(t, "udp")
	for i, a := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		httpBackend(t, fmt.Sprintf("%s:%d", a, bport), fmt.Sprintf("b%d", i+1))
		udpBackend(t, fmt.Sprintf("%s:%d", a, uport), fmt.Sprintf("b%d", i+1))
	}
	np, unp, hz, mp := freePort(t, "tcp"), freePort(t, "udp"), freePort(t, "tcp"), freePort(t, "tcp")
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	writeFile(t, file, manifest(np, unp, bport, uport, "127.0.0.1", "127.0.0.2", "127.0.0.3"))
	p := start(t, "--manifests", dir, "--engine", engine, "--bind-address", "127.0.0.1",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp),
		"--ipvs-scheduler=lc")
	p.waitLog("not used in this mode", "mode=userspace", "flags=ipvs-scheduler")
	p.waitLog("state applied")
	p.waitLog("listening", "role=nodePort", fmt.Sprintf("127.0.0.1:%d", np))

	url := fmt.Sprintf("http://127.0.0.1:%d/", np)
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		seen[get(t, url)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("6 requests reached %v, want all three backends", seen)
	}
	if body := get(t, fmt.Sprintf("http://127.0.0.1:%d/healthz", hz)); !strings.Contains(body, "lastUpdated") {
		t.Fatalf("healthz: %s", body)
	}
	// UDP through the NodePort.
	uc, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", unp))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	uc.SetDeadline(time.Now().Add(10 * time.Second))
	uc.Write([]byte("ping"))
	buf := make([]byte, 100)
	n, err := uc.Read(buf)
	if err != nil || !strings.HasSuffix(string(buf[:n]), ":ping") {
		t.Fatalf("UDP reply %q, %v", buf[:n], err)
	}

	// Hot reload: scale down to one endpoint.
	writeFile(t, file, manifest(np, unp, bport, uport, "127.0.0.2"))
	p.waitLog("state applied", "e2e/web:")
	for i := 0; i < 4; i++ {
		if got := get(t, url); got != "b2" {
			t.Fatalf("after scale-down got %q, want b2", got)
		}
	}

	// A bad reload is rejected; the last good state keeps serving.
	writeFile(t, file, strings.Replace(manifest(np, unp, bport, uport, "127.0.0.2"), "nodePort: "+fmt.Sprint(np), "nodePort: 99999", 1))
	line := p.waitLog("manifest update rejected")
	if !strings.Contains(line, "svc.yaml") || !strings.Contains(line, "Service e2e/web") || !strings.Contains(line, "spec.ports[0].nodePort") {
		t.Fatalf("rejection does not name file, object and field: %s", line)
	}
	if got := get(t, url); got != "b2" {
		t.Fatalf("after bad reload got %q", got)
	}
	// One edit may be read more than once (editors' write-then-rename raises
	// several events), so the count is at least one, not exactly one.
	m := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", mp))
	if !regexp.MustCompile(`sluice_rejected_updates_total\{object="Service e2e/web",source="manifests"\} [1-9]`).MatchString(m) {
		t.Fatalf("rejected update not counted:\n%s", m)
	}
	// Each service port's data-path series, listed with the port.
	for _, series := range []string{`sluice_connections_total{protocol="TCP",service="e2e/web:http"}`,
		`sluice_connections_total{protocol="UDP",service="e2e/web:dns"}`} {
		if !regexp.MustCompile(regexp.QuoteMeta(series) + ` [1-9]`).MatchString(m) {
			t.Fatalf("no %s counted in the metrics:\n%s", series, m)
		}
	}

	// SIGTERM: stop accepting, drain the open connection, exit 0. The
	// connection is proven to be through the proxy (one keep-alive request)
	// before the signal, so it is not still waiting in the accept queue.
	open, ask := keepAlive(t, np)
	defer open.Close()
	if got := ask(""); got != "b2" {
		t.Fatalf("keep-alive request got %q", got)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.waitLog("shutting down")
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", np), time.Second)
		if err != nil {
			break
		}
		c.Close()
	}
	if got := ask("Connection: close\r\n"); got != "b2" {
		t.Fatalf("draining connection got %q", got)
	}
	open.Close() // the drain waits for the client's side too
	if code := p.exitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
}

// SIGHUP drains like SIGTERM (issue 19, item 11): Go's default ended the
// process at once, cutting a streaming client with what looked like a
// clean end of its data.
// keepAlive opens one HTTP connection to 127.0.0.1:port; ask sends a GET
// on it (with an extra header line, or "") and returns the body.
func keepAlive(t *testing.T, port int) (net.Conn, func(header string) string) {
	t.Helper()
	open, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	open.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(open)
	return open, func(header string) string {
		fmt.Fprintf(open, "GET / HTTP/1.1\r\nHost: x\r\n%s\r\n", header)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request on the open connection: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
}

func TestEndToEndSIGHUPDrainsLikeSIGTERM(t *testing.T) {
	bport := freePort(t, "tcp")
	httpBackend(t, fmt.Sprintf("127.0.0.1:%d", bport), "b1")
	np := freePort(t, "tcp")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), manifest(np, freePort(t, "udp"), bport, freePort(t, "udp"), "127.0.0.1"))
	p := start(t, "--manifests", dir, "--bind-address", "127.0.0.1", "--healthz-bind-address=", "--metrics-bind-address=")
	p.waitLog("listening", "role=nodePort", fmt.Sprintf("127.0.0.1:%d", np))
	open, ask := keepAlive(t, np)
	defer open.Close()
	if got := ask(""); got != "b1" {
		t.Fatalf("keep-alive request got %q", got)
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	p.waitLog("shutting down", "signal=hangup")
	if got := ask("Connection: close\r\n"); got != "b1" {
		t.Fatalf("connection open across SIGHUP got %q, want it served to its end", got)
	}
	open.Close()
	if code := p.exitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGHUP", code)
	}
}

// With the data plane full (more clients than its descriptors allow),
// /healthz and /metrics still answer: the data plane stops accepting at
// its budget, below RLIMIT_NOFILE, and clients wait in the accept queue
// (issue 19, item 7). Before, accepts took every descriptor, the admin
// server's accepts failed with EMFILE, and a liveness probe would have
// restarted the pod. sluice runs under prlimit with 256 descriptors.
func TestEndToEndAdminAnswersWhenTheDataPlaneIsFull(t *testing.T) {
	bport := freePort(t, "tcp")
	httpBackend(t, fmt.Sprintf("127.0.0.1:%d", bport), "b1")
	np, hz, mp := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), manifest(np, freePort(t, "udp"), bport, freePort(t, "udp"), "127.0.0.1"))
	for _, engine := range []string{"eventloop", "goroutine"} {
		t.Run(engine, func(t *testing.T) {
			// One event loop: each loop accepts from a socket of its own
			// (SO_REUSEPORT), so with two the kernel may queue the last
			// client on the loop that is ahead, and it is served while an
			// earlier one waits (a CI run under -race saw it). With one
			// socket the queue is in dialling order and the last client is
			// the one left waiting.
			args := []string{"--nofile=256:256", "--", sluiceBin, "--manifests", dir, "--engine", engine,
				"--bind-address", "127.0.0.1", fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp)}
			if engine == "eventloop" {
				args = append(args, "--event-loops=1")
			}
			p := startCmd(t, exec.Command("prlimit", args...))
			p.waitLog("listening", "role=nodePort", fmt.Sprintf("127.0.0.1:%d", np))
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for i := 0; i < 200; i++ { // 400 descriptors' worth
				c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", np))
				if err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				held = append(held, c)
			}
			// The last client is only queued: proof that the data plane is full.
			last := held[len(held)-1]
			fmt.Fprintf(last, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			last.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := last.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the 200th client: %v; want it waiting (data plane full)", err)
			}
			client := &http.Client{Timeout: 10 * time.Second} // a safety net
			for _, url := range []string{fmt.Sprintf("http://127.0.0.1:%d/healthz", hz), fmt.Sprintf("http://127.0.0.1:%d/livez", hz), fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)} {
				resp, err := client.Get(url)
				if err != nil {
					t.Fatalf("%s with the data plane full: %v", url, err)
				}
				resp.Body.Close()
			}
			for _, c := range held[:len(held)-1] {
				c.Close()
			}
			last.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(last), nil)
			if err != nil {
				t.Fatalf("the queued client once others left: %v", err)
			}
			resp.Body.Close()
		})
	}
}

func TestEndToEndBadInputAtStartupExitsNonZero(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  clusterIP: 10.0.0.1\n  ports: [{port: 80, name: a}, {port: 81, name: a}]\n")
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--manifests", bad, "--healthz-bind-address=", "--metrics-bind-address="}, []string{"bad.yaml", "Service default/s", "spec.ports[1].name", "duplicate"}},
		{[]string{"--udp-timeout=fast"}, []string{"--udp-timeout", "fast"}},
		{[]string{"--bind-address=1.2.3"}, []string{"--bind-address", "1.2.3"}},
		{[]string{"--healthz-bind-address="}, []string{"--manifests"}},
	}
	for _, tc := range cases {
		p := start(t, tc.args...)
		var all []string
		for l := range p.lines {
			all = append(all, l)
		}
		if code := p.exitCode(); code == 0 {
			t.Errorf("%v exited 0", tc.args)
		}
		out := strings.Join(all, "\n")
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output %q lacks %q", tc.args, out, w)
			}
		}
	}
}

// This kernel has no IPVS: IPVS mode says so and falls back (to iptables,
// or on to userspace), or, with --mode-fallback=false, refuses to start.
func TestEndToEndIPVSUnavailable(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "svc.yaml")
	writeFile(t, good, "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n"+
		"---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s-1, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [127.0.0.2]}]\n")
	p := start(t, "--proxy-mode=ipvs", "--manifests", good, "--healthz-bind-address=", "--metrics-bind-address=", "--userspace-capture=none")
	p.waitLog("proxy mode ipvs is unavailable; falling back to iptables mode", "IPVS is not available")
	if os.Geteuid() == 0 { // else iptables mode falls back to userspace too
		// The manifest's loopback endpoint cannot be reached through DNAT: said once.
		p.waitLog("endpoints on loopback addresses are not reachable in iptables mode", "default/s", "127.0.0.2:8080")
	}
	p.waitLog("state applied")
	p.cmd.Process.Signal(os.Interrupt)
	if code := p.exitCode(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	hard := start(t, "--proxy-mode=ipvs", "--mode-fallback=false", "--manifests", good, "--healthz-bind-address=", "--metrics-bind-address=")
	var all []string
	for l := range hard.lines {
		all = append(all, l)
	}
	if code := hard.exitCode(); code == 0 || !strings.Contains(strings.Join(all, "\n"), "IPVS is not available") {
		t.Fatalf("--mode-fallback=false: exit %d, output %q", code, all)
	}
}

func TestEndToEndVersionAndWriteConfig(t *testing.T) {
	out, err := exec.Command(sluiceBin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "sluice ") {
		t.Fatalf("--version: %q %v", out, err)
	}
	file := filepath.Join(t.TempDir(), "kp.yaml")
	if out, err := exec.Command(sluiceBin, "--write-config-to", file, "--proxy-port-range=30000-30100").CombinedOutput(); err != nil {
		t.Fatalf("--write-config-to: %v %s", err, out)
	}
	data, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(data), "kind: KubeProxyConfiguration") || !strings.Contains(string(data), "portRange: 30000-30100") {
		t.Fatalf("written config:\n%s", data)
	}
	var helpErr bytes.Buffer
	help := exec.Command(sluiceBin, "--help")
	help.Stderr = &helpErr
	if out, err := help.Output(); err != nil || !strings.Contains(string(out), "--proxy-mode") || helpErr.Len() != 0 || strings.Count(string(out), "  --proxy-mode ") != 1 {
		t.Fatalf("--help: printed %d bytes to stderr and --proxy-mode %d times to stdout (%v); want the usage once, on stdout", helpErr.Len(), strings.Count(string(out), "  --proxy-mode "), err)
	}
	if out, err := exec.Command(sluiceBin, "--help").Output(); err != nil || !strings.Contains(string(out), "--proxy-mode") {
		t.Fatalf("--help: %v", err)
	}
	for _, flag := range []string{"--cleanup", "--init-only"} {
		if out, err := exec.Command(sluiceBin, flag).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", flag, err, out)
		}
	}
}

// This kernel has no SCTP: the SCTP port of a Service is skipped with a
// warning that says why and a metric, and its TCP port serves on.
func TestEndToEndSCTPSkippedWithoutKernelSupport(t *testing.T) {
	if listeners.SCTPSupported() == nil {
		t.Skip("this kernel has SCTP; the VM suite covers serving it") // never the case on the CI machine
	}
	bport, np, sp, mp := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp")
	httpBackend(t, fmt.Sprintf("127.0.0.1:%d", bport), "tcp-ok")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: mixed}
spec:
  type: NodePort
  clusterIP: 10.96.0.40
  ports:
  - {name: web, port: 80, nodePort: %d, protocol: TCP}
  - {name: sig, port: 9000, nodePort: %d, protocol: SCTP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: mixed-1, labels: {kubernetes.io/service-name: mixed}}
addressType: IPv4
ports: [{name: web, port: %d, protocol: TCP}, {name: sig, port: 9000, protocol: SCTP}]
endpoints: [{addresses: [127.0.0.1]}]
`, np, sp, bport))
	p := start(t, "--manifests", dir, "--bind-address", "127.0.0.1", "--userspace-capture=none",
		"--healthz-bind-address=", fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))
	p.waitLog("SCTP service port not served", "default/mixed:sig", "the kernel has no SCTP")
	p.waitLog("state applied")
	if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); got != "tcp-ok" {
		t.Fatalf("TCP port of the same Service: %q", got)
	}
	if m := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)); !strings.Contains(m, "sluice_sctp_ports_skipped 1") {
		t.Fatalf("metrics lack sluice_sctp_ports_skipped 1")
	}
}

// --event-loops sets how many event loops serve (HAProxy's nbthread);
// the default is one per CPU.
func TestEventLoopsFlag(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), "apiVersion: v1\nkind: List\nitems: []\n")
	for _, tc := range []struct {
		args []string
		want int
	}{{[]string{"--event-loops=1"}, 1}, {nil, runtime.NumCPU()}} {
		p := start(t, append([]string{"--manifests", dir, "--userspace-capture=none", "--healthz-bind-address=", "--metrics-bind-address="}, tc.args...)...)
		p.waitLog("userspace engine", fmt.Sprintf("loops=%d ", tc.want))
	}
}

// With --manifests, this node's Node object in them is what /healthz
// judges eligibility by, as kube-proxy judges the API's: tainted for
// deletion by the cluster autoscaler, the node answers 503 with
// "nodeEligible": false (an external load balancer then drains it), and
// again 200 once the taint, or the Node, is gone; `sluice status` says so
// on its node line.
func TestManifestNodeTaintedForDeletionFailsHealthz(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: e2e}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n")
	hz, mp := freePort(t, "tcp"), freePort(t, "tcp")
	p := start(t, "--manifests", dir, "--hostname-override", "node-a", "--userspace-capture=none", "--bind-address", "127.0.0.1",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp))
	p.waitLog("state applied")
	// sluice status says it too, on the node's line.
	const nodeLine = "\nnode node-a: no zone label (zone hints are not followed)"
	const ineligible = "; not eligible for traffic: its Node is being deleted or tainted ToBeDeletedByClusterAutoscaler, and /healthz answers 503"
	healthz := func(when string, code int, eligible string) {
		t.Helper()
		out, err := exec.Command(sluiceBin, "status", "--rate-interval=0", fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp)).CombinedOutput()
		want := nodeLine + "\n"
		if eligible == "false" {
			want = nodeLine + ineligible + "\n"
		}
		if err != nil || !strings.Contains(string(out), want) {
			t.Fatalf("%s: sluice status (%v) lacks %q:\n%s", when, err, want, out)
		}
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", hz))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != code || !strings.Contains(string(body), `"nodeEligible":`+eligible) {
			t.Fatalf("%s: /healthz %d %s, want %d with nodeEligible %s", when, resp.StatusCode, body, code, eligible)
		}
	}
	healthz("no Node", http.StatusOK, "true")
	node := filepath.Join(dir, "node.yaml")
	writeFile(t, node, "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nspec:\n  taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]\n")
	p.waitLog("this node's Node object has no zone label")
	healthz("tainted for deletion", http.StatusServiceUnavailable, "false")
	if err := os.Remove(node); err != nil {
		t.Fatal(err)
	}
	p.waitLog("no Node object for this node any more")
	healthz("the Node gone", http.StatusOK, "true")
}
