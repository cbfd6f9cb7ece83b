// Package listeners owns the userspace data plane: the engines that accept
// client traffic and pump it to endpoints (an epoll event loop and a
// goroutine-per-connection engine behind one Engine interface), the TCP and
// UDP paths, and the Server that turns each published lb.Snapshot into the
// set of open listeners (NodePorts, local external IPs, proxy ports).
package listeners

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// Counters receives per-service-port events from the data path. Calls are
// cheap and never block; implementations must be safe for concurrent use.
type Counters interface {
	// Opened: a TCP connection was accepted or a UDP flow created. Exactly
	// one Closed follows each, a refused connection's included, so that
	// Opened minus Closed is what is open now.
	Opened()
	// Connected: a TCP connection reached an endpoint after tries attempts.
	Connected(latency time.Duration, tries int)
	// ConnectFailed: one connect attempt failed (refused, timed out, unreachable).
	ConnectFailed()
	// Refused: the client was refused because no endpoint could be reached
	// (its Closed follows, with the bytes it carried: none).
	Refused()
	// Closed: a connection or flow ended having carried up bytes client to
	// endpoint and down bytes endpoint to client.
	Closed(up, down uint64)
}

type noCounters struct{}

func (noCounters) Opened()                      {}
func (noCounters) Connected(time.Duration, int) {}
func (noCounters) ConnectFailed()               {}
func (noCounters) Refused()                     {}
func (noCounters) Closed(uint64, uint64)        {}

// Target is what a listener forwards to: one service port's picker plus the
// knobs the data path needs. Fields are read-only once the target is in use;
// endpoint and affinity changes go through the Picker.
type Target struct {
	Picker *lb.Picker
	// Retry is shared by a server's targets (nil: the zero policy): by
	// value it was 40 of a Target's 88 bytes, one or two per service port
	// (issue 16's memory budget).
	Retry      *lb.RetryPolicy
	UDPTimeout time.Duration
	Counters   Counters // nil means none
	// Hooks are what few targets have (nil: none): one pointer, so that a
	// Target is 48 bytes, not 64 (issue 16's memory budget: one or two a
	// service port).
	Hooks *TargetHooks
}

// TargetHooks are a Target's rarely set functions.
type TargetHooks struct {
	// Admit, when set, says which client addresses may use this frontend
	// (loadBalancerSourceRanges); others are refused like a port with no
	// endpoints.
	Admit func(netip.Addr) bool
	// Resolve, when set, makes this the target of a capture listener: one
	// TCP port that the VIP capture redirects many service ports to. Each
	// accepted connection's original destination (SO_ORIGINAL_DST) picks
	// the Target that serves it; nil, or no original destination (a
	// connection to the port itself), resets the connection. Only Resolve
	// is read of such a target. It runs on the data path: it must not
	// block.
	Resolve func(orig netip.AddrPort) *Target
}

// admits says whether the client at src may use the target.
func (t *Target) admits(src netip.Addr) bool {
	return t.Hooks == nil || t.Hooks.Admit == nil || t.Hooks.Admit(src)
}

// resolver is the target's Resolve (nil: it is not a capture listener's).
func (t *Target) resolver() func(netip.AddrPort) *Target {
	if t.Hooks == nil {
		return nil
	}
	return t.Hooks.Resolve
}

// startWalk makes w a connection's walk under the target's retry policy,
// from client src at time start, after the source check: over the first
// endpoints of the picker's order, as many as the policy tries, written
// into w's own room (issue 12: a connection ordered and held every
// endpoint of the port).
func (t *Target) startWalk(w *lb.Walk, src netip.Addr, start time.Time) error {
	if !t.admits(src) {
		return errNotAdmitted
	}
	var policy lb.RetryPolicy
	if t.Retry != nil {
		policy = *t.Retry
	}
	order, err := t.Picker.AppendOrder(w.Order()[:0], src, policy.Attempts)
	if err != nil {
		return err
	}
	policy.Rewalk(w, order, start)
	return nil
}

// errNotAdmitted refuses a client outside the frontend's source ranges.
var errNotAdmitted = errors.New("client address not in the source ranges")

// first is the endpoint a new flow from src goes to, after the source
// check (a datagram flow is not retried).
func (t *Target) first(src netip.Addr) (netip.AddrPort, error) {
	if !t.admits(src) {
		return netip.AddrPort{}, errNotAdmitted
	}
	var one [1]netip.AddrPort
	order, err := t.Picker.AppendOrder(one[:0], src, 1)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return order[0], nil
}

// resolved is, for a capture listener's target (its resolver set: the
// engines ask only then, so that others pay nothing per connection), the
// target that serves a connection accepted on fd (a socket of family v6):
// the one its original destination resolves to (nil: none).
func (t *Target) resolved(fd int, v6 bool) *Target {
	orig, err := originalDst(fd, v6)
	if err != nil {
		return nil
	}
	return t.resolver()(orig)
}

func (t *Target) counters() Counters {
	if t.Counters == nil {
		return noCounters{}
	}
	return t.Counters
}

