//go:build linux

package listeners

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/lb"
)

// EventLoop is the epoll engine: a few event loops, each one goroutine that
// owns its sockets, with no goroutine per connection. Each TCP listener has
// one SO_REUSEPORT socket per loop, so a connection lives on the loop that
// accepted it, with its backend socket, and never crosses loops. Backend
// connects are non-blocking and completed on the loop; per-try timeouts,
// back-offs and UDP flow expiry are the loop's own deadlines, driven by its
// poll timeout. Each direction of a connection has at most one fixed-size
// buffer or splice pipe, taken only while bytes are in flight, so an idle
// connection holds neither and a slow reader pauses its writer. A clean EOF is forwarded
// as shutdown(SHUT_WR).
type EventLoop struct {
	opts  Options
	loops []*loop
	next  atomic.Uint64

	// The listeners are found in the loops' registries (listening), not
	// kept in a set of their own: a map entry per listener was 44 bytes per
	// service port at 10k (issue 16's memory budget).
	mu       sync.Mutex
	closing  bool
	listenMu sync.RWMutex
	noListen bool           // under listenMu: Shutdown has begun
	active   sync.WaitGroup // connections and flows
	stopped  sync.WaitGroup // loop goroutines
	stopOnce sync.Once      // a second Shutdown must not close the loops' descriptors again
	fds      *fdBudget
	// listenSockets counts the TCP listening sockets open (see listenTCP).
	listenSockets atomic.Int64
	// registerReqs are spare registerReqs (a channel rather than a
	// sync.Pool, which under the race detector drops what it is given).
	registerReqs chan *registerReq
	// ringErr is why the loops make plain syscalls rather than batch them
	// on an io_uring (nil: they batch; see eventloop_io_linux.go), and
	// ringFailures counts rings that failed later and were given up.
	ringErr      error
	ringFailures atomic.Int64
}

// NewEventLoop starts the loops.
func NewEventLoop(opts Options) (*EventLoop, error) {
	opts = opts.withDefaults()
	n := opts.Loops
	if n <= 0 {
		// One loop per P, up to one per CPU (an earlier engine in this
		// process may have raised GOMAXPROCS past the CPUs; see below).
		// No more than the CPU limit, rounded up: Go's own default
		// GOMAXPROCS stops at 2.
		n = LoopsWithin(min(runtime.GOMAXPROCS(0), runtime.NumCPU()), opts.CPULimit)
	}
	// The loops block their threads in epoll_wait. While every P is held
	// by a blocked loop, Go's sysmon takes Ps back after 20 us and wakes a
	// thread to spin for work that is not there (futex and nanosleep on
	// every wait). One P more than there are loops keeps a P idle, and
	// sysmon then leaves a loop's P alone for up to 10 ms (bench cost-crr:
	// futex 0.4 -> 0.02 and nanosleep 0.7 -> 0.3 per connection). It only
	// ever raises GOMAXPROCS.
	if runtime.GOMAXPROCS(0) <= n {
		runtime.GOMAXPROCS(n + 1)
	}
	e := &EventLoop{opts: opts, fds: newFDBudget(opts.MaxFDs), registerReqs: make(chan *registerReq, 16)}
	pipeSize := splicePipeSize()
	for i := 0; i < n; i++ {
		l, err := newLoop(e)
		if err != nil {
			for _, l := range e.loops { // none runs yet
				unix.Close(l.epfd)
				unix.Close(l.wakefd)
			}
			return nil, err
		}
		// Each loop keeps its share of the engine's idle pipes.
		l.pipes = newPipePool(e.fds, pipeSize, max(2, maxIdlePipes/n))
		e.loops = append(e.loops, l)
	}
	e.ringErr = errIOUringOff
	if !opts.NoIOUring {
		e.ringErr = e.openRings(cmp.Or(opts.ringEntries, ioRingEntries))
	}
	e.stopped.Add(len(e.loops))
	for _, l := range e.loops {
		go l.run()
	}
	return e, nil
}

// openRings gives every loop a ring, or none of them one.
func (e *EventLoop) openRings(entries uint32) error {
	for _, l := range e.loops {
		r, err := newIORing(entries)
		if err != nil {
			for _, l := range e.loops {
				if l.ring != nil {
					l.ring.close()
					l.ring = nil
				}
			}
			return err
		}
		l.ring = r
	}
	return nil
}

// ioRingEntries is the submission slots of a loop's ring: the recvs and
// sends of one batch (past it, a loop makes plain syscalls).
const ioRingEntries = 256

var errIOUringOff = errors.New("turned off (--io-uring=false)")

// IOUring reports why the loops make a syscall per recv and send rather
// than batch them on an io_uring; nil when they batch.
func (e *EventLoop) IOUring() error { return e.ringErr }

// IOUringLoops is how many loops batch on an io_uring now: all of them
// when IOUring is nil, less those whose ring failed since (IOUringFailures).
func (e *EventLoop) IOUringLoops() int {
	if e.ringErr != nil {
		return 0
	}
	return len(e.loops) - int(e.ringFailures.Load()) // a loop gives its ring up once
}

// IOUringFailures counts the rings given up after an io_uring_enter
// failed; each such loop makes plain syscalls from then on.
func (e *EventLoop) IOUringFailures() int64 { return e.ringFailures.Load() }

// IOUringOps counts the socket reads and writes the loops have made in
// batches on their rings (a turn's lone read or write is a plain syscall,
// and not counted).
func (e *EventLoop) IOUringOps() uint64 {
	var n uint64
	for _, l := range e.loops {
		n += l.ringOps.Load()
	}
	return n
}

// Name returns "eventloop".
func (e *EventLoop) Name() string { return EngineEventLoop }

// Loops is how many event loops serve connections.
func (e *EventLoop) Loops() int { return len(e.loops) }

func (e *EventLoop) pick() *loop { return e.loops[(e.next.Add(1)-1)%uint64(len(e.loops))] }

// Listen opens a TCP or UDP listener on one loop.
func (e *EventLoop) Listen(proto lb.Protocol, addr netip.AddrPort, t *Target) (Listener, error) {
	// Shutdown waits for the listeners being opened, then refuses more:
	// it finds them in the registries, where a listener being opened may
	// have some of its sockets and not yet the rest.
	e.listenMu.RLock()
	defer e.listenMu.RUnlock()
	if e.noListen {
		return nil, errors.New("engine is shutting down")
	}
	var (
		ln  Listener
		err error
	)
	switch proto {
	case lb.TCP:
		ln, err = e.listenTCP(addr, t)
	case lb.UDP:
		ln, err = e.listenUDP(addr, t)
	default:
		return nil, ErrUnsupportedProtocol
	}
	if err != nil {
		return nil, err
	}
	return ln, nil
}

