package listeners

import (
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
)

// A mountinfo line for a cgroup mount: root inside the hierarchy, mount
// point, type and super options.
func mountLine(id int, root, point, fstype, superOpts string) string {
	return strings.Join([]string{strconv.Itoa(id), "1", "0:30", root, point, "rw,nosuid,nodev,noexec,relatime", "shared:9", "-", fstype, "cgroup", superOpts}, " ")
}

func TestCgroupCPULimitReadsTheQuotaTheKernelEnforces(t *testing.T) {
	procRoot := mountLine(1, "/", "/proc", "proc", "rw")
	v2Root := mountLine(2, "/", "/sys/fs/cgroup", "cgroup2", "rw,nsdelegate")
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  float64
	}{
		{"v2 in a cgroup namespace (a container's view): its own cpu.max", fstest.MapFS{
			"proc/self/cgroup":      {Data: []byte("0::/\n")},
			"proc/self/mountinfo":   {Data: []byte(procRoot + "\n" + v2Root + "\n")},
			"sys/fs/cgroup/cpu.max": {Data: []byte("50000 100000\n")},
		}, 0.5},
		{"v2, the smallest quota on the way up (a pod's limit above its container's)", fstest.MapFS{
			"proc/self/cgroup":                        {Data: []byte("0::/kubepods/pod1/ctr\n")},
			"proc/self/mountinfo":                     {Data: []byte(v2Root + "\n")},
			"sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": {Data: []byte("200000 100000\n")},
			"sys/fs/cgroup/kubepods/pod1/cpu.max":     {Data: []byte("150000 100000\n")},
			"sys/fs/cgroup/kubepods/cpu.max":          {Data: []byte("max 100000\n")},
		}, 1.5},
		{"v2 with no quota anywhere", fstest.MapFS{
			"proc/self/cgroup":        {Data: []byte("0::/a\n")},
			"proc/self/mountinfo":     {Data: []byte(v2Root + "\n")},
			"sys/fs/cgroup/a/cpu.max": {Data: []byte("max 100000\n")},
		}, 0},
		{"hybrid: v1's cpu hierarchy, not the controller-less v2 one", fstest.MapFS{
			"proc/self/cgroup": {Data: []byte("5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n")},
			"proc/self/mountinfo": {Data: []byte(mountLine(3, "/", "/sys/fs/cgroup/unified", "cgroup2", "rw") + "\n" +
				mountLine(4, "/", "/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct") + "\n")},
			"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us":  {Data: []byte("25000\n")},
			"sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": {Data: []byte("100000\n")},
			"sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us":      {Data: []byte("-1\n")},
			"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us":             {Data: []byte("-1\n")},
			"sys/fs/cgroup/unified/docker/abc/cpu.max":               {Data: []byte("10000 100000\n")}, // not the CPU controller's
		}, 0.25},
		{"v1 mounted from the container's own cgroup (mountinfo's root)", fstest.MapFS{
			"proc/self/cgroup":                    {Data: []byte("3:cpu:/docker/abc\n")},
			"proc/self/mountinfo":                 {Data: []byte(mountLine(4, "/docker/abc", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu") + "\n")},
			"sys/fs/cgroup/cpu/cpu.cfs_quota_us":  {Data: []byte("300000\n")},
			"sys/fs/cgroup/cpu/cpu.cfs_period_us": {Data: []byte("100000\n")},
		}, 3},
		{"a mount point with a space", fstest.MapFS{
			"proc/self/cgroup":    {Data: []byte("0::/x\n")},
			"proc/self/mountinfo": {Data: []byte(mountLine(2, "/", `/cg\040root`, "cgroup2", "rw") + "\n")},
			"cg root/x/cpu.max":   {Data: []byte("75000 100000\n")},
		}, 0.75},
		{"no cgroup at all (not Linux)", fstest.MapFS{}, 0},
		{"a cgroup the mounts do not show", fstest.MapFS{
			"proc/self/cgroup":    {Data: []byte("0::/elsewhere\n")},
			"proc/self/mountinfo": {Data: []byte(mountLine(2, "/mine", "/sys/fs/cgroup", "cgroup2", "rw") + "\n")},
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CgroupCPULimit(tc.files)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("limit %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCgroupCPULimitNamesAFileItCannotRead(t *testing.T) {
	v2Root := mountLine(2, "/", "/sys/fs/cgroup", "cgroup2", "rw")
	for _, tc := range []struct{ data, want string }{
		{"half\n", "sys/fs/cgroup/a/cpu.max"},
		{"50000 0\n", "sys/fs/cgroup/a/cpu.max"},
		{"-5 100000\n", "sys/fs/cgroup/a/cpu.max"},
	} {
		_, err := CgroupCPULimit(fstest.MapFS{
			"proc/self/cgroup":        {Data: []byte("0::/a\n")},
			"proc/self/mountinfo":     {Data: []byte(v2Root + "\n")},
			"sys/fs/cgroup/a/cpu.max": {Data: []byte(tc.data)},
		})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("cpu.max %q: error %v, want one naming %s", tc.data, err, tc.want)
		}
	}
	_, err := CgroupCPULimit(fstest.MapFS{
		"proc/self/cgroup":                      {Data: []byte("1:cpu:/a\n")},
		"proc/self/mountinfo":                   {Data: []byte(mountLine(4, "/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu") + "\n")},
		"sys/fs/cgroup/cpu/a/cpu.cfs_quota_us":  {Data: []byte("lots\n")},
		"sys/fs/cgroup/cpu/a/cpu.cfs_period_us": {Data: []byte("100000\n")},
	})
	if err == nil || !strings.Contains(err.Error(), "sys/fs/cgroup/cpu/a/cpu.cfs_quota_us") {
		t.Fatalf("v1 quota \"lots\": error %v, want one naming the file", err)
	}
}

func TestLoopsWithinACPULimit(t *testing.T) {
	for _, tc := range []struct {
		n     int
		limit float64
		want  int
	}{
		{2, 0, 2},    // no limit
		{2, 0.5, 1},  // half a CPU: one loop
		{2, 1, 1},    // exactly one
		{2, 1.01, 2}, // rounded up, as Go's GOMAXPROCS is
		{8, 2.5, 3},
		{1, 3, 1}, // never more than the CPUs
		{4, 0.01, 1},
	} {
		if got := LoopsWithin(tc.n, tc.limit); got != tc.want {
			t.Errorf("LoopsWithin(%d, %v) = %d, want %d", tc.n, tc.limit, got, tc.want)
		}
	}
}
