//go:build linux

package harness

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestUserSamplesCountUserTime checks SLUICE_BENCH_USER_TIME's measure
// against the kernel's own account: a shell spinning in user mode, sampled
// while it works, must come out at the user time /proc gives it (10 ms
// ticks), within a quarter. A period that does not match the samples'
// would be off by its factor.
func TestUserSamplesCountUserTime(t *testing.T) {
	if n := countSamples("     100000\n     100000\n\n     100000\n"); n != 3 {
		t.Fatalf("countSamples: %v, want 3", n)
	}
	child := exec.Command("sh", "-c", `read go; i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo done; read end`)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		child.Wait()
	}()
	data := filepath.Join(t.TempDir(), "user.data")
	rec, err := startUserSamples([]int{child.Process.Pid}, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.command("enable"); err != nil {
		rec.end()
		t.Fatal(err)
	}
	before := userTicks(t, child.Process.Pid)
	fmt.Fprintln(stdin, "go")
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "done\n" {
		rec.end()
		t.Fatalf("the spinning shell said %q, %v", line, err)
	}
	err = rec.command("disable")
	after := userTicks(t, child.Process.Pid)
	rec.end()
	if err != nil {
		t.Fatal(err)
	}
	got, err := userMicros(data)
	if err != nil {
		t.Fatal(err)
	}
	want := float64(after-before) * 10e3 // USER_HZ is 100
	t.Logf("sampled user time %.0f us; /proc's %.0f us", got, want)
	if want < 100e3 {
		t.Fatalf("the shell spun for only %.0f us of user time: too little to compare", want)
	}
	if d := got - want; d > want/4+20e3 || d < -(want/4+20e3) {
		t.Fatalf("sampled user time %.0f us, /proc's %.0f us: more than a quarter apart", got, want)
	}
}

// userTicks is pid's user time so far, in clock ticks (/proc/PID/stat's
// 14th field).
func userTicks(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // the name may hold spaces
	n, err := strconv.Atoi(fields[11])                            // utime: field 14, the 12th after the name
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A perf that fails to start its session answers no command; the error
// must give perf's own reason, not only the missing answer. Recording into
// a directory not yet made is not such a failure: startPerfRecord makes it
// (SLUICE_BENCH_PERF_RECORD named one that did not exist, and every run
// failed with "perf enable: no ack").
func TestPerfFailuresSayWhy(t *testing.T) {
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sleeper.Process.Kill()
		sleeper.Wait()
	}()
	pids := []int{sleeper.Process.Pid}
	dir := t.TempDir()

	bad, err := startUserSamples(pids, filepath.Join(dir, "missing", "user.data"))
	if err != nil {
		t.Fatal(err)
	}
	err = bad.command("enable")
	bad.end()
	if err == nil || !strings.Contains(err.Error(), "perf said:") || !strings.Contains(err.Error(), "No such file or directory") {
		t.Fatalf("perf writing into a missing directory: %v; want perf's own reason", err)
	}

	out := filepath.Join(dir, "made", "by", "record.data")
	rec, err := startPerfRecord(pids, out)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"enable", "disable"} {
		if err := rec.command(c); err != nil {
			rec.end()
			t.Fatal(err)
		}
	}
	rec.end()
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("the record in a directory it made: %v, %v", st, err)
	}
}