// listening is every listener with a socket registered on a loop, each
// loop's registry read on its own loop. A UDP listener that drains is no
// longer registered.
func (e *EventLoop) listening() []Listener {
	var ls []Listener
	seen := map[*elTCPListener]bool{} // a listener with a socket on each loop
	for _, l := range e.loops {
		l.do(func() {
			l.regs.each(func(h handler) {
				switch h := h.(type) {
				case *elTCPSocket:
					if !seen[h.ln] {
						seen[h.ln] = true
						ls = append(ls, h.ln)
					}
				case *elUDPListener:
					ls = append(ls, h)
				}
			})
		})
	}
	return ls
}

// Shutdown closes every listener, waits for connections to drain until ctx
// ends, then closes the rest and stops the loops.
func (e *EventLoop) Shutdown(ctx context.Context) error {
	e.listenMu.Lock()
	e.noListen = true
	e.listenMu.Unlock()
	ls := e.listening()
	// The listeners close first, on their loops: a connection accepted
	// before that is served, not reset (after a hand-over the successor
	// accepts on the same sockets, and any client reset here would be one
	// too many).
	for _, l := range ls {
		if u, ok := l.(*elUDPListener); ok {
			u.drain()
		} else {
			l.Close()
		}
	}
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	done := make(chan struct{})
	go func() { e.active.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		for _, l := range e.loops {
			l.post(l.closeAll)
		}
		<-done
	}
	e.stopLoops()
	return err
}

func (e *EventLoop) stopLoops() { e.stopOnce.Do(e.stopLoopsOnce) }

func (e *EventLoop) stopLoopsOnce() {
	for _, l := range e.loops {
		l.post(func() { l.quit = true })
	}
	e.stopped.Wait()
	for _, l := range e.loops {
		l.pipes.close()
		unix.Close(l.epfd)
		unix.Close(l.wakefd)
		if l.ring != nil {
			l.ring.close()
		}
	}
}

// handler is anything registered on a loop.
type handler interface {
	event(ev uint32)
}

type loop struct {
	e      *EventLoop
	epfd   int
	wakefd int

	mu    sync.Mutex
	tasks []task
	spare []task // the last batch's room, for the next (runTasks)

	// Owned by the loop goroutine.
	regs registry
	// pending is what is left of the events of the wait being handled:
	// drop takes a descriptor's events out of it, so that none reaches a
	// handler that is gone, or the next one given the same number.
	pending []unix.EpollEvent
	later   []*tcpConn // connections that yielded with work left
	again   []func()   // UDP sockets that yielded with work left
	timers  deadlines
	free    [][]byte // spare copy buffers
	// pipes are the splice pipes kept for the next bulk burst: a
	// direction holds one only while bytes are in flight (spliceStep).
	// The loop alone uses it, so its lock is never contended.
	pipes *pipePool
	// ring batches the turn's stream recvs and sends (nil: plain
	// syscalls); ioOps are those queued on it, ioSpare the last batch's
	// room (eventloop_io_linux.go).
	ring    *ioRing
	ioOps   []ioOp
	ioSpare []ioOp
	// queuedRecvs counts the recvs in ioOps (maxQueuedRecvs).
	queuedRecvs int
	// The most recvs and sends one enter carried (counted work, for tests).
	mostRecvs, mostSends uint32
	// ringOps counts the recvs and sends made in batches on the ring
	// (IOUringOps; written by the loop alone, once a batch).
	ringOps atomic.Uint64
	// walks are spare connect walks, with their orders' room: a
	// connection holds one only while it connects.
	walks []*lb.Walk
	batch *dgramBatch // made by the loop's first UDP receive (dgrams)
	// now is the loop's clock at this turn's wake-up. Everything done in
	// the turn counts from it: a walk's budget, a deadline armed, a
	// connect's latency, the next poll timeout. A clock read costs about
	// 100 ns on a VM (two vDSO reads), and a connection made four of its
	// own on top of its turns' (issue 12). A deadline armed late in a turn
	// falls earlier by what the turn had done before it, and the poll
	// timeout is longer by the whole turn: microseconds, against epoll's
	// millisecond timeouts.
	now time.Time
	// events is how many events this turn's wait brought: a busy turn's
	// listeners accept in batches (elTCPSocket.event).
	events int
	// lastEvent is when the last wait returned events (for BusyPoll).
	lastEvent time.Time
	// lastYield is when the loop last went through Go's scheduler; see
	// yieldEvery.
	lastYield time.Time
	quit      bool
	conns     connList // the open connections
	// ended are the connections closed in this turn, and spareConns those
	// kept for reuse: a connection is reused only after the turn that
	// closed it, when no event, deadline or yield of this turn can still
	// name it (see endTurn).
	ended      []*tcpConn
	spareConns []*tcpConn
	udp        map[*elUDPListener]struct{}

	exited chan struct{} // closed when run returns; later tasks never run
	// The eventfd's buffers, never written after newLoop but by the
	// loop's reads into wakeSink: one on the stack escaped when built
	// with -race, an allocation per wake-up.
	wakeOne, wakeSink [8]byte
}

func newLoop(e *EventLoop) (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	wfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	l := &loop{e: e, epfd: epfd, wakefd: wfd,
		udp: map[*elUDPListener]struct{}{}, exited: make(chan struct{}), wakeOne: [8]byte{1}}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wfd)}); err != nil {
		unix.Close(epfd)
		unix.Close(wfd)
		return nil, fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	return l, nil
}

// task is work posted to a loop.
type task interface{ run() }

// funcTask is a func posted as a task: a func value is one pointer, so
// making it a task allocates nothing.
type funcTask func()

func (f funcTask) run() { f() }

// post runs fn on the loop. It is safe from any goroutine and never blocks
// on the loop.
func (l *loop) post(fn func()) { l.postTask(funcTask(fn)) }

// postTask runs t on the loop, as post does.
func (l *loop) postTask(t task) {
	l.mu.Lock()
	l.tasks = append(l.tasks, t)
	first := len(l.tasks) == 1
	l.mu.Unlock()
	if first {
		unix.Write(l.wakefd, l.wakeOne[:])
	}
}

