package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

var webHTTP = lb.ServicePortName{Namespace: "demo", Name: "web", Port: "http", Protocol: lb.TCP}

// runSource loads and runs src until the test ends. It returns once Run
// watches: Run re-reads once its watch is set up, which changes nothing.
func runSource(t *testing.T, src *ManifestSource, sink *unchangedSink) {
	t.Helper()
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-sink.unchanged
}

func newUnchangedSink() *unchangedSink {
	return &unchangedSink{recordingSink{snaps: make(chan *lb.Snapshot, 64), rejects: make(chan error, 64)}, make(chan struct{}, 64)}
}

// waitNodePort waits for a published snapshot in which web's http port has
// nodePort np; rejections are reported, and a bound keeps a lost event
// from hanging the test.
func waitNodePort(t *testing.T, sink *recordingSink, np int32) {
	t.Helper()
	bound := time.After(20 * time.Second)
	for {
		select {
		case s := <-sink.snaps:
			if sp := s.Ports.Get(webHTTP); sp != nil && int32(sp.NodePort) == np {
				return
			}
		case err := <-sink.rejects:
			t.Logf("rejected on the way: %v", err)
		case <-bound:
			t.Fatalf("no snapshot with nodePort %d: the change was not noticed", np)
		}
	}
}

func withNodePort(np string) string { return strings.Replace(goodManifest, "30080", np, 1) }

// A ConfigMap mounted in a pod: svc.yaml -> ..data/svc.yaml, ..data ->
// ..<timestamp>; kubelet updates it by swapping ..data atomically.
func TestManifestsFromAConfigMapMount(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "svc.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_01", withNodePort("30080"))
	if err := os.Symlink("..data/svc.yaml", filepath.Join(dir, "svc.yaml")); err != nil {
		t.Fatal(err)
	}
	current := int32(30080)
	for i, path := range []string{dir, filepath.Join(dir, "svc.yaml")} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			sink := newUnchangedSink()
			src := &ManifestSource{Path: path, Sink: sink, Coalesce: time.Millisecond}
			runSource(t, src, sink)
			waitNodePort(t, &sink.recordingSink, current)
			current++
			version(fmt.Sprintf("..2026_%02d", i+2), withNodePort(fmt.Sprint(current)))
			waitNodePort(t, &sink.recordingSink, current)
		})
	}
}

// A manifest directory deleted and created again is watched again.
func TestManifestDirectoryRecreatedIsWatchedAgain(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "m")
	os.Mkdir(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(withNodePort("30080")), 0o644)
	sink := newUnchangedSink()
	src := &ManifestSource{Path: dir, Sink: sink, Coalesce: time.Millisecond}
	runSource(t, src, sink)
	waitNodePort(t, &sink.recordingSink, 30080)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A file written after the directory came back must be noticed.
	tmp := filepath.Join(root, "svc.yaml")
	os.WriteFile(tmp, []byte(withNodePort("30083")), 0o644)
	if err := os.Rename(tmp, filepath.Join(dir, "svc.yaml")); err != nil {
		t.Fatal(err)
	}
	waitNodePort(t, &sink.recordingSink, 30083)
}

// unchangedSink reports reloads that changed nothing.
type unchangedSink struct {
	recordingSink
	unchanged chan struct{}
}

func (u *unchangedSink) Unchanged() { u.unchanged <- struct{}{} }

// A permission fix on an unreadable file is an event of its own (chmod,
// nothing written), and must cause a reload. As root any mode is readable,
// so the test checks the reload itself: a chmod alone is followed by one.
func TestManifestChmodCausesAReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	os.WriteFile(file, []byte(withNodePort("30080")), 0o644)
	sink := newUnchangedSink()
	src := &ManifestSource{Path: dir, Sink: sink, Coalesce: time.Millisecond}
	runSource(t, src, sink)
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sink.unchanged:
	case <-time.After(20 * time.Second):
		t.Fatal("a chmod caused no reload")
	}
}

// timedUnchangedSink also takes UpdateTimes.
type timedUnchangedSink struct {
	*unchangedSink
	times chan UpdateTimes
}

func (s timedUnchangedSink) PublishTimed(snap *lb.Snapshot, t UpdateTimes) {
	s.times <- t
	s.Publish(snap)
}

// An edit's reload is published with when the reload began (after the
// coalescing wait), by the source's clock, for sluice_update_apply_seconds.
func TestManifestEditIsTimed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	os.WriteFile(file, []byte(withNodePort("30080")), 0o644)
	sink := timedUnchangedSink{newUnchangedSink(), make(chan UpdateTimes, 8)}
	at := time.Unix(1700000000, 0)
	src := &ManifestSource{Path: dir, Sink: sink, Coalesce: time.Millisecond, Now: func() time.Time { return at }}
	runSource(t, src, sink.unchangedSink)
	os.WriteFile(file, []byte(withNodePort("30081")), 0o644)
	waitNodePort(t, &sink.recordingSink, 30081)
	if ts := <-sink.times; len(ts.Arrived) != 1 || !ts.Arrived[0].Equal(at) || len(ts.Triggers) != 0 {
		t.Fatalf("times %+v, want one arrival at %v", ts, at)
	}
}

// An event for a name that is no manifest file (an editor's swap file, the
// temporary file a tool writes and renames over a manifest) calls for no
// reload while no manifest file is a symbolic link: nothing read can have
// changed, and at 10k Services that reload was a replay of every document,
// often still under way when the rename's event came. Once a manifest file
// is a link (a ConfigMap's, through ..data), such events call for one.
func TestATemporaryFileCallsForNoReload(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(withNodePort("30080")), 0o644)
	sink := newUnchangedSink()
	src := &ManifestSource{Path: dir, Sink: sink}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	src.setWatching(true)
	for _, name := range []string{"svc.yaml.tmp", ".svc.yaml.swp", "..data", "README"} {
		if src.touch(filepath.Join(dir, name)) || src.touchListing(filepath.Join(dir, name)) {
			t.Fatalf("an event for %s calls for a reload with no linked manifest", name)
		}
	}
	if !src.touch(filepath.Join(dir, "svc.yaml")) || !src.touchListing(filepath.Join(dir, "new.yml")) {
		t.Fatal("an event for a manifest file calls for no reload")
	}

	os.MkdirAll(filepath.Join(dir, "..2026_01"), 0o755)
	os.WriteFile(filepath.Join(dir, "..2026_01", "linked.yaml"), []byte(strings.ReplaceAll(withNodePort("30081"), "name: web", "name: web2")), 0o644)
	os.Symlink("..2026_01", filepath.Join(dir, "..data"))
	os.Symlink("..data/linked.yaml", filepath.Join(dir, "linked.yaml"))
	src.touchListing(filepath.Join(dir, "linked.yaml"))
	src.reload(UpdateTimes{})
	if !src.touch(filepath.Join(dir, "..data")) {
		t.Fatal("with a linked manifest, an event for ..data calls for no reload")
	}
}
