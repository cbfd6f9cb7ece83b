//go:build linux

package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// budgetCPUs is the CPU the capped workloads hold every load balancer to:
// half of one CPU, well under what any of them takes unbounded here, so
// that the load balancer and not the load generator or the backends (which
// keep the other 1.5 CPUs of a 2-CPU box) sets the rate. A rate at an
// equal budget is a throughput comparison that the load generator sharing
// the box cannot flatten.
const budgetCPUs = 0.5

// budgetPeriod is the quota's accounting period: 100 ms, the kernel's
// default and the kubelet's (--cpu-cfs-quota-period), so the budget is
// what a Kubernetes container's CPU limit of 500m is.
const budgetPeriod = 100 * time.Millisecond

// cpuCgroup is a cgroup, held to a CPU quota, that one capped run's load
// balancer is started in and that goes with it.
type cpuCgroup struct {
	dir string
	v2  bool // cpu.max; else cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us
}

// cgroupRoots are where the CPU controller is looked for: cgroup v2's
// unified hierarchy, then cgroup v1's cpu hierarchy.
type cgroupRoots struct{ v2, v1 string }

// cgroupMount is where a run finds the machine's CPU cgroup hierarchy:
// /sys/fs/cgroup, or, when the harness runs under `ip netns exec` (the
// netns topology), whose private /sys has no cgroup mounts, a mount of
// the same hierarchy made in that private mount namespace, which no
// other process sees and which close removes.
type cgroupMount struct {
	mounted string // the directory mounted on, if any
	done    bool   // roots and err are known
	roots   cgroupRoots
	err     error
}

// get finds (or mounts) the hierarchy, once per run.
func (m *cgroupMount) get() (cgroupRoots, error) {
	if !m.done {
		m.roots, m.err = m.find()
		m.done = true
	}
	return m.roots, m.err
}

func (m *cgroupMount) find() (cgroupRoots, error) {
	sys := cgroupRoots{v2: "/sys/fs/cgroup", v1: "/sys/fs/cgroup/cpu"}
	for _, f := range []string{filepath.Join(sys.v2, "cgroup.controllers"), filepath.Join(sys.v1, "cpu.cfs_quota_us")} {
		if _, err := os.Stat(f); err == nil {
			return sys, nil
		}
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupRoots{}, err
	}
	fstype, opts, err := cpuHierarchy(string(own))
	if err != nil {
		return cgroupRoots{}, err
	}
	dir, err := os.MkdirTemp("", "sluice-bench-cgroup-")
	if err != nil {
		return cgroupRoots{}, err
	}
	if err := unix.Mount("cgroup", dir, fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		os.Remove(dir)
		return cgroupRoots{}, fmt.Errorf("mount the %s hierarchy (%q) on %s: %w", fstype, opts, dir, err)
	}
	m.mounted = dir
	return cgroupRoots{v2: dir, v1: dir}, nil
}

// close unmounts what get mounted.
func (m *cgroupMount) close() {
	if m.mounted != "" {
		unix.Unmount(m.mounted, unix.MNT_DETACH)
		os.Remove(m.mounted)
		m.mounted = ""
	}
}

// cpuHierarchy reads /proc/self/cgroup for the hierarchy that has the cpu
// controller: cgroup v1's (mounted with exactly its controllers, or the
// kernel refuses) or, with none, the unified v2 one.
func cpuHierarchy(procSelfCgroup string) (fstype, opts string, err error) {
	unified := false
	for _, line := range strings.Split(strings.TrimSpace(procSelfCgroup), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			unified = true
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "cpu" {
				return "cgroup", f[1], nil
			}
		}
	}
	if unified {
		return "cgroup2", "", nil
	}
	// Not a failure of the harness: a box without CPU cgroups (the VM
	// suite's guest) cannot hold a process to a budget.
	return "", "", fmt.Errorf("%w: no cgroup hierarchy has the cpu controller (/proc/self/cgroup)", errNotApplicable)
}