// do runs fn on the loop and waits for it. It reports false, without
// running fn, when the loop has already stopped.
func (l *loop) do(fn func()) bool {
	done := make(chan struct{})
	l.post(func() { fn(); close(done) })
	select {
	case <-done:
		return true
	case <-l.exited:
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}

// register adds fd edge-triggered for reads and writes.
func (l *loop) register(fd int, h handler) error {
	return l.registerFor(fd, h, streamEvents|unix.EPOLLET)
}

// streamEvents are what a stream socket is registered for.
const streamEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP

// registerReq is another goroutine's request that a loop register a
// descriptor, which it waits for. They are reused (EventLoop.registerReqs)
// so that opening listeners leaves no garbage among what they keep: a
// do's closure, channel and boxed error per listener left the spans of
// the sizes a port keeps half empty once collected (issue 16's memory
// budget: heap dumps at 10k).
type registerReq struct {
	l      *loop
	fd     int
	h      handler
	events uint32
	err    error
	done   chan struct{} // buffered: run never waits
}

func (r *registerReq) run() {
	r.err = r.l.registerFor(r.fd, r.h, r.events)
	r.done <- struct{}{}
}

// registerFrom registers fd on the loop for events, from another
// goroutine, and waits; errStopped when the loop has stopped.
func (l *loop) registerFrom(fd int, h handler, events uint32) error {
	var r *registerReq
	select {
	case r = <-l.e.registerReqs:
	default:
		r = &registerReq{done: make(chan struct{}, 1)}
	}
	r.l, r.fd, r.h, r.events, r.err = l, fd, h, events, nil
	l.postTask(r)
	select {
	case <-r.done:
	case <-l.exited:
		select {
		case <-r.done:
		default:
			return errStopped // never run: r is not reused
		}
	}
	err := r.err
	r.l, r.h, r.err = nil, nil, nil
	select {
	case l.e.registerReqs <- r:
	default:
	}
	return err
}

// registerReads adds fd edge-triggered for reads only: a datagram socket
// that drops rather than waits when its send buffer is full would
// otherwise wake the loop with an EPOLLOUT edge each time a sent datagram
// is freed.
func (l *loop) registerReads(fd int, h handler) error {
	return l.registerFor(fd, h, unix.EPOLLIN|unix.EPOLLET)
}

// registerFor adds fd for events, which say whether it is edge-triggered
// (EPOLLET): every socket is but a listening TCP one (elTCPSocket.event).
func (l *loop) registerFor(fd int, h handler, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	if err := epollAdd(l.epfd, fd, &ev); err != nil {
		return err
	}
	l.regs.set(fd, h)
	return nil
}

// drop unregisters fd, and takes its events out of those still to be
// handled from the current wait: once fd is closed its number may be given
// to a new socket, here or on another loop, before they are reached.
func (l *loop) drop(fd int) {
	l.regs.drop(fd)
	for i := range l.pending {
		if int(l.pending[i].Fd) == fd {
			l.pending[i].Fd = -1
		}
	}
}

// closeFD unregisters and closes fd.
func (l *loop) closeFD(fd int) {
	l.drop(fd)
	closeNow(fd) // closing the only reference removes it from epoll
}

// closeListening unregisters and closes a listening socket, which a
// successor process may hold too (hitless restart): epoll drops a
// registration only when the last descriptor of the socket closes, so it
// is removed first, and the successor's copy keeps the socket and its
// queue.
func (l *loop) closeListening(fd int) {
	l.e.opts.sockets().Release(fd)
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	l.closeFD(fd)
}

func (l *loop) getBuf() []byte {
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b
	}
	return make([]byte, l.e.opts.BufferSize)
}

func (l *loop) putBuf(b []byte) {
	if len(l.free) < 64 { // keep a few warm; let the GC have the rest
		l.free = append(l.free, b)
	}
}

// wait is one epoll_wait. With BusyPoll, a wait that would sleep first
// polls without sleeping until BusyPoll has passed since the last event,
// so a reply that comes soon is taken without the wake-up of a parked CPU.
func (l *loop) wait(events []unix.EpollEvent, timeout int) (int, error) {
	if bp := l.e.opts.BusyPoll; bp > 0 && timeout != 0 {
		start := l.e.opts.Now()
		until := l.lastEvent.Add(bp)
		if deadline := start.Add(time.Duration(timeout) * time.Millisecond); timeout > 0 && deadline.Before(until) {
			until = deadline
		}
		now := start
		for now.Before(until) {
			n, err := unix.EpollWait(l.epfd, events, 0)
			if n != 0 || (err != nil && err != unix.EINTR) {
				l.lastEvent = l.e.opts.Now()
				return n, err
			}
			now = l.e.opts.Now()
		}
		if timeout > 0 { // what spinning spent comes off the sleep
			timeout = max(0, timeout-int(now.Sub(start)/time.Millisecond))
		}
	}
	n, err := unix.EpollWait(l.epfd, events, timeout)
	if n > 0 && l.e.opts.BusyPoll > 0 { // a clock read per wake-up only for those who spin
		l.lastEvent = l.e.opts.Now()
	}
	return n, err
}

// arm schedules x, a deadline its owner keeps, d from the turn's clock
// (l.now). Loop goroutine only.
func (l *loop) arm(x *deadline, d time.Duration) *deadline {
	l.timers.arm(x, l.now.Add(d))
	return x
}

// after runs fn on the loop once d has passed since the turn's clock
// (l.now); the loop's poll timeout wakes it. Loop goroutine only.
func (l *loop) after(d time.Duration, fn func()) *deadline {
	return l.timers.add(l.now.Add(d), fn)
}

// yieldEvery is how often a busy loop passes through Go's scheduler. A
// goroutine that never does looks to sysmon like one running on a single
// time slice: after 10 ms sysmon takes its P away while it sits in
// epoll_wait, or preempts it, and each time drops back to polling every
// 20 us and backs off again over about 10 ms (bench cost-crr: 0.28
// nanosleep and a context switch per connection, all sysmon's). A
// Gosched every few milliseconds starts a new slice at the cost of one
// trip through the scheduler, no syscall.
const yieldEvery = 5 * time.Millisecond

