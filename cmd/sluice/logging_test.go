package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/config"
)

func parsed(t *testing.T, args ...string) *config.Config {
	t.Helper()
	cfg, _, err := config.Parse(args)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// With a split-stream option, error lines go to stderr and the others to
// stdout, in either format; without one, everything goes to stderr.
func TestSplitStreamPutsErrorsOnStderr(t *testing.T) {
	for _, args := range [][]string{
		{"--log-text-split-stream", "--feature-gates=LoggingAlphaOptions=true"},
		{"--log-json-split-stream", "--logging-format=json", "--feature-gates=LoggingAlphaOptions=true"},
		{},
	} {
		var stdout, stderr bytes.Buffer
		log, _ := newLogger(parsed(t, args...), &stdout, &stderr)
		log = log.With("node", "n1")
		log.Info("an info line")
		log.Warn("a warning")
		log.Error("an error line")
		split := len(args) > 0
		out, errs := stdout.String(), stderr.String()
		if split && (!strings.Contains(out, "an info line") || !strings.Contains(out, "a warning") || strings.Contains(out, "an error line") ||
			!strings.Contains(errs, "an error line") || strings.Contains(errs, "an info line")) {
			t.Fatalf("%v: stdout %q, stderr %q", args, out, errs)
		}
		if !split && (out != "" || strings.Count(errs, "\n") != 3) {
			t.Fatalf("one stream: stdout %q, stderr %q", out, errs)
		}
		if !strings.Contains(errs, "n1") {
			t.Fatalf("%v: the logger's attributes are lost: %q", args, errs)
		}
	}
}

// logDebugHere logs one debug line from this file (logging_test.go).
func logDebugHere(log *slog.Logger) { log.Debug("debug from logging_test") }

// --vmodule passes the debug lines of the files it names, by klog's rules
// (the file's name without .go, glob patterns, the first match decides),
// and no others; --v 1 passes them all.
func TestVModulePassesTheDebugLinesOfTheFilesItNames(t *testing.T) {
	for _, c := range []struct {
		args []string
		pass bool
	}{
		{[]string{"--vmodule=logging_test=1"}, true},
		{[]string{"--vmodule=logging_t*=3"}, true},
		{[]string{"--vmodule=logging_test.go=1"}, false}, // klog drops .go before matching
		{[]string{"--vmodule=main=2"}, false},
		{[]string{"--vmodule=logging_test=0,logging*=2"}, false}, // the first match decides
		{[]string{"--vmodule=main=0", "--v=1"}, true},            // --v passes every file
		{[]string{}, false},
	} {
		var stdout, stderr bytes.Buffer
		log, _ := newLogger(parsed(t, c.args...), &stdout, &stderr)
		log = log.WithGroup("g")
		logDebugHere(log)
		log.Info("an info line") // never filtered
		if got := strings.Contains(stderr.String(), "debug from logging_test"); got != c.pass || !strings.Contains(stderr.String(), "an info line") {
			t.Fatalf("%v: passed %v, want %v: %q", c.args, got, c.pass, stderr.String())
		}
	}
	// A record with no call site (logged through a handler directly) has
	// no file, and passes only with --v.
	var stdout, stderr bytes.Buffer
	log, _ := newLogger(parsed(t, "--vmodule=*=4"), &stdout, &stderr)
	h := log.Handler()
	h.Handle(context.Background(), slog.NewRecord(time.Now(), slog.LevelDebug, "no call site", 0))
	if stderr.Len() != 0 {
		t.Fatalf("a debug record without a call site passed: %q", stderr.String())
	}
}

// --v set while running (kube-proxy's PUT /debug/flags/v) turns the debug
// lines on and off, with or without --vmodule, and refuses what
// kube-proxy's setter refuses.
func TestVerbositySetWhileRunning(t *testing.T) {
	for _, args := range [][]string{{}, {"--vmodule=main=2"}, {"--logging-format=json"}} {
		var stdout, stderr bytes.Buffer
		log, verbosity := newLogger(parsed(t, args...), &stdout, &stderr)
		debugPassed := func() bool {
			stderr.Reset()
			logDebugHere(log)
			return strings.Contains(stderr.String(), "debug from logging_test")
		}
		if debugPassed() {
			t.Fatalf("%v: a debug line at --v 0", args)
		}
		if answer, err := verbosity.Set("4"); err != nil || answer != "successfully set klog.logging.verbosity to 4" {
			t.Fatalf("%v: Set(4): %q, %v", args, answer, err)
		}
		if !debugPassed() {
			t.Fatalf("%v: no debug line at --v 4", args)
		}
		for _, bad := range []string{"", "-1", "x", "4294967296"} {
			if _, err := verbosity.Set(bad); err == nil {
				t.Errorf("%v: Set(%q) taken", args, bad)
			}
		}
		if !debugPassed() {
			t.Fatalf("%v: a refused value changed --v", args)
		}
		verbosity.Set("0")
		if debugPassed() {
			t.Fatalf("%v: a debug line after --v went back to 0", args)
		}
	}
}
