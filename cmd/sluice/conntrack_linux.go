package main

import (
	"errors"

	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/config"
)

// sysctlDir is where the conntrack sysctls are (per network namespace,
// but for nf_conntrack_max, which only the host's namespace may set).
const sysctlDir = "/proc/sys/net/netfilter/"

// applyConntrack sets the conntrack sysctls the kernel modes depend on, as
// kube-proxy does at start-up: nf_conntrack_max from
// --conntrack-max-per-core and --conntrack-min, the TCP established and
// CLOSE_WAIT timeouts, liberal TCP tracking, and the UDP timeouts; a zero
// leaves a value as it is. Failures are warnings, as kube-proxy's. Unlike
// kube-proxy, it never resizes the hash table
// (/sys/module/nf_conntrack/parameters/hashsize is the whole machine's).
func applyConntrack(cfg *config.Config, log *slog.Logger) {
	ct := cfg.KubeProxy.Conntrack
	set := func(name string, value int64) {
		file := sysctlDir + name
		cur, err := os.ReadFile(file)
		if err == nil && strings.TrimSpace(string(cur)) == strconv.FormatInt(value, 10) {
			return
		}
		if err == nil {
			err = os.WriteFile(file, []byte(strconv.FormatInt(value, 10)), 0o644)
		}
		if err != nil {
			log.Warn("conntrack: cannot set "+name, "value", value, "err", err)
			return
		}
		log.Info("conntrack: set "+name, "value", value, "was", strings.TrimSpace(string(cur)))
	}
	if per := ct.MaxPerCore; per != nil && *per > 0 {
		max := int64(*per) * int64(runtime.NumCPU())
		if ct.Min != nil && int64(*ct.Min) > max {
			max = int64(*ct.Min)
		}
		if hostNetns() {
			set("nf_conntrack_max", max)
		} else {
			log.Info("conntrack: not the host's network namespace; nf_conntrack_max left as it is", "wanted", max)
		}
	}
	secs := func(d *time.Duration) int64 { return int64(d.Seconds()) }
	if d := ct.TCPEstablishedTimeout; d != nil && d.Duration > 0 {
		set("nf_conntrack_tcp_timeout_established", secs(&d.Duration))
	}
	if d := ct.TCPCloseWaitTimeout; d != nil && d.Duration > 0 {
		set("nf_conntrack_tcp_timeout_close_wait", secs(&d.Duration))
	}
	if ct.TCPBeLiberal {
		set("nf_conntrack_tcp_be_liberal", 1)
	}
	if d := ct.UDPTimeout.Duration; d > 0 {
		set("nf_conntrack_udp_timeout", secs(&d))
	}
	if d := ct.UDPStreamTimeout.Duration; d > 0 {
		set("nf_conntrack_udp_timeout_stream", secs(&d))
	}
}

// hostNetns reports whether this process is in the host's (PID 1's)
// network namespace, the only one where nf_conntrack_max may be set.
func hostNetns() bool {
	self, err1 := os.Readlink("/proc/self/ns/net")
	init, err2 := os.Readlink("/proc/1/ns/net")
	return errors.Join(err1, err2) == nil && self == init
}
