package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// The end-to-end tests run in a private network namespace of their own: the
// test binary re-executes itself with CLONE_NEWNET, so the pod-like
// addresses the API server insists on (it refuses loopback endpoints) are
// added to that namespace's lo and nowhere else. The namespace has no
// interface but lo, hence no route out of the machine, and the kernel
// deletes it when the last process in it exits, even after a crash.

const netnsEnv = "SLUICE_TEST_PRIVATE_NETNS"

// inPrivateNetns reports whether this process is the re-executed child.
func inPrivateNetns() bool { return os.Getenv(netnsEnv) == "1" }

// reexecInPrivateNetns runs this test binary again in a new network
// namespace and returns its exit code; ok is false when that cannot be done
// (not root), and the tests then run here without the namespace.
func reexecInPrivateNetns() (code int, ok bool) {
	if inPrivateNetns() || os.Geteuid() != 0 {
		return 0, false
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		if ee, isExit := err.(*exec.ExitError); isExit {
			return ee.ExitCode(), true
		}
		fmt.Fprintf(os.Stderr, "re-exec in a private network namespace: %v\n", err)
		return 1, true
	}
	return 0, true
}

// setUpPrivateNetns brings lo up in the fresh namespace.
func setUpPrivateNetns() error {
	if !inPrivateNetns() {
		return nil
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %v: %s", err, out)
	}
	return nil
}

// addLocalAddr puts addr on lo of the private namespace.
func addLocalAddr(addr string) error {
	if !inPrivateNetns() {
		return fmt.Errorf("refusing to add %s outside a private network namespace (the tests need root to make one)", addr)
	}
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("ip addr add %s/32 dev lo: %v: %s", addr, err, out)
	}
	return nil
}
