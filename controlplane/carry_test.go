package controlplane

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// A random walk of text edits over three files, each loaded through the
// cache (which carries what the last clean load found where it is again)
// and cold: every load must give the same errors, the same objects in the
// same order, the same build and the same origins, also for objects the
// load no longer holds. The edits are the ones a carried document could
// be fooled by: a document changed in place, its separator changed,
// dropped (two documents become one) or written with a comment, line ends
// rewritten, the last newline dropped, documents moved, inserted and cut,
// names that duplicate a carried document in the same file or another,
// a List, and whole files replayed from their records.
func TestCarryingLoadsMatchColdLoads(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(30, 11))
	type doc struct {
		name, port int
		sep        string // the separator line after it ("" for the last of a file: none)
		crlf, list bool
		affinity   bool // a line appended to its text: what was a whole document is now its start
		kind       int  // 0 a Service, 1 an EndpointSlice of Service s<name>, 2 v1 Endpoints
	}
	text := func(d doc) string {
		var s string
		switch {
		case d.list:
			s = fmt.Sprintf("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s%d, namespace: walk}\n  spec:\n    ports: [{name: p, port: %d}]\n", d.name, 80+d.port)
		case d.kind == 1:
			s = fmt.Sprintf("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s%d-x, namespace: walk, labels: {kubernetes.io/service-name: s%d}}\naddressType: IPv4\nports: [{name: p, port: %d}]\nendpoints: [{addresses: [\"10.1.0.%d\"]}]\n", d.name, d.name, 8080+d.port, d.name%250)
		case d.kind == 2:
			s = fmt.Sprintf("apiVersion: v1\nkind: Endpoints\nmetadata: {name: s%d, namespace: walk}\nsubsets: [{addresses: [{ip: 10.2.0.%d}], ports: [{name: p, port: %d}]}]\n", d.name, d.name%250, 8080+d.port)
		default:
			s = fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: walk}\nspec:\n  ports: [{name: p, port: %d}]\n", d.name, 80+d.port)
		}
		if d.affinity && !d.list && d.kind == 0 {
			s += "  sessionAffinity: ClientIP\n"
		}
		if d.crlf {
			s = strings.ReplaceAll(s, "\n", "\r\n")
		}
		return s
	}
	seps := []string{"---\n", "---\n", "---\n", "--- # next\n", "---   \n", "---\n---\n"}
	files := make([][]doc, 3)
	next := 0
	newDoc := func() doc {
		next++
		return doc{name: next, sep: "---\n"}
	}
	for f := range files {
		for i := 0; i < 6; i++ {
			files[f] = append(files[f], newDoc())
		}
	}
	noFinalNewline := make([]bool, len(files))
	gone := make([]bool, len(files)) // renamed away, to a name no load reads
	path := func(f int) string { return filepath.Join(dir, fmt.Sprintf("f%d.yaml", f)) }
	write := func(f int) {
		if gone[f] {
			return
		}
		var b strings.Builder
		for i, d := range files[f] {
			b.WriteString(text(d))
			if i < len(files[f])-1 || d.sep != "" {
				b.WriteString(d.sep)
			}
		}
		s := b.String()
		if noFinalNewline[f] {
			s = strings.TrimRight(s, "\r\n")
		}
		if err := os.WriteFile(path(f), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for f := range files {
		write(f)
	}
	// Reads an hour on: a file not written since the last load is taken
	// from its record, unread.
	cache := DocCache{now: func() time.Time { return time.Now().Add(time.Hour) }, sweepSlack: 4}
	var fails, cleanAfterClean, removed int
	kinds := map[bool]int{}
	lastClean := false
	for step := 0; step < 800; step++ {
		f := rng.IntN(len(files))
		ds := files[f]
		i := rng.IntN(len(ds))
		switch op := rng.IntN(17); {
		case op <= 3: // an endpoint-like edit in place: the common one
			ds[i].port = rng.IntN(5)
		case op == 4: // renamed, often to a name another document holds
			other := files[rng.IntN(len(files))]
			ds[i].name = other[rng.IntN(len(other))].name
		case op == 5: // renamed back to a name of its own
			ds[i].name = newDoc().name
		case op == 6:
			ds[i].sep = seps[rng.IntN(len(seps))]
		case op == 7: // separator dropped: two documents become one (malformed), or the file ends without one
			ds[i].sep = ""
		case op == 8:
			ds[i].crlf = !ds[i].crlf
		case op == 9:
			noFinalNewline[f] = !noFinalNewline[f]
		case op == 10 && len(ds) > 1: // moved
			d := ds[i]
			ds = slices.Delete(ds, i, i+1)
			ds = slices.Insert(ds, rng.IntN(len(ds)+1), d)
		case op == 11 && len(ds) < 12: // inserted
			ds = slices.Insert(ds, rng.IntN(len(ds)+1), newDoc())
		case op == 12 && len(ds) > 1: // cut
			ds = slices.Delete(ds, i, i+1)
		case op == 13:
			ds[i].list = !ds[i].list
		case op == 14:
			ds[i].affinity = !ds[i].affinity
		case op == 16: // another kind of object
			ds[i].kind = rng.IntN(3)
		case op == 15: // the file goes (its record must go with it) or comes back
			if gone[f] = !gone[f]; gone[f] {
				if err := os.Rename(path(f), path(f)+".away"); err != nil {
					t.Fatal(err)
				}
			}
		}
		files[f] = ds
		// Separators and duplicates are mended now and then, so that
		// most loads are clean and the next one carries.
		if rng.IntN(2) == 0 {
			seen := map[int]bool{}
			for g := range files {
				for k := range files[g] {
					d := &files[g][k]
					if d.sep == "" && k < len(files[g])-1 {
						d.sep = "---\n"
					}
					if seen[d.name] {
						d.name = newDoc().name
					}
					seen[d.name] = true
				}
				if g != f {
					write(g)
				}
			}
		}
		write(f)
		if rng.IntN(4) == 0 { // now and then a second file changes in the same load
			g := rng.IntN(len(files))
			files[g][rng.IntN(len(files[g]))].port = rng.IntN(5)
			write(g)
		}
		for g := range gone {
			if gone[g] {
				removed++
			}
		}
		got, gerr := loadCached(dir, &cache)
		want, werr := LoadManifests(dir)
		if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
			t.Fatalf("step %d: through the cache %v, cold %v", step, gerr, werr)
		}
		if werr != nil {
			fails++
			lastClean = false
			continue
		}
		if lastClean {
			cleanAfterClean++
		}
		lastClean = true
		if !reflect.DeepEqual(names(got), names(want)) {
			t.Fatalf("step %d: objects through the cache %v, cold %v", step, names(got), names(want))
		}
		a, aerr := Build(got)
		b, berr := Build(want)
		if (aerr == nil) != (berr == nil) || (aerr != nil && aerr.Error() != berr.Error()) || !reflect.DeepEqual(a, b) {
			t.Fatalf("step %d: the build through the cache differs from a cold one (%v, %v)", step, aerr, berr)
		}
		for n := 0; n <= next; n++ {
			for _, id := range []string{fmt.Sprintf("Service walk/s%d", n), fmt.Sprintf("EndpointSlice walk/s%d-x", n), fmt.Sprintf("Endpoints walk/s%d", n)} {
				if g, w := got.Origin(id), want.Origin(id); g != w {
					t.Fatalf("step %d: origin of %s %q through the cache, %q cold", step, id, g, w)
				}
			}
		}
		kinds[len(got.EndpointSlices) > 0]++
		kinds[len(got.Endpoints) > 0]++
	}
	if removed == 0 || kinds[true] == 0 {
		t.Fatalf("in the walk %d loads with a file gone, %d with slices or Endpoints", removed, kinds[true])
	}
	// The walk must have carried documents and whole files, made carrying
	// loads again, swept, and met failures.
	if cache.carried == 0 || cache.moved == 0 || cache.carriedFiles == 0 || cache.aborts == 0 || cache.sweeps == 0 || fails == 0 || cleanAfterClean == 0 {
		t.Fatalf("carried %d documents, %d to new places, and %d files, %d loads made again, %d sweeps, %d failed loads, %d clean after clean",
			cache.carried, cache.moved, cache.carriedFiles, cache.aborts, cache.sweeps, fails, cleanAfterClean)
	}
	t.Logf("carried %d documents, %d to new places, and %d files, %d loads made again, %d sweeps, %d failed loads of 800",
		cache.carried, cache.moved, cache.carriedFiles, cache.aborts, cache.sweeps, fails)
}

