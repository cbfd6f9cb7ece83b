package controlplane

import (
	"strings"
	"testing"
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
		for name, sp := range snap.Ports {
			if sp.Name != name {
				t.Fatalf("port keyed %v holds %v", name, sp.Name)
			}
			if err := sp.Validate(); err != nil {
				t.Fatalf("Build accepted an invalid port: %v", err)
			}
		}
	})
}
