//go:build linux

package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The cost workloads do a fixed amount of work through a system while
// perf counts the load balancer's syscalls (raw_syscalls:sys_enter) and
// CPU time (task-clock) over its whole process group. They report work per
// unit (per request/response, per connection, per datagram), which a
// shared, noisy machine moves far less than throughput. perf counts only
// during these workloads, so the timed workloads never carry its overhead.

// Counts is what perf counted over one measured stretch.
type Counts struct {
	Syscalls float64
	CPUms    float64 // task-clock
	// Extra are the events named in SLUICE_BENCH_PERF_EVENTS (for example
	// syscalls:sys_enter_futex,syscalls:sys_enter_read), counted beside the
	// two above to say where the syscalls go.
	Extra map[string]float64
}

// extraPerfEvents are the events SLUICE_BENCH_PERF_EVENTS names.
func extraPerfEvents() []string {
	v := os.Getenv("SLUICE_BENCH_PERF_EVENTS")
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// perfCounter is a running `perf stat` attached to a process group, started
// with its events disabled and driven through perf's control descriptors,
// so the counted stretch is exactly the work in between.
type perfCounter struct {
	cmd     *exec.Cmd
	ctl     *os.File // perf reads commands here
	ack     *bufio.Reader
	ackFile *os.File
	out     string
	stderr  *strings.Builder // what perf said; read only once it has exited
	ended   bool
	endErr  error
}

func startPerf(pids []int, dir string) (*perfCounter, error) {
	events := strings.Join(append([]string{"raw_syscalls:sys_enter", "task-clock"}, extraPerfEvents()...), ",")
	out := filepath.Join(dir, "perf-stat.csv")
	return startPerfCmd(pids, out, "stat", "-x", ",", "-e", events)
}

// startPerfRecord samples call graphs over the same stretch into out, for
// `perf report` (SLUICE_BENCH_PERF_RECORD names the directory).
func startPerfRecord(pids []int, out string) (*perfCounter, error) {
	// perf cannot make the directory: it failed, and said so only on its
	// stderr, with the first command unanswered.
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, fmt.Errorf("SLUICE_BENCH_PERF_RECORD: %w", err)
	}
	args := []string{"record", "-g", "-F", "4999"}
	if ev := os.Getenv("SLUICE_BENCH_PERF_RECORD_EVENT"); ev != "" { // e.g. syscalls:sys_enter_nanosleep
		args = []string{"record", "-g", "-e", ev}
	}
	return startPerfCmd(pids, out, args...)
}

// userSamplePeriod is the user-mode CPU time one sample of
// startUserSamples stands for, in nanoseconds of cpu-clock.
const userSamplePeriod = 100_000

// startUserSamples samples the processes' CPU clock in user mode alone,
// one sample per userSamplePeriod, into out (SLUICE_BENCH_USER_TIME=1).
// perf cannot count user time alone here: there are no hardware counters,
// and `perf stat` ignores :u on software clocks. A count of samples at a
// fixed period is that count, and the steadiest figure found for a change
// to sluice's own code (bench/latest-engine-floor/per-connection-trims/).
func startUserSamples(pids []int, out string) (*perfCounter, error) {
	return startPerfCmd(pids, out, "record", "-e", "cpu-clock:u", "-c", strconv.Itoa(userSamplePeriod))
}

// userMicros is the user-mode CPU time, in microseconds, that the samples
// startUserSamples wrote to data stand for.
func userMicros(data string) (float64, error) {
	out, err := exec.Command("perf", "script", "-i", data, "-F", "period").Output()
	if err != nil {
		return 0, fmt.Errorf("perf script %s: %w", data, err)
	}
	return countSamples(string(out)) * userSamplePeriod / 1e3, nil
}

// countSamples counts the lines of `perf script -F period` output.
func countSamples(out string) float64 {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return float64(n)
}