// names lists a load's objects, kind and name, in their order.
func names(o *Objects) []string {
	var out []string
	for _, s := range o.Services {
		out = append(out, "Service "+s.Namespace+"/"+s.Name)
	}
	for _, s := range o.EndpointSlices {
		out = append(out, "EndpointSlice "+s.Namespace+"/"+s.Name)
	}
	for _, e := range o.Endpoints {
		out = append(out, "Endpoints "+e.Namespace+"/"+e.Name)
	}
	return out
}

// An edit of one document in a file of many is carried: the other
// documents are neither split out nor added one by one, and their
// objects are the very ones the last load gave; a file with no event is
// carried whole. Loads that cannot carry (after a failed one, or a
// document moved) claim every object.
func TestAnEditCarriesTheOtherDocuments(t *testing.T) {
	dir := t.TempDir()
	svc := func(i, port int) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: c}\nspec:\n  ports: [{name: p, port: %d}]\n---\n", i, port)
	}
	write := func(file string, ports []int) {
		var b strings.Builder
		for i, p := range ports {
			b.WriteString(svc(i, p))
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ports := make([]int, 50)
	for i := range ports {
		ports[i] = 80
	}
	write("a.yaml", ports)
	if err := os.WriteFile(filepath.Join(dir, "b.yaml"), []byte(strings.ReplaceAll(svc(0, 80), "s0", "b0")), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := DocCache{now: func() time.Time { return time.Now().Add(time.Hour) }}
	first, err := loadCached(dir, &cache)
	if err != nil {
		t.Fatal(err)
	}
	if cache.carried != 0 {
		t.Fatalf("a first load carried %d documents", cache.carried)
	}
	ports[20] = 81
	write("a.yaml", ports)
	edited, err := loadCached(dir, &cache)
	if err != nil {
		t.Fatal(err)
	}
	if cache.carried != 49 || cache.carriedFiles != 1 {
		t.Fatalf("an edit of one document of 50 carried %d documents and %d files, want 49 and b.yaml", cache.carried, cache.carriedFiles)
	}
	for i, s := range edited.Services {
		if same := s == first.Services[i]; same != (i != 20) {
			t.Fatalf("Service %d (%s) is the last load's: %v", i, s.Name, same)
		}
	}
	if o := edited.Origin("Service c/s49"); !strings.HasSuffix(o, "a.yaml#50") {
		t.Fatalf("a carried object's origin: %q", o)
	}
	// A failed load, then a good one: the good one claims every object.
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(svc(0, 80)+svc(0, 81)), 0o644)
	if _, err := loadCached(dir, &cache); err == nil || !strings.Contains(err.Error(), "duplicate object") {
		t.Fatalf("a duplicate: %v", err)
	}
	carried := cache.carried
	write("a.yaml", ports)
	if _, err := loadCached(dir, &cache); err != nil {
		t.Fatal(err)
	}
	if cache.carried != carried {
		t.Fatalf("a load after a failed one carried %d documents", cache.carried-carried)
	}
	// A document moved: the load finds an object at a new place and makes
	// itself again, claiming every object.
	aborts := cache.aborts
	ports = append(ports[1:], ports[0])
	var b strings.Builder
	for i := range ports {
		b.WriteString(svc((i+1)%len(ports), ports[i]))
	}
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(b.String()), 0o644)
	moved, err := loadCached(dir, &cache)
	if err != nil {
		t.Fatal(err)
	}
	if cache.aborts != aborts+1 {
		t.Fatalf("a move made %d loads again, want 1", cache.aborts-aborts)
	}
	if o := moved.Origin("Service c/s0"); !strings.HasSuffix(o, "a.yaml#50") {
		t.Fatalf("a moved object's origin: %q", o)
	}
	// A path that is one file, not a directory, carries the same way.
	file := DocCache{now: cache.now}
	one := filepath.Join(dir, "a.yaml")
	write("a.yaml", ports)
	if _, err := loadCached(one, &file); err != nil {
		t.Fatal(err)
	}
	ports[7]++
	write("a.yaml", ports)
	if _, err := loadCached(one, &file); err != nil {
		t.Fatal(err)
	}
	if file.carried != 49 {
		t.Fatalf("an edit of one document of 50 in a file given alone carried %d documents", file.carried)
	}
}

