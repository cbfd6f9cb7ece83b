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
)

// `sluice status` shows what a running sluice serves: each service port
// with its frontends, its endpoints (a dead one ejected) and its counters;
// --json the same as data; and says plainly when nothing answers.
func TestStatusShowsWhatIsServed(t *testing.T) {
	bport, dead, np, mp := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp")
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
`, np, bport, dead))
	metrics := fmt.Sprintf("127.0.0.1:%d", mp)
	p := start(t, "--manifests", dir, "--bind-address", "127.0.0.1", "--userspace-capture=none", "--eject-after=1", "--eject-backoff=1h",
		"--healthz-bind-address=", "--metrics-bind-address="+metrics)
	p.waitLog("state applied")
	for i := 0; i < 4; i++ {
		if got := get(t, fmt.Sprintf("http://127.0.0.1:%d/", np)); got != "ok" {
			t.Fatalf("try %d: %q", i, got)
		}
	}
	out, err := exec.Command(sluiceBin, "status", "--metrics-bind-address="+metrics).CombinedOutput()
	text := string(out)
	for _, want := range []string{
		"userspace mode; state applied ",
		"TCP  e2e/web:http  active 0, connections 4, retried 1, failed connects 1, refused 0\n",
		fmt.Sprintf("  <- nodePort 127.0.0.1:%d\n", np),
		fmt.Sprintf("  -> %-24s serving\n", fmt.Sprintf("127.0.0.1:%d", bport)),
		fmt.Sprintf("  -> %-24s ejected (connects failed; probed again in 1h0m0s)", fmt.Sprintf("127.0.0.1:%d", dead)),
	} {
		if err != nil || !strings.Contains(text, want) {
			t.Fatalf("sluice status (%v) lacks %q:\n%s", err, want, text)
		}
	}
	out, err = exec.Command(sluiceBin, "status", "-o", "json", "--metrics-bind-address="+metrics).Output()
	var st instanceStatus
	if err != nil || json.Unmarshal(out, &st) != nil || st.Mode != "userspace" || len(st.Ports) != 1 || st.Ports[0].Connections != 4 || len(st.Ports[0].Ejected) != 1 {
		t.Fatalf("sluice status -o json (%v):\n%s", err, out)
	}
	// --watch prints again until interrupted.
	w := exec.Command(sluiceBin, "status", "--watch=10ms", "--metrics-bind-address="+metrics)
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