func startPerfCmd(pids []int, out string, args ...string) (*perfCounter, error) {
	if _, err := exec.LookPath("perf"); err != nil {
		return nil, fmt.Errorf("perf is not installed (Debian: linux-perf): %w", err)
	}
	if len(pids) == 0 {
		return nil, errors.New("no process to count")
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	cmd := exec.Command("perf", append(args,
		"-D", "-1", "--control", "fd:3,4", "-o", out, "-p", strings.Join(ps, ","))...)
	cmd.ExtraFiles = []*os.File{ctlR, ackW}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		ctlR.Close()
		ctlW.Close()
		ackR.Close()
		ackW.Close()
		return nil, fmt.Errorf("perf %s: %w", args[0], err)
	}
	ctlR.Close()
	ackW.Close()
	return &perfCounter{cmd: cmd, ctl: ctlW, ack: bufio.NewReader(ackR), ackFile: ackR, out: out, stderr: &stderr}, nil
}

// command sends enable or disable and waits for perf's ack. Unanswered,
// perf has most likely failed: it is ended, and the error gives what it
// said.
func (p *perfCounter) command(c string) error {
	if _, err := io.WriteString(p.ctl, c+"\n"); err != nil {
		p.end()
		return fmt.Errorf("perf %s: %w%s", c, err, p.said())
	}
	line, err := p.ack.ReadString('\n')
	if err != nil || strings.Trim(line, "\x00 \n") != "ack" { // perf sends "ack\n\x00"
		p.end()
		return fmt.Errorf("perf %s: no ack (%q, %v)%s", c, line, err, p.said())
	}
	return nil
}

// said is perf's stderr, once ended, for an error.
func (p *perfCounter) said() string {
	if s := strings.TrimSpace(p.stderr.String()); s != "" {
		return ": perf said: " + strings.ReplaceAll(s, "\n", "; ")
	}
	return ""
}

// end stops perf and lets go of its descriptors; a second end returns
// what the first did.
func (p *perfCounter) end() error {
	if p.ended {
		return p.endErr
	}
	p.ended = true
	p.cmd.Process.Signal(syscall.SIGINT)
	p.endErr = p.cmd.Wait()
	p.ctl.Close()
	p.ackFile.Close()
	return p.endErr
}

// stop ends perf and parses its counts.
func (p *perfCounter) stop() (Counts, error) {
	werr := p.end()
	data, err := os.ReadFile(p.out)
	if err != nil {
		return Counts{}, fmt.Errorf("perf stat output: %w (perf: %v)", err, werr)
	}
	return parsePerfCSV(string(data))
}

// parsePerfCSV reads `perf stat -x ,` output: value,unit,event,...
func parsePerfCSV(s string) (Counts, error) {
	c := Counts{Extra: map[string]float64{}}
	var seen int
	for _, line := range strings.Split(s, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return c, fmt.Errorf("perf counted nothing for %s (%q): the kernel may not allow it", f[2], f[0])
		}
		switch {
		case strings.HasPrefix(f[2], "raw_syscalls:sys_enter"):
			c.Syscalls = v
			seen++
		case strings.HasPrefix(f[2], "task-clock"):
			c.CPUms = v
			seen++
		default:
			c.Extra[f[2]] = v
		}
	}
	if seen != 2 {
		return c, fmt.Errorf("perf stat output has %d of 2 events: %q", seen, s)
	}
	return c, nil
}