// run is the loop: one blocking epoll_wait per turn, whose timeout is the
// earliest deadline (zero when a socket yielded with work left).
//
// The loop blocks its OS thread in epoll_wait rather than parking on Go's
// netpoller: parking cost two epoll_wait calls (one that found nothing,
// one after the wake-up) and the netpoller's epoll_pwait per wake-up, plus
// the scheduler's hand-offs (bench cost-rr: 13.4 syscalls per
// request/response before, see the README's engine section).
func (l *loop) run() {
	defer l.e.stopped.Done()
	defer close(l.exited)
	events := make([]unix.EpollEvent, 256)
	l.now = l.e.opts.Now()
	for !l.quit {
		timeout := -1
		switch {
		case len(l.later) > 0 || len(l.again) > 0 || len(l.ioOps) > 0:
			timeout = 0
		case l.timers.len() > 0:
			timeout = l.timers.waitMillis(l.now)
		}
		n, err := l.wait(events, timeout)
		if err != nil {
			if err != unix.EINTR {
				panic(fmt.Sprintf("epoll_wait: %v", err)) // a programming error: the fd is ours
			}
			n = 0
		}
		l.now = l.e.opts.Now()
		l.events = n
		if l.now.Sub(l.lastYield) >= yieldEvery {
			runtime.Gosched()
			l.lastYield = l.now
		}
		for i := 0; i < n; i++ {
			ev := events[i]
			l.pending = events[i+1 : n]
			if int(ev.Fd) == l.wakefd {
				unix.Read(l.wakefd, l.wakeSink[:])
				continue
			}
			if h := l.regs.get(int(ev.Fd)); h != nil { // nil: dropped (Fd -1) or not ours
				h.event(ev.Events)
			}
		}
		l.pending = nil
		l.runTasks()
		if later := l.later; len(later) > 0 {
			l.later = nil
			for _, c := range later {
				c.queued = false
				c.progress()
			}
		}
		if again := l.again; len(again) > 0 {
			l.again = nil
			for _, fn := range again {
				fn()
			}
		}
		if l.timers.len() > 0 {
			l.timers.fire(l.now)
		}
		l.flushIO()
		l.endTurn()
	}
	l.closeAll()
}

// runTasks runs the posted tasks, in turns until none is left. The
// batches' room is reused, up to maxSpareTasks: a new slice per batch was
// garbage of every listener opened (issue 16's memory budget; see
// registerFrom).
func (l *loop) runTasks() {
	for {
		l.mu.Lock()
		tasks := l.tasks
		if len(tasks) == 0 {
			l.mu.Unlock()
			return
		}
		l.tasks, l.spare = l.spare, nil // posts meanwhile go to the spare room
		l.mu.Unlock()
		for i, t := range tasks {
			t.run()
			tasks[i] = nil
		}
		if cap(tasks) <= maxSpareTasks {
			l.mu.Lock()
			l.spare = tasks[:0]
			l.mu.Unlock()
		}
	}
}

// maxSpareTasks is the most room for tasks a loop keeps between batches.
const maxSpareTasks = 256

// newConn is a spare connection, or a new one; the caller sets every field.
func (l *loop) newConn() *tcpConn {
	if n := len(l.spareConns); n > 0 {
		c := l.spareConns[n-1]
		l.spareConns[n-1] = nil
		l.spareConns = l.spareConns[:n-1]
		return c
	}
	return new(tcpConn)
}

// maxSpareConns bounds the closed connections a loop keeps for reuse
// (about 600 B each): enough for the connections a burst closes in one
// turn, no more.
const maxSpareConns = 256

// endTurn keeps the connections closed in this turn for reuse. By now
// nothing of the turn can reach them: their descriptors were dropped from
// the registry and from the events left (drop), their deadline cancelled
// (release). The one thing that can still name one is the list of those
// that yielded (later), which the next turn walks: a connection queued
// there is left to the collector instead.
func (l *loop) endTurn() {
	for i, c := range l.ended {
		if !c.queued && len(l.spareConns) < maxSpareConns {
			*c = tcpConn{}
			l.spareConns = append(l.spareConns, c)
		}
		l.ended[i] = nil
	}
	l.ended = l.ended[:0]
}

// connList is a loop's open connections, linked through the connections
// themselves: a map from connection to nothing cost a hash insert and
// delete per connection (about 4 % of the loop's user time in cost-crr).
type connList struct {
	head *tcpConn
	n    int
}

func (cl *connList) add(c *tcpConn) {
	cl.n++
	c.prev, c.next = nil, cl.head
	if cl.head != nil {
		cl.head.prev = c
	}
	cl.head = c
}

func (cl *connList) remove(c *tcpConn) {
	cl.n--
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		cl.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
}

func (l *loop) closeAll() {
	for c := l.conns.head; c != nil; {
		next := c.next
		c.abort()
		c = next
	}
	for u := range l.udp {
		u.closeFlows()
	}
}

// sockaddr conversions.

func bindSocket(typ int, addr netip.AddrPort) (int, error) {
	return bindSocketOpts(typ, addr, false)
}

// bindSocketOpts binds a non-blocking socket; reusePort lets the engine's
// loops each bind their own socket to the same address (SO_REUSEPORT: the
// kernel spreads new connections across them by their 4-tuple).
func bindSocketOpts(typ int, addr netip.AddrPort, reusePort bool) (int, error) {
	sa := newRawSockaddr(addr)
	family := sa.family()
	fd, err := unix.Socket(family, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if reusePort {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("SO_REUSEPORT: %w", err)
		}
	}
	if family == unix.AF_INET6 {
		unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	}
	if err := bindRaw(fd, &sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", addr, err)
	}
	return fd, nil
}

// localAddr is the address fd is bound to (IPv4-mapped ones as IPv4),
// asked with no allocation (x/sys/unix's Getsockname makes two).
func localAddr(fd int) netip.AddrPort {
	var raw unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	_, _, errno := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&raw)), uintptr(unsafe.Pointer(&n)))
	if errno != 0 {
		return netip.AddrPort{}
	}
	return rawAddrPort(&raw)
}

var errStopped = errors.New("event loop stopped")

// errAgain reports a would-block result.
func errAgain(err error) bool { return err == unix.EAGAIN || err == unix.EWOULDBLOCK }

// ---------------------------------------------------------------- TCP

