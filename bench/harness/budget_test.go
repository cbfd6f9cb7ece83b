//go:build linux

package harness

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCPUHierarchyIsTheOneWithTheCPUController(t *testing.T) {
	for _, tc := range []struct{ self, fstype, opts string }{
		{"5:memory:/x\n4:cpu,cpuacct:/\n0::/\n", "cgroup", "cpu,cpuacct"}, // v1 (hybrid): mounted with exactly its controllers
		{"1:cpu:/\n0::/\n", "cgroup", "cpu"},
		{"0::/user.slice\n", "cgroup2", ""},
	} {
		fstype, opts, err := cpuHierarchy(tc.self)
		if err != nil || fstype != tc.fstype || opts != tc.opts {
			t.Errorf("%q: %q %q %v, want %q %q", tc.self, fstype, opts, err, tc.fstype, tc.opts)
		}
	}
	if _, _, err := cpuHierarchy("3:memory:/\n"); !errors.Is(err, errNotApplicable) {
		t.Errorf("no CPU hierarchy: %v, want not applicable", err)
	}
}

// The quota is written where each cgroup version keeps it; files in a
// temporary directory stand in for the cgroup file system.
func TestCPUCgroupHoldsToTheBudget(t *testing.T) {
	v1 := t.TempDir()
	os.WriteFile(filepath.Join(v1, "cpu.cfs_quota_us"), []byte("-1\n"), 0o644)
	cg, err := newCPUCgroup(cgroupRoots{v2: filepath.Join(v1, "none"), v1: v1}, "lb")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.limit(0.5); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"} {
		if b, _ := os.ReadFile(filepath.Join(cg.dir, file)); string(b) != want {
			t.Errorf("v1 %s: %q, want %q", file, b, want)
		}
	}

	v2 := t.TempDir()
	os.WriteFile(filepath.Join(v2, "cgroup.controllers"), []byte("cpuset cpu io memory\n"), 0o644)
	cg, err = newCPUCgroup(cgroupRoots{v2: v2, v1: v1}, "lb")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.limit(0.5); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(v2, "cgroup.subtree_control")); string(b) != "+cpu" {
		t.Errorf("v2 root's subtree_control: %q, want +cpu (the child gets cpu.max only then)", b)
	}
	if b, _ := os.ReadFile(filepath.Join(cg.dir, "cpu.max")); string(b) != "50000 100000" {
		t.Errorf("v2 cpu.max: %q, want \"50000 100000\"", b)
	}

	noCPU := t.TempDir()
	os.WriteFile(filepath.Join(noCPU, "cgroup.controllers"), []byte("memory pids\n"), 0o644)
	if _, err := newCPUCgroup(cgroupRoots{v2: noCPU, v1: v1}, "lb"); err == nil || !strings.Contains(err.Error(), "no cpu controller") {
		t.Errorf("v2 without the cpu controller: %v", err)
	}
}

// A process placed in a cgroup joins it before the program starts: the
// shell writes its PID, which exec keeps, into cgroup.procs (a plain file
// here).
func TestStartProcJoinsItsCgroupBeforeTheProgram(t *testing.T) {
	procs := filepath.Join(t.TempDir(), "cgroup.procs")
	os.WriteFile(procs, nil, 0o644)
	p, err := StartProc("sleeper", Place{CPU: -1, Cgroup: procs}, "sleep", "30")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	if !p.WaitFor(5*time.Second, func() bool {
		comm, _ := os.ReadFile("/proc/" + strconv.Itoa(p.PID()) + "/comm")
		return strings.TrimSpace(string(comm)) == "sleep"
	}) {
		t.Fatalf("sleep never ran: %s", p.Output())
	}
	if b, _ := os.ReadFile(procs); strings.TrimSpace(string(b)) != strconv.Itoa(p.PID()) {
		t.Fatalf("cgroup.procs holds %q, want the program's PID %d", b, p.PID())
	}
}