// countWork counts the instance's syscalls and CPU while work runs; work
// returns how many units it completed.
func countWork(in *Instance, work func() (int, error)) (Metrics, error) {
	if in.Proc == nil || IsKernelMode(in.System) {
		return nil, errNotApplicable // no process of its own forwards the bytes
	}
	dir, err := os.MkdirTemp(in.Dir, "perf-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	pids := groupMembers(in.Proc.PID())
	p, err := startPerf(pids, dir)
	if err != nil {
		return nil, err
	}
	var rec *perfCounter
	if recDir := os.Getenv("SLUICE_BENCH_PERF_RECORD"); recDir != "" {
		out := filepath.Join(recDir, fmt.Sprintf("%s-%d.data", in.System.Name(), time.Now().UnixNano()))
		if rec, err = startPerfRecord(pids, out); err != nil {
			p.stop()
			return nil, err
		}
		defer rec.end()
	}
	var user *perfCounter
	userData := filepath.Join(dir, "user.data")
	if os.Getenv("SLUICE_BENCH_USER_TIME") == "1" {
		if user, err = startUserSamples(pids, userData); err != nil {
			p.stop()
			return nil, err
		}
		defer func() {
			if user != nil { // not ended below: an error came first
				user.end()
			}
		}()
	}
	recorders := []*perfCounter{rec, user}
	if err := p.command("enable"); err != nil {
		p.stop()
		return nil, err
	}
	for _, r := range recorders {
		if r == nil {
			continue
		}
		if err := r.command("enable"); err != nil {
			p.stop()
			return nil, err
		}
	}
	// The node namespace holds the load balancers and nothing else that
	// sends (the clients and the backends have namespaces of their own),
	// and only the system being measured carries traffic: what it sent
	// is the load balancer's packets on both of its legs.
	var sent0 nsSent
	countSent := in.Topo != nil && in.Topo.Netns()
	if countSent {
		if sent0, err = readNSSent(in.Proc.PID()); err != nil {
			p.stop()
			return nil, err
		}
	}
	units, werr := work()
	var sent1 nsSent
	if countSent {
		sent1, err = readNSSent(in.Proc.PID())
		werr = errors.Join(werr, err)
	}
	derr := p.command("disable")
	for _, r := range recorders {
		if r != nil {
			derr = errors.Join(derr, r.command("disable"))
		}
	}
	c, serr := p.stop()
	if err := errors.Join(werr, derr, serr); err != nil {
		return nil, err
	}
	if units == 0 {
		return nil, errors.New("no work completed")
	}
	m := Metrics{
		"syscalls_per_unit": c.Syscalls / float64(units),
		"cpu_us_per_unit":   c.CPUms * 1e3 / float64(units),
		"units":             float64(units),
	}
	for ev, v := range c.Extra {
		m[strings.TrimPrefix(ev, "syscalls:sys_enter_")+"_per_unit"] = v / float64(units)
	}
	if countSent {
		m["lb_tcp_segs_per_unit"] = (sent1.tcpSegs - sent0.tcpSegs) / float64(units)
		m["lb_udp_datagrams_per_unit"] = (sent1.udpDatagrams - sent0.udpDatagrams) / float64(units)
	}
	if user != nil {
		user.end() // perf writes the samples out as it exits
		user = nil
		us, err := userMicros(userData)
		if err != nil {
			return nil, err
		}
		m["user_us_per_unit"] = us / float64(units)
	}
	return m, nil
}

// nsSent is what a network namespace has sent since it was made: TCP
// segments (retransmissions included) and UDP datagrams. Counted work:
// each is a trip through the stack that its sender pays for, and on veth
// the receiver's softirq work lands in the sender's context too.
type nsSent struct{ tcpSegs, udpDatagrams float64 }

// readNSSent reads the counters of pid's network namespace.
func readNSSent(pid int) (nsSent, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/snmp", pid))
	if err != nil {
		return nsSent{}, err
	}
	return parseNSSent(string(b))
}

// parseNSSent reads Tcp OutSegs and Udp OutDatagrams from the text of
// /proc/net/snmp, where each protocol has a line of names and then a
// line of values.
func parseNSSent(text string) (nsSent, error) {
	lines := strings.Split(text, "\n")
	var s nsSent
	found := 0
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || len(names) != len(values) || names[0] != values[0] {
			continue
		}
		var field string
		var into *float64
		switch names[0] {
		case "Tcp:":
			field, into = "OutSegs", &s.tcpSegs
		case "Udp:":
			field, into = "OutDatagrams", &s.udpDatagrams
		default:
			continue
		}
		for j, n := range names {
			if n != field {
				continue
			}
			v, err := strconv.ParseFloat(values[j], 64)
			if err != nil {
				return nsSent{}, fmt.Errorf("snmp %s %s: %w", names[0], field, err)
			}
			*into = v
			found++
		}
		i++ // the values line
	}
	if found != 2 {
		return nsSent{}, errors.New("snmp: no Tcp OutSegs or Udp OutDatagrams")
	}
	return s, nil
}

