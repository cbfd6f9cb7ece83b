package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A CPU limit changed while sluice runs (an in-place pod resize) is said
// once per change: a warning when a restart would run another number of
// event loops, a note when the loops still fit; a read that fails or
// finds the same limit says nothing.
func TestCPULimitWatchSaysWhenTheLimitChanged(t *testing.T) {
	var logs strings.Builder
	limit, readErr := 2.0, error(nil)
	w := &cpuLimitWatch{read: func() (float64, error) { return limit, readErr }, cpus: 4, loops: 2, limit: 2,
		log: slog.New(slog.NewTextHandler(&logs, nil))}
	said := func() string { s := logs.String(); logs.Reset(); return s }

	w.check()
	if s := said(); s != "" {
		t.Fatalf("the limit unchanged: %q", s)
	}
	limit = 0.5 // resized down: two loops under half a CPU
	w.check()
	if s := said(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "restartLoops=1") || !strings.Contains(s, "from=2 to=0.5 loops=2") {
		t.Fatalf("resized to half a CPU: %q", s)
	}
	w.check()
	if s := said(); s != "" {
		t.Fatalf("the same change said twice: %q", s)
	}
	limit, readErr = 0, errors.New("cpu.max: permission denied")
	w.check()
	if s := said(); s != "" {
		t.Fatalf("a failed read: %q", s)
	}
	limit, readErr = 1.5, nil // two loops fit 1.5 CPUs
	w.check()
	if s := said(); !strings.Contains(s, "level=INFO") || !strings.Contains(s, "still fit") {
		t.Fatalf("resized to 1.5 CPUs: %q", s)
	}
	limit = 0 // the limit lifted: a restart would run one loop per CPU
	w.check()
	if s := said(); !strings.Contains(s, "restartLoops=4") {
		t.Fatalf("the limit lifted: %q", s)
	}

	// run checks at each tick, one after the other, until its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	tick, done := make(chan time.Time), make(chan struct{})
	go func() { w.run(ctx, tick); close(done) }()
	limit = 3
	tick <- time.Time{}
	tick <- time.Time{} // taken once the first check is over
	cancel()
	<-done
	if s := said(); strings.Count(s, "restartLoops=3") != 1 {
		t.Fatalf("two ticks after a change to 3 CPUs: %q", s)
	}
}
