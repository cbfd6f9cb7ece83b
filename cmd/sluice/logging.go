package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/sluice-proxy/sluice/config"
)

// newLogger is sluice's log as the configuration asks for it: text or
// JSON; debug lines at --v 1 and above, or from the files --vmodule
// names; one stream on stderr, or with the format's split-stream option
// (kube-proxy's --log-text-split-stream, --log-json-split-stream) error
// lines on stderr and the others on stdout. The verbosity returned sets
// --v while the log is in use.
func newLogger(cfg *config.Config, stdout, stderr io.Writer) (*slog.Logger, *logVerbosity) {
	vmodule := cfg.KubeProxy.Logging.VModule
	verbosity := &logVerbosity{}
	for _, item := range vmodule {
		verbosity.vmoduleDebug = verbosity.vmoduleDebug || item.Verbosity > 0
	}
	verbosity.set(uint32(cfg.Verbosity))
	opts := &slog.HandlerOptions{Level: &verbosity.level}
	format := func(w io.Writer) slog.Handler {
		if cfg.LogFormat == "json" {
			return slog.NewJSONHandler(w, opts)
		}
		return slog.NewTextHandler(w, opts)
	}
	split := cfg.KubeProxy.Logging.Options.Text.SplitStream
	if cfg.LogFormat == "json" {
		split = cfg.KubeProxy.Logging.Options.JSON.SplitStream
	}
	var h slog.Handler
	if split {
		h = streamSplit{others: format(stdout), errors: format(stderr)}
	} else {
		h = format(stderr)
	}
	if len(vmodule) > 0 {
		h = &fileVerbosity{inner: h, rules: vmodule, byPC: &sync.Map{}, verbosity: verbosity}
	}
	return slog.New(h), verbosity
}

// logVerbosity is the log's --v: set at start-up, and while running by a
// PUT of /debug/flags/v on the metrics server (with --profiling), as
// kube-proxy's. sluice's log has two levels: debug lines pass at 1 and
// above.
type logVerbosity struct {
	v            atomic.Uint32
	level        slog.LevelVar // the handlers' threshold
	vmoduleDebug bool          // a --vmodule rule passes some debug lines at any --v
}

func (lv *logVerbosity) set(v uint32) {
	lv.v.Store(v)
	if v > 0 || lv.vmoduleDebug {
		lv.level.Set(slog.LevelDebug)
	} else {
		lv.level.Set(slog.LevelInfo)
	}
}

// Set sets --v from a /debug/flags/v request's body, and answers as
// kube-proxy's setter (component-base's logs.GlogSetter) does.
func (lv *logVerbosity) Set(val string) (string, error) {
	v, err := strconv.ParseUint(val, 10, 32)
	if err != nil {
		return "", err
	}
	lv.set(uint32(v))
	return fmt.Sprintf("successfully set klog.logging.verbosity to %s", val), nil
}

// streamSplit writes error lines to one handler and the others to another.
type streamSplit struct{ others, errors slog.Handler }

func (s streamSplit) pick(l slog.Level) slog.Handler {
	if l >= slog.LevelError {
		return s.errors
	}
	return s.others
}

func (s streamSplit) Enabled(ctx context.Context, l slog.Level) bool {
	return s.pick(l).Enabled(ctx, l)
}

func (s streamSplit) Handle(ctx context.Context, r slog.Record) error {
	return s.pick(r.Level).Handle(ctx, r)
}

func (s streamSplit) WithAttrs(as []slog.Attr) slog.Handler {
	return streamSplit{s.others.WithAttrs(as), s.errors.WithAttrs(as)}
}

func (s streamSplit) WithGroup(name string) slog.Handler {
	return streamSplit{s.others.WithGroup(name), s.errors.WithGroup(name)}
}

// fileVerbosity passes the debug lines of the source files a --vmodule
// rule gives a verbosity of 1 or more, and drops the other debug lines
// while --v is 0 (at 1 and above every debug line passes). As klog's vmodule: a
// file's name without its directory and .go is matched against each
// rule's glob pattern in turn, and the first that matches gives its
// verbosity. Each call site's answer is kept, so a file is matched once.
type fileVerbosity struct {
	inner     slog.Handler
	rules     logsapi.VModuleConfiguration
	byPC      *sync.Map // program counter -> bool: its debug lines pass
	verbosity *logVerbosity
}

func (f *fileVerbosity) Enabled(ctx context.Context, l slog.Level) bool {
	return f.inner.Enabled(ctx, l)
}

func (f *fileVerbosity) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo && f.verbosity.v.Load() < 1 && !f.debugAt(r.PC) {
		return nil
	}
	return f.inner.Handle(ctx, r)
}

// debugAt says whether the debug lines logged at pc pass.
func (f *fileVerbosity) debugAt(pc uintptr) bool {
	if pc == 0 {
		return false
	}
	if v, ok := f.byPC.Load(pc); ok {
		return v.(bool)
	}
	frame, _ := runtime.CallersFrames([]uintptr{pc}).Next()
	name := strings.TrimSuffix(filepath.Base(frame.File), ".go")
	pass := false
	for _, rule := range f.rules {
		if ok, _ := filepath.Match(rule.FilePattern, name); ok {
			pass = rule.Verbosity > 0
			break
		}
	}
	f.byPC.Store(pc, pass)
	return pass
}

func (f *fileVerbosity) WithAttrs(as []slog.Attr) slog.Handler {
	return &fileVerbosity{inner: f.inner.WithAttrs(as), rules: f.rules, byPC: f.byPC, verbosity: f.verbosity}
}

func (f *fileVerbosity) WithGroup(name string) slog.Handler {
	return &fileVerbosity{inner: f.inner.WithGroup(name), rules: f.rules, byPC: f.byPC, verbosity: f.verbosity}
}
