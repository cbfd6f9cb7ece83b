package controlplane

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/lb"
)

// A file whose identity (inode, size, times) has not changed since it was
// read, well after its last change, is not read again: what it gave is
// replayed, skipped kinds and all. An edit that keeps the size and puts
// the modification time back is still seen (the change time moves), as
// is a save by rename; a List file is always read (its items are not
// remembered one by one).
func TestUnchangedFilesAreNotReadAgain(t *testing.T) {
	dir := t.TempDir()
	svc := func(name, ip string) string {
		return "apiVersion: v1\nkind: Service\nmetadata: {name: " + name + ", namespace: x}\nspec:\n  clusterIP: " + ip + "\n  ports: [{port: 80}]\n"
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", svc("a", "10.96.0.1")+"---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n")
	write("b.yaml", svc("b", "10.96.0.2"))
	write("list.yaml", "apiVersion: v1\nkind: List\nitems:\n- "+strings.ReplaceAll(svc("c", "10.96.0.3"), "\n", "\n  ")+"\n")
	later := time.Now().Add(2 * time.Second) // reads happen "later" than the writes, past the racy window
	var cache DocCache
	cache.now = func() time.Time { return later }
	load := func() *Objects {
		t.Helper()
		objs, _, err := loadManifests(dir, &cache, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs.Services) != 3 || objs.SkippedKinds()["apps/v1/Deployment"].Count != 1 {
			t.Fatalf("services %d skipped %v", len(objs.Services), objs.SkippedKinds())
		}
		return objs
	}
	load()
	if cache.reads != 3 {
		t.Fatalf("first load read %d files", cache.reads)
	}
	replayed := load()
	if cache.reads != 4 {
		t.Fatalf("second load read %d files, want only the List file again", cache.reads-3)
	}
	// What a replayed file gave is still named by its place.
	if got, want := replayed.Origin("Service x/a"), filepath.Join(dir, "a.yaml")+"#1"; got != want {
		t.Fatalf("a replayed Service's origin is %q, want %q", got, want)
	}

	// The same size, the modification time put back: the change time
	// moved, so it is read.
	b := filepath.Join(dir, "b.yaml")
	fi, _ := os.Stat(b)
	write("b.yaml", svc("b", "10.96.0.9"))
	os.Chtimes(b, fi.ModTime(), fi.ModTime())
	later = time.Now().Add(2 * time.Second)
	objs := load()
	for _, s := range objs.Services {
		if s.Name == "b" && clusterIPOf(s) != "10.96.0.9" {
			t.Fatalf("an edit keeping size and mtime was missed: %s", clusterIPOf(s))
		}
	}
	// A save by rename: a new inode.
	os.WriteFile(b+".tmp", []byte(svc("b", "10.96.0.8")), 0o644)
	os.Rename(b+".tmp", b)
	later = time.Now().Add(2 * time.Second)
	objs = load()
	for _, s := range objs.Services {
		if s.Name == "b" && clusterIPOf(s) != "10.96.0.8" {
			t.Fatalf("a save by rename was missed: %s", clusterIPOf(s))
		}
	}
}

// A file last changed within the racy window before it was read is read
// again next time even though its identity is unchanged: a change in the
// same clock tick as the read might not have shown in its times.
func TestRacilyReadFileIsReadAgain(t *testing.T) {
	id := fileID{ino: 1, size: 10, changed: time.Unix(100, 0)}
	st := &fileState{id: id, readAt: time.Unix(100, 0).Add(racyWindow / 2)}
	if st.unchanged(id) {
		t.Fatal("a file read within the racy window of its change was trusted")
	}
	st.readAt = time.Unix(100, 0).Add(2 * racyWindow)
	if !st.unchanged(id) {
		t.Fatal("a file read well after its change was not trusted")
	}
	other := id
	other.ctime++
	if st.unchanged(other) {
		t.Fatal("a new change time was not seen")
	}
}

// watchedService is Service s<i> in namespace x, on port.
func watchedService(i, port int) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: x}\nspec:\n  clusterIP: 10.96.0.%d\n  ports: [{port: %d}]\n", i, i+1, port)
}

