package controlplane

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"

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
