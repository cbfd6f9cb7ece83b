package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sluice-proxy/sluice/controlplane/kube/kubetest"
)

// The container image (make image, scripts/build-image.sh) run with
// Debian's podman: its tools are there, sluice answers at its own path and
// at kube-proxy's, and in manifests mode, as a non-root user, it serves
// real traffic. The container joins this test's private network namespace
// (podman --network ns:), so its NodePort and the test's backends meet on
// loopback and nothing touches the machine's own network.

// podmanArgs are what podman needs on this kind of host: runc (crun
// refuses hybrid cgroups), and resource limits no higher than the
// container the tests may run in allows (podman asks for more as root).
func podmanArgs(t *testing.T) []string {
	var hard syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &hard); err != nil {
		t.Fatal(err)
	}
	return []string{"--runtime", "runc", "run", "--rm",
		fmt.Sprintf("--ulimit=nofile=%d:%d", hard.Max, hard.Max), "--ulimit=nproc=4096:4096"}
}

func TestImage(t *testing.T) {
	if !inPrivateNetns() {
		kubetest.Require(t, errors.New("the image test needs a private network namespace, which needs root"))
	}
	archive := os.Getenv("SLUICE_IMAGE")
	if archive == "" {
		archive = "../../bin/sluice-image.tar"
	}
	if _, err := os.Stat(archive); err != nil {
		kubetest.Require(t, fmt.Errorf("no image archive (make image builds bin/sluice-image.tar): %w", err))
	}
	for _, bin := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			kubetest.Require(t, fmt.Errorf("the image test runs Debian's %s: %w", bin, err))
		}
	}
	// podman's default sysctls are refused in a namespace it did not make.
	conf := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_sysctls = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	podman := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := exec.Command("podman", args...)
		cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("podman %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String(), err
	}
	loaded, err := podman("load", "-i", archive)
	if err != nil {
		t.Fatal(err)
	}
	const image = "localhost/sluice:latest"
	if !strings.Contains(loaded, image) {
		t.Fatalf("the archive did not load as %s:\n%s", image, loaded)
	}
	run := func(args ...string) (string, error) {
		return podman(append(podmanArgs(t), args...)...)
	}

	t.Run("version at both paths", func(t *testing.T) {
		own, err := run("--network=none", image, "--version")
		if err != nil || !strings.Contains(own, "sluice") {
			t.Fatalf("sluice --version: %q, %v", own, err)
		}
		kp, err := run("--network=none", "--entrypoint=/usr/local/bin/kube-proxy", image, "--version")
		if err != nil || kp != own {
			t.Fatalf("kube-proxy --version: %q, %v; want sluice's %q", kp, err, own)
		}
	})

	t.Run("the kernel modes' tools", func(t *testing.T) {
		out, err := run("--network=none", "--entrypoint=/bin/sh", image, "-c",
			"iptables-nft --version && iptables-legacy --version && ip6tables-nft-restore --version && "+
				"ipset --help && nft --version && conntrack --version && modprobe --version")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"nf_tables", "legacy", "ipset v", "nftables", "conntrack", "kmod"} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in the tools' versions:\n%s", want, out)
			}
		}
	})

	t.Run("manifests mode as a non-root user", func(t *testing.T) {
		bport, uport := freePort(t, "tcp"), freePort(t, "udp")
		httpBackend(t, fmt.Sprintf("127.0.0.1:%d", bport), "from-image")
		udpBackend(t, fmt.Sprintf("127.0.0.1:%d", uport), "from-image")
		np, unp, hz := freePort(t, "tcp"), freePort(t, "udp"), freePort(t, "tcp")
		dir := t.TempDir()
		os.Chmod(dir, 0o755)
		writeFile(t, filepath.Join(dir, "svc.yaml"), manifest(np, unp, bport, uport, "127.0.0.1"))
		name := fmt.Sprintf("sluice-image-test-%d", os.Getpid())
		args := append(podmanArgs(t), "--detach", "--name="+name, "--user=65532:65532",
			fmt.Sprintf("--network=ns:/proc/%d/ns/net", os.Getpid()), "--volume="+dir+":/etc/sluice:ro",
			image, "--manifests=/etc/sluice", "--bind-address=127.0.0.1",
			fmt.Sprintf("--healthz-bind-address=127.0.0.1:%d", hz), "--metrics-bind-address=127.0.0.1:0",
			"--handover-socket=/tmp/handover.sock")
		if _, err := podman(args...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				logs, _ := podman("logs", name)
				t.Logf("sluice in the container:\n%s", logs)
			}
			podman("rm", "--force", "--time=0", name)
		})
		url := fmt.Sprintf("http://127.0.0.1:%d/", np)
		(&kubeEnv{t: t}).eventually("NodePort through the container", func() (bool, string) {
			body, err := getURL(url)
			return err == nil && body == "from-image", fmt.Sprint(body, err)
		})
		if name, err := hitUDP(unp); err != nil || name != "from-image" {
			t.Errorf("UDP NodePort through the container: %q, %v", name, err)
		}
		// Healthy once the first state is applied. The listeners serve a
		// moment before the health tracker hears of that apply (the
		// apply opens them, then records itself), so /healthz is polled:
		// CI once read 503 in that gap under load.
		(&kubeEnv{t: t}).eventually("/healthz 200 in the container", func() (bool, string) {
			code, body := status(t, fmt.Sprintf("http://127.0.0.1:%d/healthz", hz))
			return code == 200, fmt.Sprint(code, " ", body)
		})
		user, err := podman("exec", name, "cat", "/proc/1/status")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(user, "Uid:\t65532\t65532\t65532\t65532") {
			t.Errorf("sluice does not run as 65532 in the container:\n%s", user)
		}
	})
}