// With the watch running, an edit to one file of a directory is a reload
// that stats and reads that file alone: the others had no event since
// they were read (at 10k files a stat each was most of a reload). A
// Reload (the resync) still looks at every file, and an event for a name
// that is no manifest file (a ConfigMap's ..data swap) makes the next
// reload look at every file too.
func TestAWatchedEditStatsOnlyTheEditedFile(t *testing.T) {
	dir := t.TempDir()
	const n = 30
	for i := 0; i < n; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%02d.yaml", i)), []byte(watchedService(i, 80)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sink := newUnchangedSink()
	// Reads happen "later" than the writes, past the racy window, so
	// that only the watch decides what is looked at.
	src := &ManifestSource{Path: dir, Sink: sink, Coalesce: time.Millisecond, Now: func() time.Time { return time.Now().Add(2 * time.Second) }}
	runSource(t, src, sink)
	port := func(s *lb.Snapshot, i int) uint16 {
		if sp := s.Ports.Get(lb.ServicePortName{Namespace: "x", Name: fmt.Sprintf("s%d", i), Protocol: lb.TCP}); sp != nil {
			return sp.Port
		}
		return 0
	}
	// The counters as the last load left them: read after its publication
	// (or the Unchanged runSource waited for), which orders them.
	stats, reads, listings, patched := src.cache.stats, src.cache.reads, src.cache.listings, src.cache.patched
	elsewhere := t.TempDir()
	edit := func(i, p int, how string) {
		t.Helper()
		inPlace := how == "in place"
		switch how {
		case "beside":
			// An editor's save: a temporary file beside it, renamed over
			// it. The temporary name is no manifest file, and no manifest
			// file here is a symbolic link, so only s%02d is looked at.
			tmp := filepath.Join(dir, fmt.Sprintf("s%02d.yaml.tmp", i))
			if err := os.WriteFile(tmp, []byte(watchedService(i, p)), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("s%02d.yaml", i))); err != nil {
				t.Fatal(err)
			}
		case "in place":
			// Rewritten where it is, the same length in one write (one
			// event: a truncation would bring a reload of an empty file):
			// the directory's names stay as they were, so it is not
			// listed again.
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("s%02d.yaml", i)), os.O_WRONLY, 0)
			if err == nil {
				_, err = f.WriteString(watchedService(i, p))
				f.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
		default:
			// Written elsewhere and renamed in: one event, so one reload.
			tmp := filepath.Join(elsewhere, "new.yaml")
			if err := os.WriteFile(tmp, []byte(watchedService(i, p)), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("s%02d.yaml", i))); err != nil {
				t.Fatal(err)
			}
		}
		for {
			select {
			case s := <-sink.snaps:
				if port(s, i) != uint16(p) {
					continue // an earlier write's reload
				}
				st, rd, ls, pt := src.cache.stats-stats, src.cache.reads-reads, src.cache.listings-listings, src.cache.patched-patched
				if st != 1 || rd != 1 {
					t.Fatalf("editing s%02d: %d files stat'ed and %d read, want 1 and 1", i, st, rd)
				}
				// Never listed again: an edit in place keeps the names,
				// and a rename is patched into the last listing by name.
				if ls != 0 {
					t.Fatalf("editing s%02d (%s): the directory was listed %d times, want none", i, how, ls)
				}
				if inPlace && pt != 0 || !inPlace && pt < 1 {
					t.Fatalf("editing s%02d (%s): %d names patched into the listing", i, how, pt)
				}
				stats, reads, listings, patched = src.cache.stats, src.cache.reads, src.cache.listings, src.cache.patched
				return
			case err := <-sink.rejects:
				t.Fatal(err)
			case <-time.After(20 * time.Second):
				t.Fatal("the edit was not noticed")
			}
		}
	}
	edit(7, 81, "renamed in")
	edit(19, 82, "renamed in")
	edit(11, 83, "in place")
	edit(11, 84, "in place")
	edit(5, 85, "beside")

	// What a read looks at, given the events (a source of its own, not
	// running, so nothing reads meanwhile).
	plan := &ManifestSource{Path: dir}
	plan.setWatching(true)
	plan.takeTouched()
	// The resync looks at every file.
	plan.touchAll()
	if f, _, _ := plan.readPlan(); f != nil {
		t.Fatal("after touchAll, a read would skip files")
	}
	// An editor's temporary file beside the one it saves: while no
	// manifest file is a symbolic link, only the saved file is looked at.
	plan.touch(filepath.Join(dir, "s03.yaml.swp"))
	plan.touch(filepath.Join(dir, "s03.yaml"))
	if f, _, _ := plan.readPlan(); f == nil || !f(filepath.Join(dir, "s03.yaml")) || f(filepath.Join(dir, "s04.yaml")) {
		t.Fatal("events for s03.yaml and a temporary file: the read should look at s03.yaml alone")
	}
	// Once one is a link, such a name may be what it leads through (a
	// ConfigMap's ..data): every file.
	plan.cache.symlinks = 1
	plan.touch(filepath.Join(dir, "..data"))
	if f, _, _ := plan.readPlan(); f != nil {
		t.Fatal("after an event for ..data with a symlinked manifest, a read would skip files")
	}
	if src.cache.stats != stats {
		t.Fatal("stat'ed files without a read")
	}
}