// elTCPListener is one TCP listening address served by every loop: a
// socket per loop in one SO_REUSEPORT group, each accepting onto its own
// loop.
//
// A listener per service port is the default, so it is one allocation of
// 112 bytes with its socket when it has one, where it was 136 in three
// (issue 16's memory budget; TestEventLoopListenerRecordSizes).
type elTCPListener struct {
	e    *EventLoop
	addr netip.AddrPort
	t    *Target
	// socks are its sockets: one (in first) or one per loop, their room
	// made before the first is registered, since the loops hold pointers
	// into it; nil once closed, under mu.
	socks []elTCPSocket
	mu    sync.Mutex
	first [1]elTCPSocket
}

// elTCPSocket is one loop's listening socket.
type elTCPSocket struct {
	ln      *elTCPListener
	l       *loop
	backoff *deadline // pending accept retry after EMFILE and the like (paused)
	fd      int32
}

func (e *EventLoop) listenTCP(addr netip.AddrPort, t *Target) (Listener, error) {
	ln := &elTCPListener{e: e, t: t}
	socks := e.opts.sockets()
	// A predecessor's sockets for this address (hitless restart) are all
	// served, however many loops there are here: closing one of a
	// reuseport group would drop the connections queued on it.
	var one [1]int // the room for one socket, the usual case, on the stack
	fds := socks.Take("tcp", addr)
	if fds == nil {
		fds = one[:0]
	}
	inherited := len(fds) > 0
	for _, fd := range fds {
		unix.SetNonblock(fd, true)
		unix.CloseOnExec(fd)
	}
	if len(fds) > 0 {
		ln.addr = localAddr(fds[0])
	}
	// One socket per loop (SO_REUSEPORT: each connection stays on the loop
	// whose socket accepted it) while listening sockets hold at most a
	// quarter of the descriptor budget; past that (thousands of service
	// ports) one socket per listener, the listeners spread over the loops:
	// at 10k service ports two loops' sockets were 20k descriptors, the
	// whole limit here, and listeners failed with EMFILE.
	want := len(e.loops)
	if lim := e.fds.limit; lim > 0 && e.listenSockets.Load()+int64(want) > lim/4 {
		want = 1
	}
	for len(fds) < want {
		at := addr
		if len(fds) > 0 {
			at = ln.addr // the port the first socket got, when addr asked for any
		}
		// SO_REUSEPORT on every socket of a fixed port, so that a
		// successor with more loops can add its own to the group.
		fd, err := listenSocket(at, len(e.loops) > 1 || at.Port() != 0)
		if err != nil {
			if inherited {
				break // serve on what was handed over (a predecessor without reuseport)
			}
			for _, fd := range fds { // the loops' sockets bound before this one
				unix.Close(fd)
			}
			return nil, err
		}
		if len(fds) == 0 {
			ln.addr = localAddr(fd)
		}
		fds = append(fds, fd)
	}
	first := 0
	if len(fds) < len(e.loops) {
		first = int(e.next.Add(1) - 1) // spread single sockets over the loops
	}
	if len(fds) == 1 {
		ln.socks = ln.first[:0]
	} else {
		ln.socks = make([]elTCPSocket, 0, len(fds))
	}
	for i, fd := range fds {
		l := e.loops[(first+i)%len(e.loops)]
		ln.socks = append(ln.socks, elTCPSocket{ln: ln, l: l, fd: int32(fd)})
		s := &ln.socks[i]
		if err := l.registerFrom(fd, s, listenEvents); err != nil {
			for _, fd := range fds[i:] {
				unix.Close(fd)
			}
			ln.socks = ln.socks[:i]
			ln.closeSockets()
			return nil, err
		}
		socks.Hold("tcp", ln.addr, fd)
		e.listenSockets.Add(1)
	}
	return ln, nil
}

// listenSocket binds and listens one TCP socket. Accepted sockets inherit
// TCP_NODELAY from it, so it is set once here.
func listenSocket(at netip.AddrPort, reusePort bool) (int, error) {
	fd, err := bindSocketOpts(unix.SOCK_STREAM, at, reusePort)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("TCP_NODELAY on %s: %w", at, err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen %s: %w", at, err)
	}
	return fd, nil
}

func (ln *elTCPListener) Addr() netip.AddrPort { return ln.addr }

// v6 says the listener's sockets are IPv6 ones (for the original
// destination's level).
func (ln *elTCPListener) v6() bool { return ln.addr.Addr().Is6() && !ln.addr.Addr().Is4In6() }

// Close closes the sockets; a second Close returns once the first has.
func (ln *elTCPListener) Close() error {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.socks != nil {
		ln.closeSockets()
	}
	return nil
}

func (ln *elTCPListener) closeSockets() {
	ln.e.listenSockets.Add(-int64(len(ln.socks)))
	for i := range ln.socks {
		s := &ln.socks[i]
		if !s.l.do(func() {
			s.l.timers.cancel(s.backoff)
			s.l.closeListening(int(s.fd))
		}) {
			s.ln.e.opts.sockets().Release(int(s.fd))
			unix.Close(int(s.fd))
		}
	}
	ln.socks = nil
}

// acceptBackoff is how long a listener that ran out of descriptors or
// memory waits before accepting again: one pending retry per socket, not
// one per failed accept.
const acceptBackoff = 10 * time.Millisecond

// listenEvents are what a listening TCP socket is registered for: level-
// triggered reads. The next wait reports the socket again while its queue
// holds more, so an event need not accept until EAGAIN. Edge-triggered, it
// had to, and that last, empty accept was 0.63 of the 1.63 accept4 calls
// per connection (bench cost-crr, issue 12); nginx made one.
const listenEvents = unix.EPOLLIN

// busyTurn is the number of events from one wait that makes a turn busy.
// A loop that is not busy comes back to its listener within microseconds,
// so each event accepts one client, as nginx does. A busy one may take a
// millisecond or more to come back, which at one client a turn would cap
// its accept rate below what its connections can be served at, so there
// each event accepts up to acceptBatch, ending on the EAGAIN that says the
// queue is empty (one accept4 in acceptBatch or fewer).
const (
	busyTurn    = 16
	acceptBatch = 64
)

