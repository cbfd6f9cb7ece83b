package controlplane

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/lb"
)

// A rejected load names each problem's place as file:line:column, the
// field's own (the key, or the list item for a conflict about a named
// port), counted in the file, not the document: block and flow style, a
// document after others, an index by position and by port name.
func TestManifestErrorsGiveFileLineColumn(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "svc.yaml")
	text := `apiVersion: v1
kind: Service
metadata: {name: a, namespace: d}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, nodePort: 30080}]
---
# the second document
apiVersion: v1
kind: Service
metadata: {name: b, namespace: d}
spec:
  clusterIP: 10.96.0.11
  ports:
  - name: http
    port: 80
    protocl: TCP
`
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	src := &ManifestSource{Path: dir, Sink: &recordingSink{snaps: make(chan *lb.Snapshot, 1), rejects: make(chan error, 1)}}
	err := src.Load()
	if want := file + ":18:5: Service d/b: spec.ports[0].protocl: unknown field"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want %q in it", err, want)
	}

	// Fixed, the second Service now reuses the first one's NodePort: the
	// validation's path names the port by name.
	text = strings.Replace(text, "    protocl: TCP\n", "    nodePort: 30080\n", 1)
	text = strings.Replace(text, "  clusterIP: 10.96.0.11\n", "  clusterIP: 10.96.0.11\n  type: NodePort\n", 1)
	os.WriteFile(file, []byte(text), 0o644)
	err = src.Load()
	if want := file + ":19:5: Service d/b: spec.ports[http].nodePort: 30080/TCP is already Service d/a's"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want %q in it", err, want)
	}
}

// fieldPosition gives the deepest part of a path the document has (the
// parent of a field that is not there), and nothing for a document or
// file that is not there.
func TestFieldPosition(t *testing.T) {
	data := []byte("a: 1\n---\nspec:\n  ports:\n  - {name: x, port: 1}\n  - name: y\n    port: 2\n")
	for _, tc := range []struct {
		doc       int
		field     string
		line, col int
		ok        bool
	}{
		{2, "spec.ports[1].port", 7, 5, true},
		{2, "spec.ports[x].port", 5, 15, true},
		{2, "spec.ports[0].name", 5, 6, true},
		{2, "spec.ports[5].port", 4, 3, true}, // no 6th port: the list's key
		{2, "spec.missing", 3, 1, true},
		{1, "a", 1, 1, true},
		{3, "a", 0, 0, false},
	} {
		line, col, ok := fieldPosition(data, tc.doc, tc.field)
		if line != tc.line || col != tc.col || ok != tc.ok {
			t.Errorf("doc %d %s: %d:%d %v, want %d:%d %v", tc.doc, tc.field, line, col, ok, tc.line, tc.col, tc.ok)
		}
	}
}

// Objects of kinds sluice does not read (an application's Deployment
// beside its Service) are skipped with one warning per kind, naming where
// the first is and how many there are; a reload that still has them does
// not warn again; a kind that goes and comes back does.
func TestSkippedKindsWarnedOncePerKind(t *testing.T) {
	dir := t.TempDir()
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: d}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n"
	deploy := "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api}\n"
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
	os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(svc+deploy), 0o644)
	os.WriteFile(filepath.Join(dir, "cm.yaml"), []byte(cm), 0o644)
	var logs bytes.Buffer
	sink := &recordingSink{snaps: make(chan *lb.Snapshot, 4), rejects: make(chan error, 4)}
	src := &ManifestSource{Path: dir, Sink: sink, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	warnings := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "level=WARN") {
				out = append(out, l)
			}
		}
		logs.Reset()
		return out
	}
	w := warnings()
	if len(w) != 2 || !strings.Contains(w[0], "kind=apps/v1/Deployment count=2 first="+filepath.Join(dir, "app.yaml")+"#2") ||
		!strings.Contains(w[1], "kind=v1/ConfigMap count=1") {
		t.Fatalf("warnings:\n%s", strings.Join(w, "\n"))
	}
	src.Reload()
	if w := warnings(); len(w) != 0 {
		t.Fatalf("a reload warned again:\n%s", strings.Join(w, "\n"))
	}
	os.Remove(filepath.Join(dir, "cm.yaml"))
	src.Reload()
	os.WriteFile(filepath.Join(dir, "cm.yaml"), []byte(cm), 0o644)
	src.Reload()
	if w := warnings(); len(w) != 1 || !strings.Contains(w[0], "kind=v1/ConfigMap") {
		t.Fatalf("a kind that came back:\n%s", strings.Join(w, "\n"))
	}
}

// A cache hit needs both of the text's hashes: an entry under the same
// first hash for other text (a collision of 64 bits) is a miss, not a
// wrong object.
func TestDocCacheHitsOnBothHashes(t *testing.T) {
	var c DocCache
	c.begin()
	c.end()
	c.begin()
	a, b := []byte("kind: Service\nmetadata: {name: a}\n"), []byte("kind: Service\nmetadata: {name: b}\n")
	ka, kb := c.key(a), c.key(b)
	if ka == kb || ka[0] == ka[1] {
		t.Fatalf("keys %x and %x: the seeds are not two", ka, kb)
	}
	if e := c.lookup(ka); e != nil {
		t.Fatal("hit in an empty cache")
	}
	c.docs[docKey{ka[0], kb[1]}] = &docEntry{cachedDoc: cachedDoc{id: "Service default/b"}} // b's decoding under a's first hash
	if e := c.lookup(ka); e != nil {
		t.Fatal("a collision of the first hash was taken for a hit")
	}
	c.docs[ka] = &docEntry{cachedDoc: cachedDoc{id: "Service default/a"}}
	if e := c.lookup(ka); e == nil || e.id != "Service default/a" || e.gen != c.gen {
		t.Fatalf("a real hit missed or was not stamped: %+v", e)
	}
	if c.key(bytes.Clone(a)) != ka {
		t.Fatal("the same text keyed twice differently")
	}
}

// The cache keeps nothing that points into the file's buffer, which the
// next read overwrites: a document decoded, its buffer overwritten, is
// still what it said when a reload finds its text again.
func TestDocCacheDoesNotPinTheFileBuffer(t *testing.T) {
	text := "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80}]\n"
	data := []byte(text)
	var c DocCache
	c.begin()
	objs := &Objects{origin: &c.origins, gen: c.gen}
	if errs := objs.decode("f.yaml", data, &c); len(errs) > 0 {
		t.Fatal(errs)
	}
	c.end()
	for i := range data {
		data[i] = 'x'
	}
	c.begin()
	again := &Objects{origin: &c.origins, gen: c.gen}
	if errs := again.decode("f.yaml", []byte(text), &c); len(errs) > 0 {
		t.Fatal(errs)
	}
	c.end()
	if again.decoded != 0 {
		t.Fatalf("decoded %d bytes again, want a hit", again.decoded)
	}
	if len(again.Services) != 1 || again.Services[0].Name != "a" || again.Services[0].Namespace != "x" || clusterIPOf(again.Services[0]) != "10.96.0.1" {
		t.Fatalf("the cached Service changed with the buffer: %+v", again.Services)
	}
}

// clusterIPOf is the first ClusterIP of a Service's first port ("" when
// it has none).
func clusterIPOf(s *Service) string {
	if len(s.ports) == 0 || len(s.ports[0].ClusterIPs) == 0 {
		return ""
	}
	return s.ports[0].ClusterIPs[0].String()
}