// A manifest that is a symbolic link to a file of another name in the
// same directory: an edit of that file names only it, and is still seen.
func TestAWatchedEditThroughASymlinkIsSeen(t *testing.T) {
	dir := t.TempDir()
	for i := 0; i < 3; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%02d.yaml", i)), []byte(watchedService(i, 80)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	real := filepath.Join(dir, "s09.real")
	if err := os.WriteFile(real, []byte(watchedService(9, 80)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("s09.real", filepath.Join(dir, "s09.yaml")); err != nil {
		t.Fatal(err)
	}
	sink := newUnchangedSink()
	src := &ManifestSource{Path: dir, Sink: sink, Coalesce: time.Millisecond, Now: func() time.Time { return time.Now().Add(2 * time.Second) }}
	runSource(t, src, sink)
	// In place, the same length: one event, for s09.real.
	f, err := os.OpenFile(real, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(watchedService(9, 81))
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	bound := time.After(20 * time.Second)
	for {
		select {
		case s := <-sink.snaps:
			if sp := s.Ports.Get(lb.ServicePortName{Namespace: "x", Name: "s9", Protocol: lb.TCP}); sp != nil && sp.Port == 81 {
				return
			}
		case <-sink.unchanged:
		case err := <-sink.rejects:
			t.Fatal(err)
		case <-bound:
			t.Fatal("the edit of the file a manifest links to was not seen")
		}
	}
}

// A random walk of edits in a watched directory (in place, the same size
// included; by rename; deletes; new files): after each, the source
// publishes what the files hold, so no file the watch vouched for was
// stale. Reads happen "later" than the writes, so the racy window never
// forces a read: only the events decide what is looked at.
func TestWatchedDirectoryRandomWalk(t *testing.T) {
	dir := t.TempDir()
	const files = 8
	model := map[int]int{} // file -> port; absent: no file
	path := func(i int) string { return filepath.Join(dir, fmt.Sprintf("s%d.yaml", i)) }
	for i := 0; i < files; i++ {
		model[i] = 80
		if err := os.WriteFile(path(i), []byte(watchedService(i, 80)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sink := newUnchangedSink()
	src := &ManifestSource{Path: dir, Sink: sink, Coalesce: time.Millisecond, Now: func() time.Time { return time.Now().Add(2 * time.Second) }}
	runSource(t, src, sink)
	matches := func(s *lb.Snapshot) bool {
		if s.Ports.Len() != len(model) {
			return false
		}
		for i, p := range model {
			sp := s.Ports.Get(lb.ServicePortName{Namespace: "x", Name: fmt.Sprintf("s%d", i), Protocol: lb.TCP})
			if sp == nil || int(sp.Port) != p {
				return false
			}
		}
		return true
	}
	rng := rand.New(rand.NewPCG(3, 4))
	other := func(p int) int { // another port of as many digits: the same size
		for {
			if q := 80 + rng.IntN(20); q != p {
				return q
			}
		}
	}
	for step := 0; step < 60; step++ {
		i := rng.IntN(files)
		p, exists := model[i]
		switch op := rng.IntN(5); {
		case !exists || op == 0: // written in place (a new file when absent)
			model[i] = other(p)
			if err := os.WriteFile(path(i), []byte(watchedService(i, model[i])), 0o644); err != nil {
				t.Fatal(err)
			}
		case op == 1: // saved by rename
			model[i] = other(p)
			tmp := filepath.Join(dir, ".tmp")
			if err := os.WriteFile(tmp, []byte(watchedService(i, model[i])), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path(i)); err != nil {
				t.Fatal(err)
			}
		case op == 3 && len(model) > 1: // renamed away, to a name no load reads
			delete(model, i)
			if err := os.Rename(path(i), path(i)+".bak"); err != nil {
				t.Fatal(err)
			}
		case op == 4: // a directory with a manifest's name comes or goes: nothing read changes
			d := filepath.Join(dir, "d.yaml")
			err := os.Mkdir(d, 0o755)
			if os.IsExist(err) {
				err = os.Remove(d)
			}
			if err != nil {
				t.Fatal(err)
			}
			continue
		case len(model) > 1: // deleted (never the last Service)
			delete(model, i)
			if err := os.Remove(path(i)); err != nil {
				t.Fatal(err)
			}
		default:
			continue
		}
		bound := time.After(20 * time.Second)
	wait:
		for {
			select {
			case s := <-sink.snaps:
				if matches(s) {
					break wait
				}
			case <-sink.unchanged:
			case <-sink.rejects:
				// A read that caught a file mid-write (truncated, so
				// empty) is refused; the write's later events bring
				// another.
			case <-bound:
				t.Fatalf("step %d: the source never published the files' state %v", step, model)
			}
		}
	}
}