func (s *elTCPSocket) event(uint32) {
	if s.backoff != nil {
		return // paused: the retry comes
	}
	batch := 1
	if s.l.events >= busyTurn {
		batch = acceptBatch
	}
	fds := s.l.e.fds
	for i := 0; i < batch; i++ {
		// A connection's two descriptors (client and backend) are taken
		// before the accept: past the budget, clients wait in the accept
		// queue rather than the process running out.
		if !fds.take(2) && (!s.l.pipes.shed() || !fds.take(2)) {
			// The kept pipes' descriptors go first.
			s.pause()
			return
		}
		nfd, client, err := accept4(int(s.fd))
		switch {
		case err == nil:
		case errAgain(err):
			// Empty, or taken by another process's copy of the socket (a
			// hand-over).
			fds.give(2)
			return
		case err == unix.EINTR || err == unix.ECONNABORTED:
			fds.give(2) // gone before it was accepted: the next wait says if more are queued
			continue
		default:
			// Out of descriptors (EMFILE, ENFILE) or memory: come back
			// shortly rather than spin or stall.
			fds.give(2)
			s.pause()
			return
		}
		t := s.ln.t
		if t.resolver() != nil { // a capture listener's: its family is asked only then
			t = t.resolved(nfd, s.ln.v6())
		}
		if t == nil {
			resetClose(nfd)
			fds.give(2)
			continue
		}
		s.l.startConn(nfd, client, t)
	}
}

// pause stops accepting on this socket for acceptBackoff. The socket is
// level-triggered, so it is taken out of the wait's interest meanwhile, or
// every wait would report its queue at once and the loop would spin; the
// retry is a deadline, one per socket.
func (s *elTCPSocket) pause() {
	_ = s.interest(0) // a failure: see interest
	s.backoff = s.l.after(acceptBackoff, s.resume)
}

// resume ends a pause: the socket is of interest again, and the next wait
// reports it if clients are queued. If the kernel refuses (out of memory),
// the pause goes on, and the next retry tries again: a socket left out of
// the wait's interest with no retry pending would never accept again. A
// socket closed meanwhile was dropped with its deadline (closeSockets).
func (s *elTCPSocket) resume() {
	s.backoff = nil
	if err := s.interest(listenEvents); err != nil {
		s.backoff = s.l.after(acceptBackoff, s.resume)
	}
}

// interest sets what the loop's wait reports of the socket. It fails on a
// socket registered on this loop only for want of memory. A pause whose
// change fails leaves the socket reported, and its events return at once
// until the retry (event: backoff): a busy loop for acceptBackoff, not a
// lost client.
func (s *elTCPSocket) interest(events uint32) error {
	return unix.EpollCtl(s.l.epfd, unix.EPOLL_CTL_MOD, int(s.fd), &unix.EpollEvent{Events: events, Fd: s.fd})
}

// accept4 accepts a non-blocking connection and its peer's address with
// one syscall (x/sys/unix's Accept4 asks the socket's protocol with a
// getsockopt on every call). The listener is non-blocking, so the call
// cannot block: it is raw, without the scheduler's bookkeeping around it,
// as the other per-connection calls are (sockio_linux.go).
func accept4(fd int) (int, netip.AddrPort, error) {
	var raw unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	r, _, errno := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&raw)), uintptr(unsafe.Pointer(&n)),
		unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if errno != 0 {
		return -1, netip.AddrPort{}, errno
	}
	return int(r), rawAddrPort(&raw), nil
}

// side is one socket of a proxied connection.
type side struct {
	fd       int
	readable bool
	writable bool
	// hup: the peer has shut its side (or the socket failed), so reads go
	// on until EOF or an error, even after a short read.
	hup bool
}

// pipe is one direction: bytes read from src wait in buf[r:w] for dst.
type pipe struct {
	src, dst *side
	buf      []byte
	r, w     int
	eof      bool // src sent FIN
	shut     bool // FIN passed on to dst
	bytes    uint64

	// Splice-auto, as HAProxy does it: a read that fills the whole buffer
	// marks the direction as bulk, and once its buffer has drained the bytes
	// go src -> kernel pipe -> dst with splice(2), never copied through user
	// space. Small request/response traffic keeps the cheaper plain copy.
	bulk    bool
	spliced bool
	piped   bool   // kpipe is this direction's (while bytes are in flight)
	kpipe   [2]int // read end, write end
	inPipe  int    // bytes waiting in the kernel pipe

	// io says whether a recv or send of this direction is on the loop's
	// ring, and op is then its place in the loop's queue (ioQueued).
	io ioState
	op int32
}

// pending reports bytes read from src and not yet written to dst.
func (p *pipe) pending() bool { return p.r < p.w || p.inPipe > 0 }

type tcpConn struct {
	l      *loop
	t      *Target
	client netip.AddrPort
	cs, bs side
	up     pipe // client -> backend
	down   pipe // backend -> client

	// connect state
	walk     *lb.Walk
	ep       netip.AddrPort
	started  time.Time
	timer    *deadline // &dl while the connect or half-close timer is pending
	dl       deadline
	halfMark uint64 // bytes moved when the half-close timer was armed

	prev, next *tcpConn // in the loop's connList
	connecting bool
	connected  bool
	closed     bool
	queued     bool
}

type clientHandler struct{ c *tcpConn }
type backendHandler struct{ c *tcpConn }

// note records what an edge says about one socket.
func (s *side) note(ev uint32) {
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.readable = true
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.hup = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.writable = true
	}
}

func (h clientHandler) event(ev uint32) {
	c := h.c
	c.cs.note(ev)
	if c.connected {
		c.progress()
	}
}

func (h backendHandler) event(ev uint32) {
	c := h.c
	if c.connecting {
		c.finishConnect(ev)
		return
	}
	c.bs.note(ev)
	c.progress()
}

func (l *loop) startConn(fd int, client netip.AddrPort, t *Target) {
	ctr := t.counters()
	ctr.Opened()
	e := l.e
	e.mu.Lock()
	closing := e.closing
	if !closing {
		e.active.Add(1)
	}
	e.mu.Unlock()
	if closing {
		resetClose(fd)
		e.fds.give(2)
		ctr.Closed(0, 0)
		return
	}
	c := l.newConn()
	*c = tcpConn{l: l, t: t, client: client, cs: side{fd: fd}, bs: side{fd: -1}, started: l.now}
	c.dl = deadline{owner: c, index: -1}
	c.up = pipe{src: &c.cs, dst: &c.bs}
	c.down = pipe{src: &c.bs, dst: &c.cs}
	c.walk = l.takeWalk()
	if err := t.startWalk(c.walk, client.Addr(), c.started); err != nil {
		l.giveWalk(c)
		ctr.Refused()
		resetClose(fd)
		e.fds.give(2)
		ctr.Closed(0, 0)
		e.active.Done()
		return
	}
	if err := l.register(fd, clientHandler{c}); err != nil {
		l.giveWalk(c)
		resetClose(fd)
		e.fds.give(2)
		ctr.Closed(0, 0)
		e.active.Done()
		return
	}
	l.conns.add(c)
	c.tryNext()
}

