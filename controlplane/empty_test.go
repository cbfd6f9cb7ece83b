package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// loadedSource is a ManifestSource on dir that has loaded goodManifest
// from svc.yaml.
func loadedSource(t *testing.T) (*ManifestSource, *recordingSink, string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	if err := os.WriteFile(file, []byte(goodManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	sink := &recordingSink{snaps: make(chan *lb.Snapshot, 16), rejects: make(chan error, 16)}
	src := &ManifestSource{Path: dir, Sink: sink}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	if s := <-sink.snaps; len(s.Ports) == 0 {
		t.Fatal("the good manifest has no ports")
	}
	return src, sink, file
}

// reloadRejected reloads and returns the rejection; a publish fails.
func reloadRejected(t *testing.T, src *ManifestSource, sink *recordingSink) error {
	t.Helper()
	src.Reload()
	select {
	case err := <-sink.rejects:
		return err
	case s := <-sink.snaps:
		t.Fatalf("published %d service ports; want a rejection", len(s.Ports))
	}
	return nil
}

// A file truncated by a tool that has not written yet, or left with only
// comments, must not take every Service off the node (issue 19, item 1).
func TestEmptyManifestFileIsRejectedNotApplied(t *testing.T) {
	for name, content := range map[string]string{
		"truncated":     "",
		"blank":         "\n  \n",
		"comments only": "# managed by a tool\n---\n# nothing yet\n",
		"separators":    "---\n---\n",
	} {
		t.Run(name, func(t *testing.T) {
			src, sink, file := loadedSource(t)
			if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			err := reloadRejected(t, src, sink)
			if !errors.Is(err, ErrEmptyFile) || !strings.Contains(err.Error(), file) {
				t.Fatalf("rejection %q does not name the empty file %s", err, file)
			}
		})
	}
}

// Emptying the directory (every file deleted) is refused too, and counted
// as a rejection; an empty List says "serve nothing" on purpose.
func TestRemovingEveryServiceNeedsAnExplicitEmptyList(t *testing.T) {
	src, sink, file := loadedSource(t)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := reloadRejected(t, src, sink); !errors.Is(err, ErrWouldRemoveEveryService) {
		t.Fatalf("rejection %v, want ErrWouldRemoveEveryService", err)
	}
	// A second file with only an EndpointSlice still leaves no Service.
	other := filepath.Join(filepath.Dir(file), "eps.yaml")
	eps := "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: []\n"
	if err := os.WriteFile(other, []byte(eps), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := reloadRejected(t, src, sink); !errors.Is(err, ErrWouldRemoveEveryService) {
		t.Fatalf("rejection %v, want ErrWouldRemoveEveryService", err)
	}
	// On purpose: an empty List.
	os.Remove(other)
	if err := os.WriteFile(file, []byte("apiVersion: v1\nkind: List\nitems: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Reload()
	select {
	case s := <-sink.snaps:
		if len(s.Ports) != 0 {
			t.Fatalf("explicit empty List published %d ports", len(s.Ports))
		}
	case err := <-sink.rejects:
		t.Fatalf("explicit empty List rejected: %v", err)
	}
	// From nothing, a new Service is served again.
	if err := os.WriteFile(filepath.Join(filepath.Dir(file), "svc2.yaml"), []byte(goodManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	src.Reload()
	if s := <-sink.snaps; len(s.Ports) == 0 {
		t.Fatal("new Service not published")
	}
}

// At start-up an empty file is an error that names it, as any bad file is.
func TestEmptyManifestFileFailsStartUp(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	os.WriteFile(file, nil, 0o644)
	src := &ManifestSource{Path: dir, Sink: &recordingSink{snaps: make(chan *lb.Snapshot, 1), rejects: make(chan error, 1)}}
	if err := src.Load(); !errors.Is(err, ErrEmptyFile) || !strings.Contains(err.Error(), file) {
		t.Fatalf("Load = %v, want ErrEmptyFile naming %s", err, file)
	}
	// An empty directory is still a valid start (nothing to serve yet).
	if err := (&ManifestSource{Path: t.TempDir(), Sink: &recordingSink{snaps: make(chan *lb.Snapshot, 1)}}).Load(); err != nil {
		t.Fatalf("empty directory: %v", err)
	}
}
