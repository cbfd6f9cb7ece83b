package vmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// guestModules are the modules the guest loads, with their dependencies
// resolved by modprobe against the unpacked kernel.
var guestModules = []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sed", "ip_vs_nq",
	"ip_vs_dh", "ip_vs_mh", "sctp", "dummy", "veth", "nf_conntrack_netlink",
	// iptables (legacy) and ipset, for IPVS mode's masquerade rules.
	"ip_tables", "ip6_tables", "iptable_nat", "iptable_filter", "iptable_mangle", "ip6table_nat", "ip6table_filter", "ip6table_mangle",
	"xt_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet", "ip_set_bitmap_port",
	"xt_MASQUERADE", "xt_mark", "xt_comment", "xt_addrtype", "xt_conntrack", "ipt_REJECT", "ip6t_REJECT", "xt_sctp", "xt_tcpudp", "xt_nat",
	"xt_statistic", "xt_recent", "xt_REDIRECT"}

// guestTools are host binaries copied into the image with their shared
// libraries and the loader (the image has no package manager).
var guestTools = []string{"/usr/sbin/xtables-legacy-multi", "/usr/sbin/ipset"}

const marker = "SLUICE-VM-RESULT"

func require(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("VM suite cannot run (CI=true: not skipping): %v", err)
	}
	t.Skipf("VM suite cannot run: %v", err)
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestVMSuite builds the image and runs the guest tests under qemu.
func TestVMSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("the VM suite takes a minute or two")
	}
	if os.Geteuid() != 0 {
		require(t, errors.New("needs root (apt-get and kernel unpacking)"))
	}
	root, _ := filepath.Abs("..")
	out, err := exec.Command(filepath.Join(root, "scripts/build-vm-kernel.sh")).Output()
	require(t, err)
	m := regexp.MustCompile(`KDIR=(\S+) KVER=(\S+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("build-vm-kernel.sh printed %q", out)
	}
	kdir, kver := m[1], m[2]

	work := t.TempDir()
	img := filepath.Join(work, "root")
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "run", "lib/modules"} {
		os.MkdirAll(filepath.Join(img, d), 0o755)
	}
	static := []string{"CGO_ENABLED=0"}
	run(t, root, static, "go", "build", "-o", filepath.Join(img, "sluice"), "./cmd/sluice")
	run(t, root, static, "go", "test", "-c", "-tags", "vmguest", "-o", filepath.Join(img, "guest.test"), "./vmtest/guest")
	// busybox with one link per applet (never one named busybox: ELOOP).
	run(t, img, nil, "cp", "/bin/busybox", "bin/busybox")
	for _, applet := range strings.Fields(run(t, img, nil, "/bin/busybox", "--list")) {
		if applet != "busybox" {
			os.Symlink("busybox", filepath.Join(img, "bin", applet))
		}
	}
	run(t, img, nil, "mknod", "-m", "600", "dev/console", "c", "5", "1")
	// iptables-legacy and ipset, with their libraries and the xtables
	// extensions; legacy only (nft would need nf_tables too).
	exts, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	for _, tool := range append(slices.Clone(guestTools), exts...) {
		run(t, img, nil, "cp", "-L", "--parents", tool, ".")
		for _, l := range strings.Split(run(t, img, nil, "ldd", tool), "\n") {
			f := strings.Fields(l)
			for _, w := range f {
				if strings.HasPrefix(w, "/") {
					run(t, img, nil, "cp", "-L", "--parents", w, ".")
				}
			}
		}
	}
	run(t, img, nil, "sh", "-c", "cp -L --parents /etc/protocols /etc/services /usr/lib/x86_64-linux-gnu/xtables/*.so . && for n in iptables-legacy iptables-legacy-restore iptables-legacy-save ip6tables-legacy ip6tables-legacy-restore ip6tables-legacy-save; do ln -s xtables-legacy-multi usr/sbin/$n; done && ln -s /usr/sbin/ipset bin/ipset && mkdir -p run/xtables")
	// Modules in load order.
	var insmods []string
	seen := map[string]bool{}
	var deps string
	for _, mod := range guestModules { // one per call: further names would be module parameters
		deps += run(t, root, nil, "modprobe", "-d", kdir, "-S", kver, "--show-depends", mod)
	}
	for _, l := range strings.Split(deps, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "insmod" || seen[f[1]] {
			continue
		}
		seen[f[1]] = true
		name := filepath.Base(f[1])
		run(t, root, nil, "cp", f[1], filepath.Join(img, "lib/modules", name))
		insmods = append(insmods, "insmod /lib/modules/"+name)
	}
	init := `#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
ip link set lo up
` + strings.Join(insmods, " || echo insmod failed\n") + ` || echo insmod failed
echo "guest: kernel $(uname -r), modules loaded: $(cut -d' ' -f1 /proc/modules | tr '\n' ' ')"
export PATH=/bin:/usr/sbin
SLUICE_BIN=/sluice /guest.test -test.v -test.timeout=120s
echo "` + marker + ` $?"
poweroff -f
`
	if err := os.WriteFile(filepath.Join(img, "init"), []byte(init), 0o755); err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(work, "initrd.gz")
	run(t, img, nil, "sh", "-c", "find . | cpio -o -H newc 2>/dev/null | gzip -1 > "+initrd)

	serial := filepath.Join(work, "serial.log")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "1024", "-smp", "2",
		"-kernel", filepath.Join(kdir, "boot", "vmlinuz-"+kver), "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1", "-nographic", "-no-reboot", "-nic", "none",
		"-serial", "file:"+serial, "-monitor", "none")
	start := time.Now()
	qout, qerr := qemu.CombinedOutput()
	log, _ := os.ReadFile(serial)
	t.Logf("qemu ran %s", time.Since(start).Round(time.Second))
	code := -1
	sc := bufio.NewScanner(strings.NewReader(string(log)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), "\r")
		if strings.HasPrefix(l, marker+" ") {
			fmt.Sscanf(strings.TrimPrefix(l, marker+" "), "%d", &code)
		}
		t.Log("guest| " + l)
	}
	if ctx.Err() != nil {
		t.Fatalf("the VM did not finish within 10 minutes")
	}
	if code != 0 {
		t.Fatalf("guest tests failed (marker code %d; qemu: %v %s)", code, qerr, qout)
	}
}
