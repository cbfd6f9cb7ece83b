package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The fault suite (issue 19): the faults the issue found, each bounded,
// against the real binary on both engines, in the tests' private network
// namespace; then a check that nothing was left behind: sockets and
// pipes, goroutines, the active-connections gauge back to their baseline, and RSS
// near it.
func TestFaultSuiteLeavesNothingBehind(t *testing.T) {
	for _, engine := range []string{"eventloop", "goroutine"} {
		t.Run(engine, func(t *testing.T) { faultSuite(t, engine) })
	}
}

// npService is one NodePort Service of a test manifest, with one endpoint
// on 127.0.0.1:port, or none.
type npService struct {
	name, proto string
	nodePort    int
	port        int
	noEndpoint  bool
}

// nodePortManifest renders the Services and their EndpointSlices in ns.
func nodePortManifest(ns string, svcs ...npService) string {
	var b strings.Builder
	for _, s := range svcs {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: %s}\nspec:\n  type: NodePort\n  ports: [{name: p, port: 80, nodePort: %d, protocol: %s}]\n---\n", s.name, ns, s.nodePort, s.proto)
		fmt.Fprintf(&b, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s-1, namespace: %s, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{name: p, port: %d, protocol: %s}]\n", s.name, ns, s.name, s.port, s.proto)
		if s.noEndpoint {
			b.WriteString("endpoints: []\n---\n")
		} else {
			b.WriteString("endpoints: [{addresses: [127.0.0.1]}]\n---\n")
		}
	}
	return b.String()
}

// serveFunc runs handle for each connection to addr until the test ends.
func serveFunc(t *testing.T, addr string, handle func(*net.TCPConn)) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); handle(c.(*net.TCPConn)) }()
		}
	}()
}

// usage is what the leak check compares.
type usage struct {
	sockets, goroutines, active int
	rssKB                       int
}

// goroutineDump is the process's goroutines, grouped by stack, as its
// /debug/pprof serves them (--profiling), or why it could not be read.
func goroutineDump(metricsPort int) string {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", metricsPort))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func measure(t *testing.T, pid, metricsPort int) usage {
	t.Helper()
	var u usage
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		// Sockets and pipes (splice's; the goroutine engine's pool of
		// them is empty once no connection is open).
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && (strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "pipe:")) {
			u.sockets++
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(status); m != nil {
		u.rssKB, _ = strconv.Atoi(string(m[1]))
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch {
		case f[0] == "go_goroutines":
			u.goroutines = int(v)
		case strings.HasPrefix(f[0], "sluice_active_connections{"):
			u.active += int(v)
		}
	}
	return u
}

