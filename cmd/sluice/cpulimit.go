package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-proxy/sluice/listeners"
)

// cpuLimitWatch reads the cgroup CPU limit again now and then. The event
// loops are sized by the limit at start-up, and an in-place resize of the
// pod (Kubernetes' InPlacePodVerticalScaling, on by default since 1.33)
// changes it while sluice runs: more loops than the new limit allows make
// the loops fight over its quota (two loops under half a CPU served 0.89x
// HAProxy's keep-alive, one 1.22x), fewer leave CPUs unused. The loops are
// not resized in place (a loop's listening sockets would close, and their
// accept queues with them): the watch says, once per change, what a
// restart (hitless: see the hand-over) would run.
type cpuLimitWatch struct {
	read  func() (float64, error) // the limit in CPUs (0: none)
	cpus  int                     // the CPUs the loops may use, as at start-up
	loops int                     // the loops running
	limit float64                 // the limit last read
	log   *slog.Logger
}

// check reads the limit, and logs when it changed since the last read.
func (w *cpuLimitWatch) check() {
	limit, err := w.read()
	if err != nil || limit == w.limit {
		return
	}
	from := w.limit
	w.limit = limit
	attrs := []any{"from", from, "to", limit, "loops", w.loops}
	if want := listeners.LoopsWithin(w.cpus, limit); want != w.loops {
		w.log.Warn("the cgroup CPU limit changed (an in-place pod resize?); the event loops keep the count start-up gave them, and a restart (hitless) would run restartLoops", append(attrs, "restartLoops", want)...)
		return
	}
	w.log.Info("the cgroup CPU limit changed; the event loops still fit it", attrs...)
}

// run checks at each tick until ctx ends.
func (w *cpuLimitWatch) run(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			w.check()
		}
	}
}
