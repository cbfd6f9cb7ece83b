package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	load()
	if cache.reads != 4 {
		t.Fatalf("second load read %d files, want only the List file again", cache.reads-3)
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
		if s.Name == "b" && s.Spec.ClusterIP != "10.96.0.9" {
			t.Fatalf("an edit keeping size and mtime was missed: %s", s.Spec.ClusterIP)
		}
	}
	// A save by rename: a new inode.
	os.WriteFile(b+".tmp", []byte(svc("b", "10.96.0.8")), 0o644)
	os.Rename(b+".tmp", b)
	later = time.Now().Add(2 * time.Second)
	objs = load()
	for _, s := range objs.Services {
		if s.Name == "b" && s.Spec.ClusterIP != "10.96.0.8" {
			t.Fatalf("a save by rename was missed: %s", s.Spec.ClusterIP)
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