// Listener is one open listening socket.
type Listener interface {
	Addr() netip.AddrPort
	// Close stops accepting. Established connections are left alone.
	Close() error
}

// Engine accepts traffic and forwards it. Both engines pass the same
// conformance suite.
type Engine interface {
	Name() string
	// Listen opens a TCP or UDP listener on addr (port 0 picks a free port).
	Listen(proto lb.Protocol, addr netip.AddrPort, t *Target) (Listener, error)
	// Shutdown closes every listener, waits for open connections to finish
	// until ctx ends, then closes what is left. It returns ctx.Err() if it
	// had to cut connections.
	Shutdown(ctx context.Context) error
}

// Engine names accepted by New.
const (
	EngineEventLoop = "eventloop"
	EngineGoroutine = "goroutine"
)

// ErrUnsupportedProtocol is returned for a protocol an engine cannot serve.
var ErrUnsupportedProtocol = errors.New("unsupported protocol")

// New returns the named engine.
func New(name string, opts Options) (Engine, error) {
	switch name {
	case EngineGoroutine:
		return NewGoroutine(opts), nil
	case EngineEventLoop:
		e, err := NewEventLoop(opts)
		if err != nil {
			return nil, err
		}
		return e, nil
	}
	return nil, fmt.Errorf("unknown engine %q: want %s or %s", name, EngineEventLoop, EngineGoroutine)
}

// Options are the engine-wide settings.
type Options struct {
	// Loops is the number of event loops (eventloop engine); 0 means one per
	// P, at most one per CPU and at most CPULimit rounded up. The engine
	// raises GOMAXPROCS to Loops+1.
	Loops int
	// CPULimit is the CPU time the process may use, in CPUs (its cgroup's
	// quota, CgroupCPULimit; a container's CPU limit); 0: no limit. Loops
	// beyond it would share the quota and sleep more for it: held to half a
	// CPU, two loops served 0.65x the keep-alive requests of one
	// (bench/latest-engine-budget/).
	CPULimit float64
	// BufferSize is the per-direction copy buffer of a connection. It bounds
	// the memory a slow reader can pin. Default 64 KiB.
	BufferSize int
	// BusyPoll is how long an event loop keeps polling without sleeping
	// after its last event (eventloop engine; 0: off).
	BusyPoll time.Duration
	// NoIOUring makes the event loops recv and send with a syscall each,
	// rather than batch a turn's on an io_uring (eventloop engine; the
	// batching is on by default wherever the kernel allows io_uring).
	NoIOUring bool
	// ringEntries is the submission slots of each loop's ring; 0 is
	// ioRingEntries. Tests set one the kernel refuses.
	ringEntries uint32
	// HalfCloseTimeout ends a connection whose one direction has closed
	// (FIN passed on) when the other moves no byte for this long, as
	// HAProxy's client-fin/server-fin timeouts do: a client that has sent
	// its request and closed, facing a backend that never answers nor
	// closes, would otherwise hold both sockets forever. Default 1 h,
	// kube-proxy's conntrack CLOSE_WAIT timeout, after which a kernel mode
	// forgets such a connection too.
	HalfCloseTimeout time.Duration
	// MaxFDs caps the descriptors the data plane holds (two per TCP
	// connection, two per splice pipe, one per UDP flow); past it, accepts
	// pause until some are freed. 0: RLIMIT_NOFILE less a reserve (a
	// sixteenth, at least 64) for everything else; negative: no cap.
	MaxFDs int
	// Sockets gives listeners a predecessor's sockets and keeps theirs
	// for a successor (hitless restart); nil: none.
	Sockets Sockets
	// Now is the clock used for connect budgets and UDP idle times; default time.Now.
	Now func() time.Time
	// Log is where the engine reports what goes wrong in it, such as a
	// loop's io_uring given up (never per packet or per connection); nil:
	// nowhere.
	Log *slog.Logger
}

// Sockets is where listening sockets come from and go to across a hitless
// restart (handover.Broker is one): Take returns (and hands over) the
// sockets a predecessor listened on at addr, Hold records one this
// process listens on, Release forgets it before it is closed.
type Sockets interface {
	Take(network string, addr netip.AddrPort) []int
	Hold(network string, addr netip.AddrPort, fd int)
	Release(fd int)
}

type noSockets struct{}

func (noSockets) Take(string, netip.AddrPort) []int { return nil }
func (noSockets) Hold(string, netip.AddrPort, int)  {}
func (noSockets) Release(int)                       {}

func (o Options) sockets() Sockets {
	if o.Sockets == nil {
		return noSockets{}
	}
	return o.Sockets
}

func (o Options) withDefaults() Options {
	if o.BufferSize <= 0 {
		o.BufferSize = 64 << 10
	}
	if o.HalfCloseTimeout <= 0 {
		o.HalfCloseTimeout = time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// maxDatagram is the largest UDP payload over IPv4 (65535-8-20), plus room
// to detect truncation of anything larger over IPv6.
const maxDatagram = 65535
