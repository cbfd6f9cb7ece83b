package controlplane

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// FuzzParseManifest: no input may crash the parser or the builder, and what
// the builder accepts must satisfy the snapshot's invariants.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(goodManifest))
	f.Add([]byte("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n  spec: {ports: [{port: 1}]}\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"j"},"spec":{"ports":[{"port":80,"nodePort":30000}]}}`))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("apiVersion: v1\nkind: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := ParseManifest("fuzz.yaml", data)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		snap, err := Build(objs)
		if err != nil {
			return
		}
		for name, sp := range snap.Ports.All() {
			if sp.Name != name {
				t.Fatalf("port keyed %v holds %v", name, sp.Name)
			}
			if err := sp.Validate(); err != nil {
				t.Fatalf("Build accepted an invalid port: %v", err)
			}
		}
	})
}

// FuzzYAMLSplitMatchesYAMLReader: the zero-copy splitter must cut a stream
// where apimachinery's YAMLReader does: the same number of documents, each
// decoding to the same JSON, and the same separator errors.
func FuzzYAMLSplitMatchesYAMLReader(f *testing.F) {
	for _, seed := range []string{
		goodManifest, "", "\n", "---", "---\n", "a: 1", "a: 1\n---\nb: 2", "a: 1\r\n---\r\nb: 2\r\n",
		"--- # c\na: 1\n--- \n\n---\n# only a comment\n", "a: 1\n--- x\nb: 2\n", "----\na: 1\n", "a: |\n  ---\n  text\n",
		"---\n---\n---\n", "a: 1\n---", " ---\na: 1\n", "a: 1\n---\t#\nb: [1,\n 2]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// A buffer the size of the input: with bufio's default 4096 bytes,
		// YAMLReader drops a last line that has no newline and fills the
		// buffer exactly (ReadLine hands it over as a prefix, then EOF
		// alone, and YAMLReader returns EOF before writing the line). The
		// splitter keeps that line.
		ref := utilyaml.NewYAMLReader(bufio.NewReaderSize(bytes.NewReader(data), len(data)+16))
		mine := yamlDocuments{data: data}
		for doc := 1; ; doc++ {
			want, werr := ref.Read()
			got, gerr := mine.next()
			if (werr == io.EOF) != (gerr == io.EOF) || (werr == nil) != (gerr == nil) {
				t.Fatalf("document %d: YAMLReader %q, %v; splitter %q, %v", doc, want, werr, got, gerr)
			}
			if werr != nil {
				if werr != io.EOF && werr.Error() != gerr.Error() {
					t.Fatalf("document %d: errors differ: %v / %v", doc, werr, gerr)
				}
				return
			}
			if bytes.Equal(want, got) {
				continue // the same text: decoding it is not the splitter's business
			}
			// Different text must decode the same. (Compared only then:
			// YAMLToJSON picks between keys that collide once converted,
			// such as 0 and .0, by map order, so even one text can
			// decode two ways.)
			wj, wjerr := yaml.YAMLToJSON(want)
			gj, gjerr := yaml.YAMLToJSON(got)
			if (wjerr == nil) != (gjerr == nil) || !bytes.Equal(wj, gj) {
				t.Fatalf("document %d decodes differently: %q (%v) / %q (%v)\nYAMLReader %q\nsplitter   %q", doc, wj, wjerr, gj, gjerr, want, got)
			}
		}
	})
}

