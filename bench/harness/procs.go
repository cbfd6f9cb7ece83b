//go:build linux

// Package harness is sluice's benchmark harness: it starts backends, sluice
// in each engine, a naive Go proxy and the peers (HAProxy, nginx), runs the
// workloads against all of them in interleaved rounds, and writes the
// results. Nothing outside bench/ imports it.
package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is one process the harness started; it is stopped by PID.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan error
	argv []string // as given, for again
	at   Place
}

// Place is where a process runs: pinned to CPU (-1: any), and in the
// cgroup whose cgroup.procs file Cgroup names ("": the harness's).
type Place struct {
	CPU    int
	Cgroup string
}

// Anywhere is no pinning, in the harness's own cgroup.
func Anywhere() Place { return Place{CPU: -1} }

// StartProc starts argv at its place: pinned via taskset, and moved into
// its cgroup by a shell that then becomes argv, so that no thread of the
// program runs outside it (it reads its CPU limit as it starts).
func StartProc(name string, at Place, argv ...string) (*Proc, error) {
	given := argv
	if at.CPU >= 0 {
		if _, err := exec.LookPath("taskset"); err == nil {
			argv = append([]string{"taskset", "-c", strconv.Itoa(at.CPU)}, argv...)
		}
	}
	if at.Cgroup != "" {
		argv = append([]string{"sh", "-c", `echo $$ > "$0" && exec "$@"`, at.Cgroup}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, out: out, done: make(chan error, 1), argv: given, at: at}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// again starts the same command line once more (a restart beside the
// running process).
func (p *Proc) again() (*Proc, error) { return StartProc(p.Name, p.at, p.argv...) }

// PID is the process's PID (the shell and taskset exec the real program
// in place).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Output is what the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Exited reports whether the process has ended, and its error.
func (p *Proc) Exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}

// WaitFor polls ready until it reports true, and gives up (false) when the
// process exits or timeout passes: the harness waits on processes it does
// not control, which tell it nothing when they are ready.
func (p *Proc) WaitFor(timeout time.Duration, ready func() bool) bool {
	for deadline := time.Now().Add(timeout); !ready(); time.Sleep(10 * time.Millisecond) {
		if exited, _ := p.Exited(); exited || time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// Pause stops the process group (SIGSTOP) until Resume.
func (p *Proc) Pause() { syscall.Kill(-p.PID(), syscall.SIGSTOP) }

// Resume continues a paused process group.
func (p *Proc) Resume() { syscall.Kill(-p.PID(), syscall.SIGCONT) }

// Stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if ok, _ := p.Exited(); ok {
		return
	}
	syscall.Kill(-p.PID(), syscall.SIGCONT) // a paused one would not see the TERM
	syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
}

// Usage is a process's CPU time and memory, from /proc.
type Usage struct {
	CPUSeconds float64
	RSSBytes   int64
	PeakRSS    int64
}

// ReadUsage reads /proc/<pid>/stat and /proc/<pid>/status, summed over the
// process and its children in the same group are not included (HAProxy and
// nginx workers are accounted by their own PIDs; see GroupUsage).
func ReadUsage(pid int) (Usage, error) {
	var u Usage
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// Fields after the ")" of comm: state is field 3; utime 14, stime 15.
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) > 13 {
		ut, _ := strconv.ParseFloat(fields[11], 64)
		st, _ := strconv.ParseFloat(fields[12], 64)
		u.CPUSeconds = (ut + st) / 100 // USER_HZ is 100 on Linux
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			u.RSSBytes = kb << 10
		case "VmHWM:":
			u.PeakRSS = kb << 10
		}
	}
	return u, nil
}

// groupMembers lists the processes in process group pgid.
func groupMembers(pgid int) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(fields) < 3 {
			continue
		}
		if g, _ := strconv.Atoi(fields[2]); g == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// GroupUsage sums ReadUsage over every process in pid's process group, so
// multi-process peers (nginx master + workers) are measured whole.
func GroupUsage(pgid int) Usage {
	var total Usage
	for _, pid := range groupMembers(pgid) {
		if u, err := ReadUsage(pid); err == nil {
			total.CPUSeconds += u.CPUSeconds
			total.RSSBytes += u.RSSBytes
			total.PeakRSS += u.PeakRSS
		}
	}
	return total
}

// GroupSockets counts the sockets open in process group pgid (the entries
// of /proc/<pid>/fd of each member that are sockets: pipes, such as the
// splice pipes Go pools after a socket-to-socket copy, are not counted).
func GroupSockets(pgid int) int {
	n := 0
	for _, pid := range groupMembers(pgid) {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, _ := os.ReadDir(dir)
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasPrefix(target, "socket:") {
				n++
			}
		}
	}
	return n
}

// HostBusySeconds is the machine's busy CPU time so far, summed over CPUs,
// from /proc/stat: user, nice, system, irq and softirq (where the kernel
// modes forward); not idle, iowait or the hypervisor's steal.
func HostBusySeconds() float64 {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i == 7 { // idle, iowait, steal
			continue
		}
		if i >= 8 { // guest time is already counted in user
			break
		}
		x, _ := strconv.ParseFloat(v, 64)
		busy += x
	}
	return busy / 100 // USER_HZ
}

// FileLimit is this process's descriptor limit, which every process it
// starts inherits (sluice-bench raises it as far as it may first).
func FileLimit() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<20 {
		return 1 << 20
	}
	return int(l.Cur)
}

// proxiedConnLimit is how many proxied connections one process fits under
// FileLimit: two descriptors each, and HAProxy with splice-auto keeps a
// pipe (two more) for up to a quarter of them: 2.5 per connection, and
// room for the rest.
func proxiedConnLimit() int { return max(200, (FileLimit()-1000)*2/5) }
