//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/kernel/netnstest"
)

// A container's CPU limit is a cgroup quota. sluice started in a real
// cgroup held to half a CPU sizes its event loops to it (one, where it
// would run one per CPU) and logs the limit; the default number of loops
// is otherwise one per CPU (TestEventLoopsFlag).
func TestEventLoopsFollowTheCgroupCPULimit(t *testing.T) {
	if os.Geteuid() != 0 {
		netnstest.Unavailable(t, "root, for a cgroup of its own")
	}
	procs := quotaCgroup(t, 50000, 100000)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), "apiVersion: v1\nkind: List\nitems: []\n")
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	args := []string{"--manifests", dir, "--userspace-capture=none", "--healthz-bind-address=", "--metrics-bind-address=" + metrics,
		"--handover-socket", filepath.Join(t.TempDir(), "handover.sock")}
	// The shell joins the cgroup, then becomes sluice: no thread of
	// sluice ever runs outside it.
	p := startCmd(t, exec.Command("sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, procs, sluiceBin}, args...)...))
	p.waitLog("userspace engine", "loops=1 ", "cpuLimit=0.5")
	p.waitLog("state applied")
	// `sluice status` says so too.
	out, err := exec.Command(sluiceBin, "status", "--rate-interval=0", "--metrics-bind-address="+metrics).CombinedOutput()
	if want := "\nevent loops: 1 (the cgroup CPU limit, 0.5 CPUs, rounded up, bounds them)\n"; err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("sluice status (%v) lacks %q:\n%s", err, want, out)
	}
}

// quotaCgroup makes a cgroup held to quota/period of a CPU (cgroup v2's
// cpu.max, or v1's cpu hierarchy), removed when the test ends (after the
// processes in it, which tests stop first), and returns its cgroup.procs.
func quotaCgroup(t *testing.T, quota, period int) string {
	t.Helper()
	name := fmt.Sprintf("sluice-test-%d", os.Getpid())
	var dir string
	if ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		if !strings.Contains(" "+strings.TrimSpace(string(ctrl))+" ", " cpu ") {
			netnstest.Unavailable(t, "the cgroup v2 cpu controller")
		}
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu"), 0o644); err != nil {
			t.Fatalf("enable the cpu controller: %v", err)
		}
		dir = filepath.Join("/sys/fs/cgroup", name)
		mkCgroup(t, dir)
		write(t, filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", quota, period))
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		dir = filepath.Join("/sys/fs/cgroup/cpu", name)
		mkCgroup(t, dir)
		write(t, filepath.Join(dir, "cpu.cfs_period_us"), fmt.Sprint(period))
		write(t, filepath.Join(dir, "cpu.cfs_quota_us"), fmt.Sprint(quota))
	} else {
		netnstest.Unavailable(t, "a cgroup CPU controller (v2 cpu.max or v1 cpu.cfs_quota_us)")
	}
	return filepath.Join(dir, "cgroup.procs")
}

func mkCgroup(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
	})
}

func write(t *testing.T, file, value string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}
