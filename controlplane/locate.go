package controlplane

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Locate gives the manifest errors in err that name a document and a field
// the line and column of that field in its file, as an editor counts them,
// so that `svc.yaml#3: ... spec.ports[0].protocl` becomes
// `svc.yaml:19:7: ...`. It re-reads only the files the errors name (a
// rejected load; a bounded number of errors), and leaves an error it cannot
// place as it was.
func Locate(err error) error {
	if err == nil {
		return nil
	}
	files := map[string][]byte{}
	for _, e := range leaves(err) {
		var me *ManifestError
		if !errors.As(e, &me) || me.Field == "" || me.Line > 0 {
			continue
		}
		path, docText, ok := strings.Cut(me.File, "#")
		doc, convErr := strconv.Atoi(docText)
		if !ok || convErr != nil || doc < 1 {
			continue
		}
		data, seen := files[path]
		if !seen {
			data, _ = os.ReadFile(path)
			files[path] = data
		}
		if line, col, found := fieldPosition(data, doc, me.Field); found {
			me.Line, me.Column = line, col
		}
	}
	return err
}

// fieldPosition finds field (a path such as spec.ports[0].name, or
// spec.ports[http].nodePort with a port named by its name) in the doc-th
// YAML document of data, and returns its line and column in the file: the
// key's when the path ends in a key, the item's when it ends in an index.
// When the path leads off the document (an unknown field's parent is
// there, the rest is not), the deepest part found is given.
func fieldPosition(data []byte, doc int, field string) (line, col int, ok bool) {
	split := yamlDocuments{data: data}
	var raw []byte
	for i := 1; i <= doc; i++ {
		var err error
		if raw, err = split.next(); err != nil {
			return 0, 0, false
		}
	}
	offset := bytes.Count(data[:split.last], []byte("\n"))
	var root yaml.Node
	if err := yaml.Unmarshal(raw, &root); err != nil || root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return 0, 0, false
	}
	node := root.Content[0]
	line, col = node.Line, node.Column
	for _, seg := range pathSegments(field) {
		next, at := step(node, seg)
		if next == nil {
			break
		}
		node, line, col = next, at.Line, at.Column
	}
	return line + offset, col, true
}

// pathSegment is one step of a field path: a mapping key, or a sequence
// index given by position or by the item's name.
type pathSegment struct {
	key   string
	index string // set for [..]
}

func pathSegments(field string) []pathSegment {
	var out []pathSegment
	for _, part := range strings.Split(field, ".") {
		key, rest, _ := strings.Cut(part, "[")
		if key != "" {
			out = append(out, pathSegment{key: key})
		}
		for rest != "" {
			idx, after, ok := strings.Cut(rest, "]")
			if !ok {
				break
			}
			out = append(out, pathSegment{index: idx})
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return out
}

// step follows one segment from node; at is the node whose position names
// the step (the key for a mapping, the item for a sequence).
func step(node *yaml.Node, seg pathSegment) (next, at *yaml.Node) {
	switch {
	case seg.key != "" && node.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(node.Content); i += 2 {
			if node.Content[i].Value == seg.key {
				return node.Content[i+1], node.Content[i]
			}
		}
	case seg.index != "" && node.Kind == yaml.SequenceNode:
		if n, err := strconv.Atoi(seg.index); err == nil {
			if n >= 0 && n < len(node.Content) {
				return node.Content[n], node.Content[n]
			}
			return nil, nil
		}
		for _, item := range node.Content { // ports[http]: the item named so
			if item.Kind != yaml.MappingNode {
				continue
			}
			for i := 0; i+1 < len(item.Content); i += 2 {
				if item.Content[i].Value == "name" && item.Content[i+1].Value == seg.index {
					return item, item
				}
			}
		}
	}
	return nil, nil
}