// takeWalk is a spare walk, or a new one.
func (l *loop) takeWalk() *lb.Walk {
	if n := len(l.walks); n > 0 {
		w := l.walks[n-1]
		l.walks = l.walks[:n-1]
		return w
	}
	return new(lb.Walk)
}

// maxSpareWalks bounds the spare walks a loop keeps: enough for a burst
// of connects in flight, no more.
const maxSpareWalks = 256

// giveWalk takes c's walk back, if it has one: it is done connecting.
func (l *loop) giveWalk(c *tcpConn) {
	if c.walk == nil {
		return
	}
	if len(l.walks) < maxSpareWalks {
		l.walks = append(l.walks, c.walk)
	}
	c.walk = nil
}

// resetClose closes with SO_LINGER 0, which sends RST: the client sees
// ECONNRESET at once instead of hanging.
func resetClose(fd int) {
	lingerNone(fd)
	closeNow(fd)
}

// tryNext starts a non-blocking connect to the next endpoint of the walk.
func (c *tcpConn) tryNext() {
	l := c.l
	for {
		ep, timeout, ok := c.walk.Next(l.now)
		if !ok {
			c.t.counters().Refused()
			c.abort()
			return
		}
		sa := newRawSockaddr(ep)
		fd, err := unix.Socket(sa.family(), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			c.t.counters().Refused()
			c.abort()
			return
		}
		setIntOpt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		err = connectRaw(fd, &sa)
		if err != nil && err != unix.EINPROGRESS {
			closeNow(fd)
			c.failed(ep)
			continue
		}
		c.ep = ep
		c.bs = side{fd: fd}
		c.connecting = true
		if err := l.register(fd, backendHandler{c}); err != nil {
			unix.Close(fd)
			c.bs.fd = -1
			c.connecting = false
			c.failed(ep)
			continue
		}
		c.timer = l.arm(&c.dl, timeout)
		return
	}
}

func (c *tcpConn) failed(ep netip.AddrPort) {
	c.t.Picker.Failed(c.client.Addr(), ep)
	c.t.counters().ConnectFailed()
}

func (c *tcpConn) connectFailed() {
	c.connecting = false
	c.stopTimer()
	c.l.closeFD(c.bs.fd)
	c.bs.fd = -1
	c.failed(c.ep)
	c.tryNext()
}

func (c *tcpConn) stopTimer() {
	c.l.timers.cancel(c.timer)
	c.timer = nil
}

// finishConnect handles an edge on a connecting backend socket. A TCP
// socket reports EPOLLOUT only once the handshake is through, so SO_ERROR
// is read only when the edge carries an error or hang-up.
func (c *tcpConn) finishConnect(ev uint32) {
	if ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		soerr, err := unix.GetsockoptInt(c.bs.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil || soerr != 0 || ev&unix.EPOLLOUT == 0 {
			c.connectFailed()
			return
		}
	} else if ev&unix.EPOLLOUT == 0 {
		return // not yet connected
	}
	c.connecting = false
	c.connected = true
	c.stopTimer()
	// Bytes that came with the handshake are in ev (an edge reports the
	// socket's whole readiness), and later ones bring an edge of their
	// own: the socket was registered before the connect, so no read is
	// spent on EAGAIN here (one per connection, issue 12).
	c.bs.note(ev)
	c.bs.writable = true
	c.t.Picker.Connected(c.client.Addr(), c.ep)
	c.t.counters().Connected(c.l.now.Sub(c.started), c.walk.Tries())
	c.l.giveWalk(c)
	c.progress()
}

// maxRounds bounds the work one connection does per wake-up, so a bulk
// transfer cannot starve the other sockets of its loop.
const maxRounds = 16

// progress moves bytes until nothing can move, or yields after maxRounds.
func (c *tcpConn) progress() {
	if c.closed || !c.connected {
		return
	}
	for round := 0; round < maxRounds; round++ {
		moved := false
		for _, p := range [2]*pipe{&c.up, &c.down} {
			m, ok := c.step(p)
			if !ok {
				c.abort()
				return
			}
			moved = moved || m
		}
		if c.up.shut && c.down.shut {
			c.close()
			return
		}
		if c.up.shut != c.down.shut && c.timer == nil {
			c.armHalfClose()
		}
		if !moved {
			return
		}
	}
	if !c.queued {
		c.queued = true
		c.l.later = append(c.l.later, c)
	}
}

// armHalfClose starts the half-close timer once one direction has ended
// (the connect timer is long gone by then, so c.timer is free): the other
// direction gets Options.HalfCloseTimeout to move a byte, each time.
func (c *tcpConn) armHalfClose() {
	c.halfMark = c.up.bytes + c.down.bytes
	c.timer = c.l.arm(&c.dl, c.l.e.opts.HalfCloseTimeout)
}

// expire is c's timer: the connect timeout while it connects (connecting
// ends only with the timer cancelled), else the half-close timeout.
func (c *tcpConn) expire() {
	c.timer = nil
	switch {
	case c.closed:
	case c.connecting:
		c.connectFailed()
	case c.up.bytes+c.down.bytes != c.halfMark:
		c.armHalfClose()
	default:
		c.abort()
	}
}

// step advances one direction. It returns whether anything happened, and
// false in ok when the connection must be reset.
func (c *tcpConn) step(p *pipe) (moved, ok bool) {
	if p.spliced {
		moved, ok = c.spliceStep(p)
	} else {
		moved, ok = c.copyStep(p)
	}
	if !ok {
		return moved, false
	}
	// Pass a FIN on once everything before it has been written. When the
	// other direction has already ended, the connection closes next, and
	// close sends this FIN (both sources are at EOF, so no unread byte can
	// turn it into an RST): no shutdown call (one per connection, issue 12).
	if p.eof && !p.pending() && !p.shut {
		if other := c.otherWay(p); !other.shut {
			if err := shutWrite(p.dst.fd); err != nil && err != unix.ENOTCONN {
				return moved, false
			}
		}
		p.shut = true
		moved = true
	}
	return moved, true
}

// otherWay is the direction opposite p.
func (c *tcpConn) otherWay(p *pipe) *pipe {
	if p == &c.up {
		return &c.down
	}
	return &c.up
}

