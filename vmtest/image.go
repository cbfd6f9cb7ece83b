//go:build linux

package vmtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// guestModules are the modules the guest loads, with their dependencies
// resolved by modprobe against the unpacked kernel.
var guestModules = []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sed", "ip_vs_nq",
	"ip_vs_dh", "ip_vs_mh", "sctp", "dummy", "veth", "nf_conntrack_netlink",
	// The NIC of a guest booted with a Forward (BootWith).
	"virtio_pci", "virtio_net",
	// iptables (legacy) and ipset, for IPVS mode's masquerade rules.
	"ip_tables", "ip6_tables", "iptable_nat", "iptable_filter", "iptable_mangle", "ip6table_nat", "ip6table_filter", "ip6table_mangle",
	"xt_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet", "ip_set_bitmap_port",
	"xt_MASQUERADE", "xt_mark", "xt_comment", "xt_addrtype", "xt_conntrack", "ipt_REJECT", "ip6t_REJECT", "xt_sctp", "xt_tcpudp", "xt_nat",
	"xt_statistic", "xt_recent", "xt_REDIRECT", "xt_physdev", "xt_ipvs",
	// nf_tables and the expressions nftables mode's ruleset uses.
	"nf_tables", "nft_ct", "nft_nat", "nft_chain_nat", "nft_masq", "nft_numgen", "nft_reject", "nft_reject_inet",
	"nft_reject_ipv4", "nft_reject_ipv6", "nft_fib", "nft_fib_ipv4", "nft_fib_ipv6", "nft_fib_inet", "nft_limit"}

// guestTools are host binaries copied into every image with their shared
// libraries and the loader (the image has no package manager).
var guestTools = []string{"/usr/sbin/xtables-legacy-multi", "/usr/sbin/ipset", "/usr/sbin/nft"}

// Marker starts the line on which the guest reports its exit code.
const Marker = "SLUICE-VM-RESULT"

// Image is a bootable guest: the cached Debian kernel and an initramfs.
type Image struct {
	Kernel, Initrd string
}

// Spec says what goes into an image beyond the common base (busybox,
// iptables-legacy, ipset, the modules).
type Spec struct {
	// Root is the repository root (scripts/build-vm-kernel.sh).
	Root string
	// Work is a scratch directory for the image tree and the initramfs.
	Work string
	// Files are copied in: image path -> host path.
	Files map[string]string
	// Tools are more host binaries, copied with their libraries.
	Tools []string
	// Script runs after the base set-up (mounts, modules, PATH); its
	// exit code is reported on the Marker line, then the guest powers off.
	Script string
}

