//go:build linux

// Package netnstest owns running a test's kernel-facing code in a private
// network namespace of its own: the kernel modes' tests program real
// iptables, nftables and addresses there, never in the machine's root
// namespace. Under CI=true what such a test needs (root, a binary) is
// required: a skip would hide a test that never ran.
package netnstest

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Run runs fn on a locked thread moved into a fresh network namespace;
// the processes fn starts inherit it. The thread is never unlocked, so Go
// retires it when the goroutine ends: nothing else ever runs in that
// namespace, which goes with the thread, and the root namespace is never
// touched. An error from fn fails the test. /proc/net is the process's
// namespace, not the thread's: fn reads /proc/thread-self/net instead.
func Run(t testing.TB, fn func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "root, for a private network namespace")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// Need skips the test, or fails it under CI=true, unless every command
// named is on PATH.
func Need(t testing.TB, commands ...string) {
	t.Helper()
	for _, c := range commands {
		if _, err := exec.LookPath(c); err != nil {
			Unavailable(t, c)
		}
	}
}

// Unavailable skips the test for want, or fails it under CI=true.
func Unavailable(t testing.TB, want string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("needs %s (CI=true: not skipping)", want)
	}
	t.Skipf("needs %s", want)
}