// rrOn does n 64 B request/responses on c.
func rrOn(ctx context.Context, c net.Conn, n int) (int, error) {
	msg, buf := make([]byte, 64), make([]byte, 64)
	c.SetDeadline(time.Now().Add(time.Minute))
	done := 0
	for ; done < n && ctx.Err() == nil; done++ {
		if _, err := c.Write(msg); err != nil {
			return done, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return done, err
		}
	}
	return done, nil
}

// costRR: request/response on kept connections, conns at once.
func costRR(conns int) func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	return func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
		addr := in.Addr("echo").String()
		cs := make([]net.Conn, 0, conns)
		defer func() {
			for _, c := range cs {
				c.Close()
			}
		}()
		for i := 0; i < conns; i++ { // connected before counting starts
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return nil, err
			}
			cs = append(cs, c)
		}
		if _, err := rrOn(ctx, cs[0], 10); err != nil { // the backend connection is up
			return nil, err
		}
		per := sz.CostUnits / conns
		return countWork(in, func() (int, error) {
			return inParallel(conns, func(i int) (int, error) { return rrOn(ctx, cs[i], per) })
		})
	}
}

// inParallel runs work(0..n-1) at once and sums the units they completed.
func inParallel(n int, work func(i int) (int, error)) (int, error) {
	var wg sync.WaitGroup
	counts := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts[i], errs[i] = work(i)
		}()
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	return total, errors.Join(errs...)
}

// costCRR: a new connection per 64 B request, 4 clients.
func costCRR(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	addr := in.Addr("echo").String()
	const clients = 4
	// A connection costs several request/responses: a quarter of the units.
	per := sz.CostUnits / 4 / clients
	return countWork(in, func() (int, error) {
		return inParallel(clients, func(int) (int, error) {
			msg, buf := make([]byte, 64), make([]byte, 64)
			done := 0
			for ; done < per && ctx.Err() == nil; done++ {
				if err := oneShot(addr, msg, buf); err != nil {
					return done, err
				}
			}
			return done, nil
		})
	})
}

