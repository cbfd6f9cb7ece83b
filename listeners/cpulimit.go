package listeners

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
)

// CgroupCPULimit is the CPU bandwidth the process's cgroups allow it, in
// CPUs (quota over period; the smallest along the path from its cgroup to
// the hierarchy's root, as the kernel enforces every level), read from
// fsys, the machine's root (os.DirFS("/")). It is 0 when no level sets a
// quota, or when the process is in no CPU cgroup hierarchy (not Linux, no
// cgroup file system mounted). A Kubernetes container's CPU limit is such
// a quota: `limits: cpu: 500m` is 0.5.
//
// Both cgroup v2 (cpu.max) and v1 (cpu.cfs_quota_us, cpu.cfs_period_us)
// are read; a cgroup namespace is followed through the mount's root, as
// /proc/self/mountinfo gives it.
func CgroupCPULimit(fsys fs.FS) (float64, error) {
	own, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	mounts, err := fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	dir, ok := cpuCgroupDir(string(own), string(mounts))
	if !ok {
		return 0, nil
	}
	limit := 0.0
	for {
		l, err := readCPULimit(fsys, dir.at, dir.v2)
		if err != nil {
			return 0, err
		}
		if l > 0 && (limit == 0 || l < limit) {
			limit = l
		}
		if dir.at == dir.mount {
			return limit, nil
		}
		dir.at = path.Dir(dir.at)
	}
}

// cgroupDir is the process's cgroup directory, at, under the mount point
// of its hierarchy, mount (both relative to the root of fsys), and whether
// that hierarchy is cgroup v2.
type cgroupDir struct {
	at, mount string
	v2        bool
}

// cpuCgroupDir finds the directory of the process's cgroup in the
// hierarchy that has the CPU controller: a v1 hierarchy mounted with the
// cpu option first (on a hybrid system the v2 one has no CPU controller),
// else the v2 one. False: none is mounted where the process can see it.
func cpuCgroupDir(procSelfCgroup, mountinfo string) (cgroupDir, bool) {
	var v1Path, v2Path string
	var v1Found, v2Found bool
	for _, line := range strings.Split(strings.TrimSpace(procSelfCgroup), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2Path, v2Found = f[2], true
		case slices.Contains(strings.Split(f[1], ","), "cpu"):
			v1Path, v1Found = f[2], true
		}
	}
	var v2Mount *mountEntry
	for _, line := range strings.Split(mountinfo, "\n") {
		m, ok := parseMountinfo(line)
		if !ok {
			continue
		}
		switch {
		case v1Found && m.fstype == "cgroup" && slices.Contains(strings.Split(m.superOpts, ","), "cpu"):
			return m.dirOf(v1Path, false)
		case v2Found && m.fstype == "cgroup2" && v2Mount == nil:
			v2Mount = &m
		}
	}
	if v2Mount == nil {
		return cgroupDir{}, false
	}
	return v2Mount.dirOf(v2Path, true)
}

// mountEntry is what a mountinfo line says of a mount: the path inside the
// file system it shows (root), where (point), its type and its options.
type mountEntry struct{ root, point, fstype, superOpts string }

// parseMountinfo reads one line of /proc/self/mountinfo (proc(5)): ID,
// parent ID, major:minor, root, mount point, options, optional fields up
// to "-", then type, source and super options.
func parseMountinfo(line string) (mountEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return mountEntry{}, false
	}
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+1 >= len(f) {
		return mountEntry{}, false
	}
	m := mountEntry{root: unescapeMount(f[3]), point: unescapeMount(f[4]), fstype: f[sep+1]}
	if sep+3 < len(f) {
		m.superOpts = f[sep+3]
	}
	return m, true
}

// dirOf is where cgroup path p (as /proc/self/cgroup gives it) is under
// this mount, if the mount shows it at all.
func (m mountEntry) dirOf(p string, v2 bool) (cgroupDir, bool) {
	rel, ok := strings.CutPrefix(p, m.root)
	if !ok || m.root != "/" && rel != "" && !strings.HasPrefix(rel, "/") {
		return cgroupDir{}, false
	}
	mount := strings.TrimPrefix(path.Clean(m.point), "/")
	if mount == "" {
		mount = "."
	}
	return cgroupDir{at: path.Join(mount, rel), mount: mount, v2: v2}, true
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readCPULimit reads one cgroup directory's quota in CPUs (0: none set
// there). A directory the mount does not show (the files are missing) has
// none.
func readCPULimit(fsys fs.FS, dir string, v2 bool) (float64, error) {
	quotaFile := "cpu.cfs_quota_us"
	if v2 {
		quotaFile = "cpu.max"
	}
	b, err := fs.ReadFile(fsys, path.Join(dir, quotaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	// v2: "QUOTA PERIOD" or "max PERIOD"; v1: the quota or -1, and the
	// period in a file of its own.
	f := strings.Fields(string(b))
	if !v2 && len(f) == 1 && f[0] != "-1" {
		p, err := fs.ReadFile(fsys, path.Join(dir, "cpu.cfs_period_us"))
		if err != nil {
			return 0, err
		}
		f = append(f, strings.TrimSpace(string(p)))
	}
	switch {
	case len(f) == 2 && f[0] != "max":
		return quotaOver(path.Join(dir, quotaFile), f[0], f[1])
	case v2 && len(f) == 2, !v2 && len(f) == 1: // max, -1: no quota here
		return 0, nil
	}
	return 0, fmt.Errorf("%s: want a quota and a period, have %q", path.Join(dir, quotaFile), strings.TrimSpace(string(b)))
}

func quotaOver(file, quota, period string) (float64, error) {
	q, err1 := strconv.ParseInt(quota, 10, 64)
	p, err2 := strconv.ParseInt(period, 10, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0, fmt.Errorf("%s: quota %q over period %q is not a CPU limit", file, quota, period)
	}
	return float64(q) / float64(p), nil
}

// LoopsWithin is how many event loops fit a CPU limit: its CPUs rounded
// up, at least one, and never more than n (0: no limit). The event loop
// engine runs that many by default, with n its CPUs.
func LoopsWithin(n int, cpuLimit float64) int {
	if cpuLimit <= 0 {
		return n
	}
	return max(1, min(n, int(math.Ceil(cpuLimit-1e-9))))
}