// Build fetches the kernel once (scripts/build-vm-kernel.sh caches it in
// ~/.cache/sluice/vm) and packs the initramfs.
func Build(s Spec) (Image, error) {
	out, err := exec.Command(filepath.Join(s.Root, "scripts/build-vm-kernel.sh")).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return Image{}, fmt.Errorf("build-vm-kernel.sh: %v: %s", err, ee.Stderr)
		}
		return Image{}, fmt.Errorf("build-vm-kernel.sh: %w", err)
	}
	m := regexp.MustCompile(`KDIR=(\S+) KVER=(\S+)`).FindStringSubmatch(string(out))
	if m == nil {
		return Image{}, fmt.Errorf("build-vm-kernel.sh printed %q", out)
	}
	kdir, kver := m[1], m[2]
	img := filepath.Join(s.Work, "root")
	// The modules go under /lib/modules/KVER, with a modules.dep naming
	// each, so that modprobe finds one already loaded (kube-proxy's IPVS
	// clean-up runs `modprobe -va ip_vs` first, and does nothing when it
	// fails).
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "run", "lib/modules/" + kver} {
		if err := os.MkdirAll(filepath.Join(img, d), 0o755); err != nil {
			return Image{}, err
		}
	}
	run := func(dir, name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	for dst, src := range s.Files {
		if _, err := run(img, "cp", "-L", src, filepath.Join(img, dst)); err != nil {
			return Image{}, err
		}
	}
	// busybox with one link per applet (never one named busybox: ELOOP).
	if _, err := run(img, "cp", "/bin/busybox", "bin/busybox"); err != nil {
		return Image{}, err
	}
	applets, err := run(img, "/bin/busybox", "--list")
	if err != nil {
		return Image{}, err
	}
	for _, applet := range strings.Fields(applets) {
		if applet != "busybox" {
			os.Symlink("busybox", filepath.Join(img, "bin", applet))
		}
	}
	if _, err := run(img, "mknod", "-m", "600", "dev/console", "c", "5", "1"); err != nil {
		return Image{}, err
	}
	// iptables-legacy and ipset, with their libraries and the xtables
	// extensions; legacy only (nft would need nf_tables too). More tools
	// the same way; a tool copied to its host path shadows the busybox
	// applet of the same name only where PATH puts it first.
	exts, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	for _, tool := range append(append(slices.Clone(guestTools), s.Tools...), exts...) {
		if _, err := run(img, "cp", "-L", "--parents", tool, "."); err != nil {
			return Image{}, err
		}
		libs, err := run(img, "ldd", tool)
		if err != nil {
			return Image{}, err
		}
		for _, l := range strings.Split(libs, "\n") {
			for _, w := range strings.Fields(l) {
				if strings.HasPrefix(w, "/") {
					if _, err := run(img, "cp", "-L", "--parents", w, "."); err != nil {
						return Image{}, err
					}
				}
			}
		}
	}
	if _, err := run(img, "sh", "-c", "cp -L --parents /etc/protocols /etc/services /usr/lib/x86_64-linux-gnu/xtables/*.so . && for n in iptables-legacy iptables-legacy-restore iptables-legacy-save ip6tables-legacy ip6tables-legacy-restore ip6tables-legacy-save; do ln -s xtables-legacy-multi usr/sbin/$n; done && ln -s /usr/sbin/ipset bin/ipset && mkdir -p run/xtables"); err != nil {
		return Image{}, err
	}
	// Modules in load order.
	var insmods, dep []string
	seen := map[string]bool{}
	var deps string
	for _, mod := range guestModules { // one per call: further names would be module parameters
		d, err := run(s.Root, "modprobe", "-d", kdir, "-S", kver, "--show-depends", mod)
		if err != nil {
			return Image{}, err
		}
		deps += d
	}
	for _, l := range strings.Split(deps, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "insmod" || seen[f[1]] {
			continue
		}
		seen[f[1]] = true
		name := filepath.Base(f[1])
		if _, err := run(s.Root, "cp", f[1], filepath.Join(img, "lib/modules", kver, name)); err != nil {
			return Image{}, err
		}
		insmods = append(insmods, "insmod /lib/modules/"+kver+"/"+name)
		dep = append(dep, name+":")
	}
	if err := os.WriteFile(filepath.Join(img, "lib/modules", kver, "modules.dep"), []byte(strings.Join(dep, "\n")+"\n"), 0o644); err != nil {
		return Image{}, err
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
export PATH=/usr/sbin:/usr/bin:/bin
guest_script() {
` + s.Script + `
}
guest_script
echo "` + Marker + ` $?"
poweroff -f
`
	if err := os.WriteFile(filepath.Join(img, "init"), []byte(init), 0o755); err != nil {
		return Image{}, err
	}
	initrd := filepath.Join(s.Work, "initrd.gz")
	if _, err := run(img, "sh", "-c", "find . | cpio -o -H newc 2>/dev/null | gzip -1 > "+initrd); err != nil {
		return Image{}, err
	}
	return Image{Kernel: filepath.Join(kdir, "boot", "vmlinuz-"+kver), Initrd: initrd}, nil
}

// Boot runs the image under qemu (TCG, 2 vCPUs, no NIC) until the guest
// powers off or timeout passes, and returns the serial console's output.
func Boot(img Image, work string, memMB int, timeout time.Duration) (string, error) {
	return BootWith(img, work, memMB, timeout, nil)
}

// Forward lets the guest open TCP connections to one address, which reach
// one TCP address of the host's (each connection through a busybox nc
// that qemu starts for it). The guest's NIC (eth0, virtio) is on qemu's
// user network, 10.0.2.0/24, restricted: it reaches nothing else, on the
// host or beyond. The guest sets its own address (10.0.2.15/24).
type Forward struct {
	Guest string // 10.0.2.x:port, in the guest's view
	Host  string // host:port it reaches on the host (its loopback)
}

// BootWith is Boot with the guest's NIC forwarding fwd (nil: no NIC).
func BootWith(img Image, work string, memMB int, timeout time.Duration, fwd *Forward) (string, error) {
	serial := filepath.Join(work, "serial.log")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	nic := []string{"-nic", "none"}
	if fwd != nil {
		host, port, ok := strings.Cut(fwd.Host, ":")
		if !ok || strings.ContainsAny(fwd.Host+fwd.Guest, ", ") {
			return "", fmt.Errorf("forward %+v: want host:port and 10.0.2.x:port", *fwd)
		}
		nic = []string{"-netdev", "user,id=n0,restrict=on,guestfwd=tcp:" + fwd.Guest + "-cmd:/bin/busybox nc " + host + " " + port,
			"-device", "virtio-net-pci,netdev=n0"}
	}
	args := append([]string{"-accel", "tcg,thread=multi", "-cpu", "max", "-m", fmt.Sprint(memMB), "-smp", "2",
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		"-append", "console=ttyS0 quiet panic=-1", "-nographic", "-no-reboot"}, nic...)
	qemu := exec.CommandContext(ctx, "qemu-system-x86_64", append(args, "-serial", "file:"+serial, "-monitor", "none")...)
	qout, qerr := qemu.CombinedOutput()
	log, _ := os.ReadFile(serial)
	if ctx.Err() != nil {
		return string(log), fmt.Errorf("the VM did not finish within %s", timeout)
	}
	if qerr != nil {
		return string(log), fmt.Errorf("qemu: %v: %s", qerr, qout)
	}
	return string(log), nil
}

// ExitCode finds the guest script's exit code on the Marker line (-1 if
// the line is missing).
func ExitCode(log string) int {
	code := -1
	for _, l := range strings.Split(log, "\n") {
		l = strings.TrimRight(l, "\r")
		if strings.HasPrefix(l, Marker+" ") {
			fmt.Sscanf(strings.TrimPrefix(l, Marker+" "), "%d", &code)
		}
	}
	return code
}