// A document cut from the head of a file, then put back, moves every one
// after it: they are carried to their new places (no split, no load made
// again), with their origins at the new places, and the loads match cold
// ones.
func TestACutOrAnInsertCarriesTheDocumentsAfterIt(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	svc := func(i int) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: s%d, namespace: c}\nspec:\n  ports: [{name: p, port: 80}]\n---\n", i)
	}
	write := func(from int) {
		var b strings.Builder
		for i := from; i < 40; i++ {
			b.WriteString(svc(i))
		}
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cache := DocCache{now: func() time.Time { return time.Now().Add(time.Hour) }}
	for step, from := range []int{0, 3, 0, 1} { // all, three cut, put back, one cut
		write(from)
		moved, aborts := cache.moved, cache.aborts
		got, err := loadCached(dir, &cache)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := LoadManifests(dir)
		if !reflect.DeepEqual(names(got), names(want)) {
			t.Fatalf("step %d: %v, cold %v", step, names(got), names(want))
		}
		if o := got.Origin("Service c/s39"); !strings.HasSuffix(o, fmt.Sprintf("a.yaml#%d", 40-from)) {
			t.Fatalf("step %d: origin of s39 %q", step, o)
		}
		if step > 0 && (cache.aborts != aborts || cache.moved-moved != 40-max(from, []int{0, 3, 0, 1}[step-1])) {
			t.Fatalf("step %d: %d documents carried to new places, %d loads made again", step, cache.moved-moved, cache.aborts-aborts)
		}
	}
}