func faultSuite(t *testing.T, engine string) {
	okPort, silentPort, rstPort, udpPort := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "udp")
	httpBackend(t, fmt.Sprintf("127.0.0.1:%d", okPort), "ok")
	udpBackend(t, fmt.Sprintf("127.0.0.1:%d", udpPort), "u")
	release := make(chan struct{})
	serveFunc(t, fmt.Sprintf("127.0.0.1:%d", silentPort), func(c *net.TCPConn) {
		defer c.Close()
		io.Copy(io.Discard, c)
		<-release // silent, and open, until the test ends: sluice must give up on it
	})
	serveFunc(t, fmt.Sprintf("127.0.0.1:%d", rstPort), func(c *net.TCPConn) { c.SetLinger(0); c.Close() })
	defer close(release)

	okNP, silentNP, rstNP, noneNP, udpNP := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "udp")
	hz, mp := freePort(t, "tcp"), freePort(t, "tcp")
	dir := t.TempDir()
	// ok (HTTP), silent (reads, never answers nor closes), rst (accepts,
	// then resets), none (no endpoints) and udp (echo).
	writeFile(t, filepath.Join(dir, "svc.yaml"), nodePortManifest("fault",
		npService{"ok", "TCP", okNP, okPort, false}, npService{"silent", "TCP", silentNP, silentPort, false},
		npService{"rst", "TCP", rstNP, rstPort, false}, npService{"none", "TCP", noneNP, okPort, true},
		npService{"udp", "UDP", udpNP, udpPort, false}))
	p := start(t, "--manifests", dir, "--engine", engine, "--bind-address", "127.0.0.1",
		fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp),
		"--conntrack-tcp-timeout-close-wait=1s", "--udp-timeout=300ms", "--drain-timeout=1s", "--connect-budget=1s", "--manifest-max-bytes=200000",
		"--profiling") // for the goroutines' stacks when some are left behind
	p.waitLog("listening", "role=nodePort", fmt.Sprintf("127.0.0.1:%d", udpNP))
	pid := p.cmd.Process.Pid
	addr := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	getOK := func() error {
		resp, err := client.Get("http://" + addr(okNP) + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "ok" {
			return fmt.Errorf("got %q", b)
		}
		return nil
	}
	// refusedOrReset dials and reads: the connection must end in a reset.
	endsInReset := func(a string, halfClose bool) error {
		c, err := net.Dial("tcp", a)
		if err != nil {
			return nil // refused at once is fine too
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second)) // a safety net
		if halfClose {
			c.Write([]byte("request"))
			c.(*net.TCPConn).CloseWrite()
		}
		_, err = io.ReadAll(c)
		if err == nil {
			return errors.New("ended cleanly, want a reset")
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errors.New("still open after 20 s")
		}
		return nil
	}
	udpAsk := func() error {
		c, err := net.Dial("udp", addr(udpNP))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("q"))
		b := make([]byte, 64)
		n, err := c.Read(b)
		if err != nil || string(b[:n]) != "u:q" {
			return fmt.Errorf("udp answer %q: %v", b[:n], err)
		}
		return nil
	}
	parallel := func(what string, n int, fn func() error) {
		t.Helper()
		errs := make(chan error, n)
		sem := make(chan struct{}, 50)
		for i := 0; i < n; i++ {
			sem <- struct{}{}
			go func() { defer func() { <-sem }(); errs <- fn() }()
		}
		for i := 0; i < n; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	settled := func(base usage, what string) usage {
		t.Helper()
		var u usage
		deadline := time.Now().Add(30 * time.Second) // a safety net; the poll stops as soon as it holds
		for {
			u = measure(t, pid, mp)
			if u.active == 0 && u.sockets <= base.sockets && u.goroutines <= base.goroutines+2 {
				return u
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: left behind %+v, baseline %+v; goroutines:\n%s", what, u, base, goroutineDump(mp))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Warm-up: one of each, so pools and lazily started goroutines exist
	// before the baseline.
	if err := getOK(); err != nil {
		t.Fatal(err)
	}
	if err := udpAsk(); err != nil {
		t.Fatal(err)
	}
	base := settled(usage{sockets: 1 << 20, goroutines: 1 << 20}, "warm-up")

	parallel("short connections", 300, getOK)
	parallel("no endpoints", 200, func() error { return endsInReset(addr(noneNP), false) })
	parallel("resetting backend", 100, func() error { return endsInReset(addr(rstNP), false) })
	parallel("half-closed to a silent backend", 50, func() error { return endsInReset(addr(silentNP), true) })
	parallel("UDP flows", 300, udpAsk)
	parallel("clients that connect and leave", 100, func() error {
		c, err := net.Dial("tcp", addr(okNP))
		if err == nil {
			c.Close()
		}
		return err
	})
	// Bad manifests, each refused while the rest keeps serving.
	empty := filepath.Join(dir, "empty.yaml")
	writeFile(t, empty, "")
	p.waitLog("manifest update rejected", "empty.yaml")
	os.Remove(empty)
	big := filepath.Join(dir, "big.yaml")
	writeFile(t, big, "# "+strings.Repeat("x", 300000)+"\n")
	p.waitLog("manifest update rejected", "big.yaml", "manifest-max-bytes")
	os.Remove(big)
	if err := getOK(); err != nil {
		t.Fatalf("after the faults: %v", err)
	}

	after := settled(base, "after the faults")
	if grown := after.rssKB - base.rssKB; grown > 32<<10 {
		t.Fatalf("RSS grew by %d KB through the faults (baseline %d KB), want under 32 MB", grown, base.rssKB)
	}
	t.Logf("baseline %+v, after %+v", base, after)

	// SIGTERM with a connection open to the silent backend, both sides
	// open: the drain ends at --drain-timeout (1 s), whatever the backend
	// does, and sluice exits 0.
	hung, err := net.Dial("tcp", addr(silentNP))
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	hung.Write([]byte("request, no FIN"))
	for deadline := time.Now().Add(20 * time.Second); measure(t, pid, mp).active != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) { // a safety net: accepted, not in the accept queue
			t.Fatal("the connection to the silent backend was not accepted in 20 s")
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.waitLog("drain cut open connections")
	if code := p.exitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
}