// FuzzCarriedLoadsMatchColdLoads: a run of loads through one document
// cache, each after line edits of two files, must give what a load
// through a new cache gives: the same errors, the same objects in the same order, the same
// build (also the memo's), the same origins (also of objects gone) and the same Node. The edits are made
// where a carried document could be fooled: at line starts (a separator
// written, dropped or commented, a document put in, cut, moved or
// copied, a line end rewritten) and at single bytes. A file an edit left
// as it was is not written again, and is replayed from its record (its
// times are trusted: the cache's clock runs an hour ahead, and a file
// written is a new inode).
func FuzzCarriedLoadsMatchColdLoads(f *testing.F) {
	doc := func(kind, name string, port int) string {
		switch kind {
		case "slice":
			return fmt.Sprintf("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: %s-x, namespace: f, labels: {kubernetes.io/service-name: %s}}\naddressType: IPv4\nports: [{name: p, port: %d}]\nendpoints: [{addresses: [\"10.1.0.9\"]}]\n", name, name, 8000+port)
		case "endpoints":
			return fmt.Sprintf("apiVersion: v1\nkind: Endpoints\nmetadata: {name: %s, namespace: f}\nsubsets: [{addresses: [{ip: 10.2.0.9}], ports: [{name: p, port: %d}]}]\n", name, 8000+port)
		case "node":
			return fmt.Sprintf("apiVersion: v1\nkind: Node\nmetadata: {name: %s, labels: {topology.kubernetes.io/zone: z%d}}\n", name, port)
		}
		return fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: f}\nspec:\n  ports: [{name: p, port: %d}]\n", name, port)
	}
	a := doc("svc", "s1", 80) + "---\n" + doc("slice", "s1", 1) + "---\n" + doc("svc", "s2", 81) + "---\n" + doc("svc", "s3", 82)
	b := doc("svc", "s4", 83) + "---\n" + doc("endpoints", "s4", 2) + "---\n" + doc("slice", "s2", 3) + "\n"
	f.Add(a, b, []byte{})
	f.Add(a, b, []byte{0, 6, 1, 5, 0, 0, 1, 12, 0, 5, 0, 0})     // a separator, then a document, put in
	f.Add(a, b, []byte{2, 0, 7 + 8*20, 5, 0, 0, 1, 0, 1})        // a document moved down, then a line cut
	f.Add(a, b, []byte{3, 6, 6 + 8*3, 5, 0, 0, 7, 0, 0})         // a document copied, then the files swapped
	f.Add(a, b, []byte{4, 0, 40, 5, 0, 0, 6, 3, 0, 8 + 1, 2, 0}) // a byte, a line end, a line of b
	// A separator line turned into text of the same length: the two
	// documents around it are one (line 5, column 4: '#' becomes 'x').
	f.Add(doc("svc", "s1", 80)+"--- # c\n"+doc("svc", "s2", 81), b, []byte{4, 5, 4*9 + 5})
	// A line appended to the last document: what was all of it is now its
	// start (line 11 is the end of the text; vocab[12] is the line).
	f.Add(doc("svc", "s1", 80)+"---\n"+doc("svc", "s2", 81), b, []byte{0, 11, 12})
	// The last document cut whole (lines 5 to 10): it has no origin.
	f.Add(doc("svc", "s1", 80)+"---\n"+doc("svc", "s2", 81), b, []byte{1, 5, 5})
	// This node's Node, and another's, beside a Service; a second copy of
	// this node's put in the other file, which is then replayed.
	nodes := doc("svc", "s7", 87) + "---\n" + doc("node", "n1", 1) + "---\n" + doc("node", "n2", 2) + "---\n" + doc("svc", "s8", 88)
	f.Add(nodes, b, []byte{8, 0, 14, 5, 0, 0})
	// The other file given copies of a file's Node and Service: that
	// file, replayed, is two duplicates, named in its order.
	f.Add(doc("svc", "s1", 80), doc("node", "n1", 1)+"---\n"+doc("svc", "s5", 84), []byte{0, 0, 9, 0, 0, 14, 5, 0, 0})
	// A Service put in the other file: the Node's is carried whole.
	f.Add(nodes, b, []byte{8, 0, 9, 5, 0, 0})
	// The Node renamed (line 9, column 19: "n1" becomes "nx"), so that
	// it is another node's; then the file is left as it is.
	f.Add(nodes, b, []byte{4, 8, 9*18 + 5, 5, 0, 0})
	// A slice's port changed beside a slice cut from the other file: the
	// memo's spliced build must rebuild both Services (line 11, column
	// 27: 8001 becomes 8011; lines 11 to 17 of b).
	f.Add(a, b, []byte{4, 10, 9*26 + 6, 9, 10, 6, 5, 0, 0})
	// One directory for every input (a new one each was most of an
	// input's time): its files are written anew before each load.
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, a, b string, edits []byte) {
		if len(a)+len(b) > 1<<13 || len(edits) > 3*32 {
			return
		}
		vocab := []string{
			"---\n", "--- # c\n", "---   \n", "...\n", "# c\n", "\n", "  ", "- ", "---",
			doc("svc", "s5", 84) + "---\n", doc("svc", "s1", 85) + "---\n", doc("slice", "s3", 4) + "---\n",
			"  sessionAffinity: ClientIP\n", "kind: List\nitems:\n- " + strings.ReplaceAll(doc("svc", "s6", 86), "\n", "\n  ") + "\n",
			doc("node", "n1", 3) + "---\n", "kind: List\nitems:\n- " + strings.ReplaceAll(doc("node", "n1", 4), "\n", "\n  ") + "\n",
		}
		texts := [2][]byte{[]byte(a), []byte(b)}
		var written [2][]byte // what the files hold (nil: unknown)
		const node = "n1"
		cache := DocCache{node: node, now: func() time.Time { return time.Now().Add(time.Hour) }}
		ids := map[string]bool{}
		var memo BuildMemo
		load := func(step int) {
			for i, text := range texts {
				if written[i] != nil && bytes.Equal(written[i], text) {
					continue
				}
				// By rename: a new inode, so that the cache's hour-ahead
				// clock cannot take a rewrite of the same size in the same
				// clock tick for the file it read.
				name := filepath.Join(dir, fmt.Sprintf("f%d.yaml", i))
				if err := os.WriteFile(filepath.Join(dir, ".tmp"), text, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(filepath.Join(dir, ".tmp"), name); err != nil {
					t.Fatal(err)
				}
				written[i] = slices.Clone(text)
			}
			got, gerr := loadCached(dir, &cache)
			want, werr := loadCached(dir, &DocCache{node: node})
			if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
				t.Fatalf("load %d: through the cache %v, cold %v", step, gerr, werr)
			}
			if werr != nil {
				return
			}
			// And a load with no cache at all (another decoder; its
			// errors are worded otherwise) finds the same objects.
			if plain, err := LoadManifests(dir); err != nil || !slices.Equal(names(plain), names(want)) {
				t.Fatalf("load %d: with no cache %v (%v), through a new one %v", step, names(plain), err, names(want))
			}
			if g, w := names(got), names(want); !slices.Equal(g, w) {
				t.Fatalf("load %d: objects through the cache %v, cold %v", step, g, w)
			}
			x, xerr := BuildFor(got, node)
			y, yerr := BuildFor(want, node)
			if (xerr == nil) != (yerr == nil) || (xerr != nil && xerr.Error() != yerr.Error()) || !reflect.DeepEqual(x, y) {
				t.Fatalf("load %d: the build through the cache differs from a cold one (%v, %v)", step, xerr, yerr)
			}
			if yerr != nil && strings.Contains(yerr.Error(), "parsed for node") {
				t.Fatalf("load %d: built for another node than the load's: %v", step, yerr)
			}
			// And the memo's build of the carried load (in place, spliced
			// or whole, a delta of its last) serves the same ports.
			if m, merr := memo.Build(got, node); (merr == nil) != (yerr == nil) || (merr != nil && merr.Error() != yerr.Error()) || merr == nil && !reflect.DeepEqual(m.Ports, y.Ports) {
				t.Fatalf("load %d: the memo's build differs from a cold one (%v, %v)", step, merr, yerr)
			}
			gz, gat, gfound := got.NodeZone()
			wz, wat, wfound := want.NodeZone()
			if gz != wz || gat != wat || gfound != wfound || !reflect.DeepEqual(got.Node(), want.Node()) {
				t.Fatalf("load %d: node zone through the cache %q at %q (%v), cold %q at %q (%v)", step, gz, gat, gfound, wz, wat, wfound)
			}
			for _, id := range names(want) {
				ids[id] = true
			}
			for id := range ids {
				if g, w := got.Origin(id), want.Origin(id); g != w {
					t.Fatalf("load %d: origin of %s %q through the cache, %q cold", step, id, g, w)
				}
			}
		}
		// lines cuts text into lines, each with its line end.
		lines := func(text []byte) [][]byte {
			var out [][]byte
			for len(text) > 0 {
				n := bytes.IndexByte(text, '\n') + 1
				if n == 0 {
					n = len(text)
				}
				out = append(out, slices.Clone(text[:n]))
				text = text[n:]
			}
			return out
		}
		load(0)
		step := 1
		for ; len(edits) >= 3; edits = edits[3:] {
			op, x, y := edits[0], int(edits[1]), int(edits[2])
			file := &texts[op>>3&1]
			ls := lines(*file)
			at := func(v int) int { return v % (len(ls) + 1) }
			switch op & 7 {
			case 0: // a text put in at a line start
				ls = slices.Insert(ls, at(x), []byte(vocab[y%len(vocab)]))
			case 1: // lines cut
				if i := at(x); i < len(ls) {
					ls = slices.Delete(ls, i, min(len(ls), i+1+y%8))
				}
			case 2, 3: // lines moved or copied elsewhere
				if i := at(x); i < len(ls) {
					block := slices.Clone(ls[i:min(len(ls), i+1+y%8)])
					if op&7 == 2 {
						ls = slices.Delete(ls, i, i+len(block))
					}
					ls = slices.Insert(ls, (y/8)%(len(ls)+1), block...)
				}
			case 4: // a byte of a line changed
				if i := at(x); i < len(ls) {
					ls[i][(y/9)%len(ls[i])] = "-\n #:x1 \r"[y%9]
				}
			case 5:
				load(step)
				step++
				continue
			case 6: // a line end rewritten
				if i := at(x); i < len(ls) {
					if l := ls[i]; bytes.HasSuffix(l, []byte("\r\n")) {
						ls[i] = append(l[:len(l)-2], '\n')
					} else if bytes.HasSuffix(l, []byte("\n")) {
						ls[i] = append(l[:len(l)-1], '\r', '\n')
					}
				}
			case 7: // the files' texts swapped: documents move across files
				texts[0], texts[1] = texts[1], texts[0]
				continue
			}
			*file = bytes.Join(ls, nil)
		}
		load(step)
	})
}
