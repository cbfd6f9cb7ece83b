package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// quickStart is the README's "Quick start" section: its shell blocks, one
// command per line, comments apart.
type quickStartLine struct{ cmd, comment string }

func readmeQuickStart(t *testing.T) [][]quickStartLine {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "\n## Quick start\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Quick start" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var blocks [][]quickStartLine
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		var block []quickStartLine
		for _, l := range strings.Split(strings.TrimSpace(m[1]), "\n") {
			cmd, comment, _ := strings.Cut(l, "#")
			block = append(block, quickStartLine{strings.TrimSpace(cmd), strings.TrimSpace(comment)})
		}
		blocks = append(blocks, block)
	}
	return blocks
}

// group is a command started in a process group of its own, so that what
// it leaves behind can be found and stopped.
type group struct {
	cmd  *exec.Cmd
	done chan error
}

func startGroup(t *testing.T, dir string, env []string, line string) *group {
	t.Helper()
	cmd := exec.Command("bash", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, err := os.Create(filepath.Join(t.TempDir(), "out.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &group{cmd: cmd, done: make(chan error, 1)}
	go func() { g.done <- cmd.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever is left, if the test failed half-way
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("%s: output:\n%s", line, out)
		}
	})
	return g
}

// stop sends SIGINT to the command's own PID, as a user stopping it by PID
// would, and waits for it and everything it started to end.
func (g *group) stop(t *testing.T) {
	t.Helper()
	g.cmd.Process.Signal(os.Interrupt)
	select {
	case <-g.done:
	case <-time.After(60 * time.Second): // a safety net, not a synchronisation
		t.Fatalf("%v: still running 60 s after SIGINT to its PID", g.cmd.Args)
	}
	// The process group must be empty: nothing left running.
	for i := 0; ; i++ {
		if err := syscall.Kill(-g.cmd.Process.Pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if i == 200 {
			out, _ := exec.Command("ps", "-o", "pid,args", "-g", fmt.Sprint(g.cmd.Process.Pid)).CombinedOutput()
			t.Fatalf("%v ended but left processes running:\n%s", g.cmd.Args, out)
		}
		time.Sleep(50 * time.Millisecond) // the group's last members are being reaped
	}
}

// The README's quick start, run exactly as written, in this test's private
// network namespace: `make run`, then the curl its comment says to run,
// whose answers take turns over the three backends, then SIGINT to make's
// PID stops everything (it used to leave make, the script and sluice
// running); and the cluster block, `make build` and the sluice command line,
// against a real kube-apiserver as ~/.kube/config (HOME is a temporary
// directory holding the cluster's kubeconfig; this host has no sudo, so a
// `sudo` that runs its arguments, as sudo does for root, is first on PATH),
// which then serves a NodePort Service created through the API.
func TestREADMEQuickStartAsWritten(t *testing.T) {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the quick start binds fixed ports and captures ClusterIPs: it needs a private network namespace, which needs root"))
	}
	blocks := readmeQuickStart(t)
	if len(blocks) != 2 || len(blocks[0]) != 1 || len(blocks[1]) != 2 {
		t.Fatalf("the quick start changed shape (want a make run block and a two-line cluster block): %q", blocks)
	}
	repo, _ := filepath.Abs("../..")

	// Block 1: make run, then what its comment says to run.
	run := blocks[0][0]
	then, ok := strings.CutPrefix(run.comment[strings.Index(run.comment, "then: "):], "then: ")
	if run.cmd != "make run" || !ok {
		t.Fatalf("block 1: %+v", run)
	}
	demo := startGroup(t, repo, os.Environ(), run.cmd)
	curl := func() (string, error) {
		out, err := exec.Command("bash", "-c", then).Output()
		return string(out), err
	}
	for deadline := time.Now().Add(5 * time.Minute); ; { // make run builds first
		if _, err := curl(); err == nil {
			break
		}
		select {
		case err := <-demo.done:
			t.Fatalf("make run ended: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never answered", then)
		}
	}
	seen := map[string]int{}
	for i := 0; i < 6; i++ {
		out, err := curl()
		if err != nil {
			t.Fatalf("%s: %v", then, err)
		}
		seen[regexp.MustCompile(`backend-\d`).FindString(out)]++
	}
	if seen["backend-1"] != 2 || seen["backend-2"] != 2 || seen["backend-3"] != 2 {
		t.Fatalf("six %q: %v, want the three backends taking turns", then, seen)
	}
	demo.stop(t)

	// Block 2: against a cluster.
	c := startCluster(t)
	home := t.TempDir()
	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(home, ".kube"), 0o700)
	if err := os.WriteFile(filepath.Join(home, ".kube", "config"), kc, 0o600); err != nil {
		t.Fatal(err)
	}
	path := os.Getenv("PATH")
	if _, err := exec.LookPath("sudo"); err != nil {
		shim := t.TempDir()
		os.WriteFile(filepath.Join(shim, "sudo"), []byte("#!/bin/sh\nexec \"$@\"\n"), 0o755)
		path = shim + ":" + path
	}
	// Go's caches stay where they are (they default to under $HOME).
	goenv, err := exec.Command("go", "env", "GOPATH", "GOMODCACHE", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	gv := strings.Fields(string(goenv))
	env := append(os.Environ(), "HOME="+home, "PATH="+path, "GOPATH="+gv[0], "GOMODCACHE="+gv[1], "GOCACHE="+gv[2])
	build := exec.Command("bash", "-c", blocks[1][0].cmd)
	build.Dir, build.Env = repo, env
	if out, err := build.CombinedOutput(); blocks[1][0].cmd != "make build" || err != nil {
		t.Fatalf("%q: %v\n%s", blocks[1][0].cmd, err, out)
	}
	node := startGroup(t, repo, env, blocks[1][1].cmd)
	ctx := context.Background()
	svc, err := c.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "quick"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := addLocalAddr("10.244.77.7"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("ip", "addr", "del", "10.244.77.7/32", "dev", "lo").Run() })
	httpBackend(t, "10.244.77.7:8080", "quick-backend")
	_, err = c.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "quick-1", Labels: map[string]string{discoveryv1.LabelServiceName: "quick"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(8080)), Protocol: ptrTo(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.77.7"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true), Serving: ptrTo(true)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np := int(svc.Spec.Ports[0].NodePort)
	for deadline := time.Now().Add(60 * time.Second); ; {
		if got, err := hit(np); err == nil && got == "quick-backend" {
			break
		}
		select {
		case err := <-node.done:
			t.Fatalf("%q ended: %v", blocks[1][1].cmd, err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("NodePort %d never served the Service", np)
		}
	}
	// Healthy once the state is applied (kube-proxy's /healthz on its
	// default address); the listener can serve a moment before the
	// health server hears of the sync.
	for deadline := time.Now().Add(60 * time.Second); ; {
		code, body := status(t, "http://127.0.0.1:10256/healthz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("healthz %d: %s", code, body)
		}
		time.Sleep(50 * time.Millisecond) // polling an HTTP status: there is no event to wait on
	}
	node.stop(t)
}