// newCPUCgroup makes an empty cgroup named name under whichever CPU
// controller roots has, or says what is missing.
func newCPUCgroup(roots cgroupRoots, name string) (*cpuCgroup, error) {
	if ctrl, err := os.ReadFile(filepath.Join(roots.v2, "cgroup.controllers")); err == nil {
		if !strings.Contains(" "+strings.TrimSpace(string(ctrl))+" ", " cpu ") {
			return nil, fmt.Errorf("cgroup v2 at %s has no cpu controller (cgroup.controllers: %q)", roots.v2, strings.TrimSpace(string(ctrl)))
		}
		// A child gets cpu.max only once its parent delegates the
		// controller; the root is exempt from the no-internal-process
		// rule, so the harness may stay where it is.
		if err := os.WriteFile(filepath.Join(roots.v2, "cgroup.subtree_control"), []byte("+cpu"), 0o644); err != nil {
			return nil, fmt.Errorf("enable the cpu controller in %s: %w", roots.v2, err)
		}
		dir := filepath.Join(roots.v2, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		return &cpuCgroup{dir: dir, v2: true}, nil
	}
	if _, err := os.Stat(filepath.Join(roots.v1, "cpu.cfs_quota_us")); err == nil {
		dir := filepath.Join(roots.v1, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		return &cpuCgroup{dir: dir}, nil
	}
	return nil, fmt.Errorf("no cgroup CPU controller: neither %s/cgroup.controllers (v2) nor %s/cpu.cfs_quota_us (v1)", roots.v2, roots.v1)
}

func (c *cpuCgroup) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(c.dir, file), []byte(value), 0o644); err != nil {
		return fmt.Errorf("cgroup %s: %w", file, err)
	}
	return nil
}

// limit holds the cgroup to cpus CPUs' worth of time per period.
func (c *cpuCgroup) limit(cpus float64) error {
	period := budgetPeriod.Microseconds()
	quota := int64(cpus * float64(period))
	if c.v2 {
		return c.write("cpu.max", fmt.Sprintf("%d %d", quota, period))
	}
	// v1 refuses a period that would leave the quota below it, so the
	// quota is lifted first.
	if err := c.write("cpu.cfs_quota_us", "-1"); err != nil {
		return err
	}
	if err := c.write("cpu.cfs_period_us", strconv.FormatInt(period, 10)); err != nil {
		return err
	}
	return c.write("cpu.cfs_quota_us", strconv.FormatInt(quota, 10))
}

// throttled reads how many periods the quota stopped the cgroup in.
func (c *cpuCgroup) throttled() (int64, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nr_throttled" {
			return strconv.ParseInt(f[1], 10, 64)
		}
	}
	return 0, errors.New("cgroup cpu.stat has no nr_throttled")
}

// remove deletes the cgroup; its processes must have exited (a cgroup
// with members refuses rmdir).
func (c *cpuCgroup) remove() error {
	var err error
	for i := 0; i < 50; i++ { // an exited process leaves its cgroup just after it is reaped
		if err = os.Remove(c.dir); err == nil || os.IsNotExist(err) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// capped runs inner on another instance of the system, started inside a
// cgroup held to budgetCPUs (so that a system that sizes itself by its
// CPU limit, as sluice does, sees it from the start), and adds how much of
// the budget it used (near 100 %: the load balancer set the rate) and how
// many periods it was throttled in. Systems with no process of their own
// forwarding (direct, the kernel modes) are not applicable.
func capped(inner func(context.Context, *Instance, Size) (Metrics, error)) func(context.Context, *Instance, Size) (Metrics, error) {
	return func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
		if in.Proc == nil || IsKernelMode(in.System) {
			return nil, errNotApplicable
		}
		roots, err := in.shared.cgroups.get()
		if err != nil {
			return nil, err
		}
		cg, err := newCPUCgroup(roots, fmt.Sprintf("sluice-bench-%d-%s", os.Getpid(), in.System.Name()))
		if err != nil {
			return nil, err
		}
		defer cg.remove()
		if err := cg.limit(budgetCPUs); err != nil {
			return nil, err
		}
		sub, err := Launch(in.System, in.Topo, filepath.Join(in.Dir, "capped"), in.launched, Place{CPU: in.at.CPU, Cgroup: filepath.Join(cg.dir, "cgroup.procs")})
		if err != nil {
			return nil, err
		}
		defer sub.Stop()
		sub.shared = in.shared
		thr0, _ := cg.throttled()
		u0, t0 := sub.Usage(), time.Now()
		m, err := inner(ctx, sub, sz)
		u1, took := sub.Usage(), time.Since(t0)
		thr1, _ := cg.throttled()
		if m != nil {
			used := u1.CPUSeconds - u0.CPUSeconds
			m[ownCPUKey] = used
			m["budget_used_pct"] = 100 * used / (took.Seconds() * budgetCPUs)
			m["throttled_periods"] = float64(thr1 - thr0)
		}
		return m, err
	}
}

// ownCPUKey is a metric a workload that ran its own instance of the
// system reports that instance's CPU-seconds under; Execute takes it as
// the run's LB CPU.
const ownCPUKey = "own_lb_cpu_s"