// copyStep moves bytes through a user-space buffer. With the loop's ring
// (ioRing), the recv or send is queued for the end of the turn, where one
// io_uring_enter makes all the turn's; its completion (finishIO) applies
// the result as a direct call would and steps the connection again.
func (c *tcpConn) copyStep(p *pipe) (moved, ok bool) {
	if p.io != ioNone { // queued on the ring: its completion steps p
		return false, true
	}
	// Flush what is waiting.
	if p.r < p.w && p.dst.writable {
		if c.l.queueSend(c, p) {
			return moved, true
		}
		n, err := sockSend(p.dst.fd, p.buf[p.r:p.w])
		if moved, ok = c.sent(p, n, err); !ok {
			return false, false
		}
	}
	if p.buf != nil && p.r == p.w {
		c.l.putBuf(p.buf)
		p.buf, p.r, p.w = nil, 0, 0
		if p.bulk {
			// A drained bulk direction switches to splice(2); its pipe is
			// taken when src has bytes (spliceStep).
			p.spliced = true
			return true, true
		}
	}
	// Read only when the buffer is empty: a slow dst pauses src.
	if p.buf == nil && !p.eof && p.src.readable {
		buf := c.l.getBuf()
		if c.l.queueRecv(c, p, buf) {
			return moved, true
		}
		n, err := sockRecv(p.src.fd, buf)
		m, ok := c.received(p, buf, n, err)
		return moved || m, ok
	}
	return moved, true
}

// sent applies a send of p's pending bytes that returned n, err.
func (c *tcpConn) sent(p *pipe, n int, err error) (moved, ok bool) {
	switch {
	case errAgain(err):
		p.dst.writable = false
	case err != nil:
		return false, false
	default:
		want := p.w - p.r
		p.r += n
		p.bytes += uint64(n)
		moved = true
		// A short write means the socket buffer is full: wait for
		// EPOLLOUT rather than try again for EAGAIN.
		if n < want {
			p.dst.writable = false
		}
	}
	return moved, true
}

// received applies a recv into buf, which p's buffer was empty for, that
// returned n, err. buf becomes p's buffer, or goes back to the loop.
func (c *tcpConn) received(p *pipe, buf []byte, n int, err error) (moved, ok bool) {
	switch {
	case errAgain(err):
		p.src.readable = false
		c.l.putBuf(buf)
	case err != nil:
		c.l.putBuf(buf)
		return false, false
	case n == 0:
		p.eof = true
		c.l.putBuf(buf)
		moved = true
	default:
		p.buf, p.r, p.w = buf, 0, n
		p.bulk = n == len(buf)
		moved = true
		// A short read on a stream socket has drained it (epoll(7)):
		// the next bytes bring a new edge, so no read is spent on
		// EAGAIN. Once the peer has shut its side no edge may follow,
		// so then reads go on until EOF.
		if !p.bulk && !p.src.hup {
			p.src.readable = false
		}
	}
	return moved, true
}

// dropPipe gives p's pipe back to the loop's pool; one with bytes left in
// it (the connection is going) is closed.
func (c *tcpConn) dropPipe(p *pipe) {
	if p.piped {
		c.l.pipes.put(p.kpipe, p.inPipe == 0)
		p.piped, p.inPipe = false, 0
	}
}

const spliceFlags = unix.SPLICE_F_NONBLOCK | unix.SPLICE_F_MOVE

// spliceStep moves bytes src -> kernel pipe -> dst. As with the buffer, src
// is read only when the pipe is empty, so a slow dst pauses src and the pipe
// bounds what one direction holds. The pipe is the direction's only while
// bytes are in flight: once src has nothing more, it goes back to the loop,
// so an idle connection holds none, and a burst takes one again (if none
// can be had, the direction goes back to copying).
func (c *tcpConn) spliceStep(p *pipe) (moved, ok bool) {
	if p.inPipe > 0 && p.dst.writable {
		n, err := unix.Splice(p.kpipe[0], nil, p.dst.fd, nil, p.inPipe, spliceFlags)
		switch {
		case errAgain(err):
			p.dst.writable = false
		case err != nil:
			return false, false
		default:
			p.inPipe -= int(n)
			p.bytes += uint64(n)
			moved = true
		}
	}
	if p.inPipe == 0 && !p.eof && p.src.readable {
		if !p.piped {
			kp, ok := c.l.pipes.get()
			if !ok {
				p.spliced, p.bulk = false, false
				m, ok := c.copyStep(p)
				return moved || m, ok
			}
			p.kpipe, p.piped = kp, true
		}
		// The pipe is empty, so EAGAIN can only mean src has nothing.
		n, err := unix.Splice(p.src.fd, nil, p.kpipe[1], nil, pipeSize, spliceFlags)
		switch {
		case errAgain(err):
			p.src.readable = false
			c.dropPipe(p)
		case err != nil:
			return moved, false
		case n == 0:
			p.eof = true
			moved = true
			c.dropPipe(p)
		default:
			p.inPipe = int(n)
			moved = true
		}
	}
	return moved, true
}

func (c *tcpConn) release() {
	for _, p := range [2]*pipe{&c.up, &c.down} {
		c.l.cancelIO(p)
		if p.buf != nil {
			c.l.putBuf(p.buf)
			p.buf = nil
		}
		c.dropPipe(p)
		p.spliced = false
	}
	c.l.e.fds.give(2) // client and backend, taken at the accept
	c.stopTimer()
	c.l.giveWalk(c)
	c.l.conns.remove(c)
	c.l.pipes.trim(2 * c.l.conns.n) // two per open connection at most
	c.l.ended = append(c.l.ended, c)
	c.t.counters().Closed(c.up.bytes, c.down.bytes)
	c.l.e.active.Done()
}

func (c *tcpConn) close() {
	if c.closed {
		return
	}
	c.closed = true
	c.l.closeFD(c.cs.fd)
	if c.bs.fd >= 0 {
		c.l.closeFD(c.bs.fd)
	}
	c.release()
}

// abort resets both sides, passing an RST on in each direction.
func (c *tcpConn) abort() {
	if c.closed {
		return
	}
	c.closed = true
	c.l.drop(c.cs.fd)
	resetClose(c.cs.fd)
	if c.bs.fd >= 0 {
		c.l.drop(c.bs.fd)
		resetClose(c.bs.fd)
	}
	c.release()
}