// costUDPRR: 64 B datagram request/response on one flow, sequential.
func costUDPRR(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	c, err := net.Dial("udp", in.Addr("udp").String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg, buf := make([]byte, 64), make([]byte, 2048)
	exchange := func() error {
		c.Write(msg)
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(buf)
		return err
	}
	if err := exchange(); err != nil { // the flow exists before counting starts
		return nil, fmt.Errorf("first datagram: %w", err)
	}
	return countWork(in, func() (int, error) {
		n := 0
		for i := 0; i < sz.CostUnits && ctx.Err() == nil; i++ {
			if exchange() == nil { // a lost reply is not a unit
				n++
			}
		}
		return n, nil
	})
}

// costUDPFlows: each unit is a new flow, a fresh client socket (tuple)
// sending one 64 B datagram and reading the reply; 4 clients at once, as
// many flows as the udp-flows workload opens. The flows' expiry comes
// after the count (every system here ends a flow after 1 s idle), so this
// is the cost of setting one up and relaying its first exchange.
func costUDPFlows(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	addr := in.Addr("udp").String()
	const clients = 4
	per := sz.UDPClients / clients
	return countWork(in, func() (int, error) {
		return inParallel(clients, func(int) (int, error) {
			msg, buf := make([]byte, 64), make([]byte, 2048)
			done := 0
			for i := 0; i < per && ctx.Err() == nil; i++ {
				c, err := net.Dial("udp", addr)
				if err != nil {
					return done, err
				}
				c.Write(msg)
				c.SetReadDeadline(time.Now().Add(time.Second))
				_, err = c.Read(buf)
				c.Close()
				if err == nil { // a lost reply is not a unit
					done++
				}
			}
			return done, nil
		})
	})
}

// udpBulkBurst and udpBulkSize shape cost-udp-bulk: bursts of this many
// datagrams of this size, written back to back, then their echoes read.
const (
	udpBulkBurst = 16
	udpBulkSize  = 1200
)

// costUDPBulk: one flow carrying bursts of udpBulkBurst datagrams of
// udpBulkSize bytes (a media stream or a QUIC transfer's shape rather than
// DNS's), each burst's echoes read before the next; per datagram echoed. A
// proxy that relays one datagram per call pays a send per datagram each
// way; one that batches pays fewer. With gso the client sends each burst
// in one UDP GSO send, as QUIC stacks do, so a proxy that takes merged
// datagrams (UDP_GRO) gets the burst as one buffer.
func costUDPBulk(gso bool) func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	return func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
		c, err := net.Dial("udp", in.Addr("udp").String())
		if err != nil {
			return nil, err
		}
		defer c.Close()
		uc := c.(*net.UDPConn)
		msg, buf := make([]byte, udpBulkSize), make([]byte, 2048)
		c.Write(msg)
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err != nil { // the flow exists before counting starts
			return nil, fmt.Errorf("first datagram: %w", err)
		}
		burst := bytes.Repeat(msg, udpBulkBurst)
		oob := udpSegmentCmsg(udpBulkSize)
		send := func() error {
			if gso {
				_, _, err := uc.WriteMsgUDP(burst, oob, nil)
				return err
			}
			for i := 0; i < udpBulkBurst; i++ {
				if _, err := c.Write(msg); err != nil {
					return err
				}
			}
			return nil
		}
		return countWork(in, func() (int, error) {
			n := 0
			for sent := 0; sent < sz.CostUnits && ctx.Err() == nil; sent += udpBulkBurst {
				if err := send(); err != nil {
					return n, err
				}
				for i := 0; i < udpBulkBurst; i++ {
					c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
					if _, err := c.Read(buf); err != nil {
						break // lost: the rest of the burst is not a unit
					}
					n++
				}
			}
			return n, nil
		})
	}
}

// bulkBytesPerUnit is how many bytes the TCP bulk cost workloads move per
// CostUnits: 1 GB in short mode, about 1.5 s at this box's 6-7 Gbit/s.
const bulkBytesPerUnit = 25_000

// costTCPBulk: one iperf3 stream moving a fixed number of bytes through
// the system, client to server or (reverse) back; per MB (10^6 bytes) the
// receiver took. Bulk throughput on a shared box moves with whatever else
// runs; the CPU and syscalls per MB it cost the load balancer move less,
// and show how many bytes each of its syscalls carries (a splice's pipe
// holds one skb fragment per slot, so its size sets that).
func costTCPBulk(reverse bool) func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
	return func(ctx context.Context, in *Instance, sz Size) (Metrics, error) {
		n := int64(sz.CostUnits) * bulkBytesPerUnit
		return countWork(in, func() (int, error) {
			got, err := runIperf(ctx, in, reverse, "-n", strconv.FormatInt(n, 10))
			if err != nil {
				return 0, err
			}
			return int(math.Round(got.Bytes / 1e6)), nil
		})
	}
}

// udpSegmentCmsg is a UDP_SEGMENT control message: the kernel cuts what is
// sent with it into datagrams of size bytes.
func udpSegmentCmsg(size int) []byte {
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&b[unix.CmsgLen(0)])) = uint16(size)
	return b
}
