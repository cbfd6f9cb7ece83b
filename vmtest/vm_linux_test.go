package vmtest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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
// guestRun passes SLUICE_VM_RUN (a -test.run pattern) to the guest, to
// run some of its tests while working on them; CI runs them all.
func guestRun() string {
	r := os.Getenv("SLUICE_VM_RUN")
	if r == "" {
		return ""
	}
	return " -test.run='" + strings.ReplaceAll(r, "'", "") + "'"
}

func TestVMSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("the VM suite takes a minute or two")
	}
	if os.Geteuid() != 0 {
		require(t, errors.New("needs root (apt-get and kernel unpacking)"))
	}
	root, _ := filepath.Abs("..")
	work := t.TempDir()
	static := []string{"CGO_ENABLED=0"}
	// As the image builds it (its compiled dependencies are reused).
	run(t, root, static, "go", "build", "-trimpath", "-o", filepath.Join(work, "sluice"), "./cmd/sluice")
	run(t, root, static, "go", "test", "-c", "-trimpath", "-tags", "vmguest", "-o", filepath.Join(work, "guest.test"), "./vmtest/guest")
	img, err := Build(Spec{Root: root, Work: work,
		Files: map[string]string{"sluice": filepath.Join(work, "sluice"), "guest.test": filepath.Join(work, "guest.test")},
		// The parity test's guest half runs in its own image (cmd/sluice).
		Script: "SLUICE_BIN=/sluice /guest.test -test.v -test.timeout=8m -test.skip='^TestIPVSParityDumps$'" + guestRun()})
	require(t, err)
	start := time.Now()
	log, err := Boot(img, work, 1024, 10*time.Minute)
	t.Logf("qemu ran %s", time.Since(start).Round(time.Second))
	for _, l := range strings.Split(log, "\n") {
		t.Log("guest| " + strings.TrimRight(l, "\r"))
	}
	if err != nil {
		t.Fatal(err)
	}
	if code := ExitCode(log); code != 0 {
		t.Fatalf("guest tests failed (marker code %d)", code)
	}
}
