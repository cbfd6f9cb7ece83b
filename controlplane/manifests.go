// Package controlplane owns where services come from and when they change:
// sources (Kubernetes manifests on disk, watched; the Kubernetes API comes
// later), the tracker that turns Service, EndpointSlice and Endpoints objects
// into one immutable *lb.Snapshot and drops no-op changes, and the runner
// that coalesces bursts of changes and never publishes before a full sync.
package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Objects is what a source read: the Kubernetes objects that matter to a
// proxy, in the order they were found.
type Objects struct {
	Services       []*Service
	EndpointSlices []*Slice
	//lint:ignore SA1019 v1 Endpoints are read on purpose, for older manifests
	Endpoints []*corev1.Endpoints
	// origin maps "Kind ns/name" to "file#doc", for duplicates and
	// error messages: entries of gen are this load's.
	origin *origins
	gen    uint64
	// emptyLists counts the v1 Lists with no items: an explicit "no
	// objects", the one way a file may hold nothing (see ErrEmptyFile).
	emptyLists int
	// skipped counts the objects of other kinds (a Deployment beside its
	// Service in an application's directory): read, then left alone.
	skipped int
	// skippedKinds names each kind skipped ("apps/v1 Deployment") with
	// where it was first found and how many.
	skippedKinds map[string]SkippedKind
	// decoded counts the bytes decoded (not handed back by a DocCache).
	decoded int64
	// rec, while a file is decoded, records what its documents give.
	rec *fileState
	// forNode: the slices are parsed for node (a source's load), marking
	// its endpoints Local; otherwise for none, each keeping its decoded
	// form to be parsed again for whichever node a build is for.
	forNode bool
	node    string
	// ignoreNodeHints drops the slices' node hints as they are decoded
	// (kube-proxy's PreferSameTrafficDistribution gate off).
	ignoreNodeHints bool
	// nodeObj is the Node object named node, when forNode and the
	// manifests hold it (nodeAt is where: "" when they do not), with what
	// a proxy reads of it (proxyNode): its zone label, for the slices'
	// zone hints, its pod CIDRs and addresses, and whether it may take
	// traffic. Nodes of other names are skipped.
	nodeObj *corev1.Node
	nodeAt  string
	// fast: this load carries what the last clean load (last) found where
	// it is again, unchanged: the objects of a file not read again, and
	// of each document read again with the same text at the same place,
	// are taken from last's lists, without a claim of their origins (at
	// 10k Services in one file, the claims and adds were a third of a
	// reload, and splitting the text another). An origin entry of baseGen
	// or later then marks where a live object is found, claimed or not.
	// A claim that meets one at another place cannot tell whether that
	// document is still there, so it sets aborted, and the load is made
	// again, claiming every object (see add).
	fast    bool
	baseGen uint64
	aborted bool
	last    *lastLoad
	// slots are the document slots the load left (the cache's, until its
	// next load), for Origin to tell a carried object from a gone one.
	slots map[string][]docSlot
}

// lastLoad is what the last clean load found, in load order.
type lastLoad struct {
	services []*Service
	slices   []*Slice
	//lint:ignore SA1019 v1 Endpoints are read on purpose, for older manifests
	endpoints []*corev1.Endpoints
}

// The kinds of object a document gives, as a slot records them.
const (
	kindNone uint8 = iota
	kindService
	kindSlice
	kindEndpoints
)

// kindOf is obj's kind.
func kindOf(obj any) uint8 {
	switch obj.(type) {
	case *Service:
		return kindService
	case *Slice:
		return kindSlice
	}
	return kindEndpoints
}

// lens are the lengths of o's lists, by kind.
func (o *Objects) lens() [3]int32 {
	return [3]int32{int32(len(o.Services)), int32(len(o.EndpointSlices)), int32(len(o.Endpoints))}
}

// carryOne adds the i-th object of kind of the last load.
func (o *Objects) carryOne(kind uint8, i int32) {
	switch kind {
	case kindService:
		o.Services = append(o.Services, o.last.services[i])
	case kindSlice:
		o.EndpointSlices = append(o.EndpointSlices, o.last.slices[i])
	default:
		o.Endpoints = append(o.Endpoints, o.last.endpoints[i])
	}
}

// SkippedKind is a kind of object the manifests hold and sluice does not
// read: where it was first found, and how many there are.
type SkippedKind struct {
	First string
	Count int
}

// skip counts an object of a kind sluice does not read.
func (o *Objects) skip(gv, where string) {
	o.skipped++
	if o.skippedKinds == nil {
		o.skippedKinds = map[string]SkippedKind{}
	}
	k := o.skippedKinds[gv]
	if k.Count == 0 {
		k.First = where
	}
	k.Count++
	o.skippedKinds[gv] = k
}

// skipDoc skips the document at at, of the kind gv, and records it for
// the file's replay.
func (o *Objects) skipDoc(gv string, at place) {
	o.skip(gv, at.String())
	if o.rec != nil {
		o.rec.skipped = append(o.rec.skipped, skippedDoc{gv: gv, where: at.String()})
	}
}

// SkippedKinds names each kind the read skipped.
func (o *Objects) SkippedKinds() map[string]SkippedKind { return o.skippedKinds }

// otherCoreKinds are the core (v1) kinds sluice leaves alone; any other
// v1 kind but Service, Endpoints and List is taken for a typo.
var otherCoreKinds = map[string]bool{"Pod": true, "ConfigMap": true, "Secret": true, "ServiceAccount": true, "Namespace": true,
	"PersistentVolume": true, "PersistentVolumeClaim": true, "ReplicationController": true, "LimitRange": true, "ResourceQuota": true,
	"Event": true, "PodTemplate": true} // and Node, but this node's (decodeObject)

// leftAlone says whether an object of apiVersion/kind is one sluice skips:
// a core kind it does not serve, or any kind of another API group (apps,
// batch, networking.k8s.io, custom resources, ...). A misspelt core or
// discovery kind is not skipped: it is an error.
func leftAlone(apiVersion, kind string) bool {
	switch {
	case apiVersion == "v1":
		return otherCoreKinds[kind]
	case strings.HasPrefix(apiVersion, "discovery.k8s.io/"):
		return false
	default:
		return strings.Contains(apiVersion, "/") && kind != ""
	}
}

// ExplicitlyEmpty reports whether the manifests hold a v1 List with no
// items: how an operator says that no Service is meant to be served.
func (o *Objects) ExplicitlyEmpty() bool { return o.emptyLists > 0 }

// ErrEmptyFile is why a manifest file with no object in it is refused: a
// file caught between a tool's truncate and its write reads empty, and
// serving that would remove every Service it held. A file that means to
// hold nothing says so with an empty List (apiVersion: v1, kind: List,
// items: []).
var ErrEmptyFile = errors.New("holds no object (empty, or only comments): a file being written? To mean no objects, write apiVersion: v1, kind: List, items: []")

// ErrChangedWhileRead is why a manifest file that kept changing while it
// was read is refused: what was read may be half of an edit.
var ErrChangedWhileRead = errors.New("changed while it was read, three times: an edit in progress")

// ManifestError is one problem in one object of one manifest file.
type ManifestError struct {
	File   string // path, with "#N" for the Nth document of a multi-document file
	Object string // e.g. "Service default/web"; empty when the document could not be decoded
	Field  string // e.g. "spec.ports[1].port"; empty when it is not about one field
	// Line and Column place Field in the file (Locate sets them); 0 when
	// unknown.
	Line, Column int
	Err          error
}

func (e *ManifestError) Error() string {
	var b strings.Builder
	where := e.File
	if e.Line > 0 {
		// file:line:column, as compilers and editors write it.
		path, _, _ := strings.Cut(e.File, "#")
		where = fmt.Sprintf("%s:%d:%d", path, e.Line, e.Column)
	}
	for _, part := range []string{where, e.Object, e.Field} {
		if part != "" {
			b.WriteString(part + ": ")
		}
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *ManifestError) Unwrap() error { return e.Err }

// Culprits lists, sorted and once each, the objects ("Kind ns/name") that
// the errors in err name. Errors about a whole file name none.
func Culprits(err error) []string {
	seen := map[string]bool{}
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if me, ok := err.(*ManifestError); ok {
			if me.Object != "" {
				seen[me.Object] = true
			}
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	out := make([]string, 0, len(seen))
	for o := range seen {
		out = append(out, o)
	}
	sort.Strings(out)
	return out
}

// maxRenamed is how many names the watch may report made, removed or
// renamed before a reload lists the directory rather than patch the last
// listing name by name.
const maxRenamed = 64

// listable reports whether the directory entry name is a manifest file a
// load reads (a regular file, or a link to one, with a manifest file's
// ending, not hidden), and whether it is a link.
func listable(dir, name string, typ fs.FileMode) (ok, link bool) {
	if !manifestName(name) {
		return false, false
	}
	if typ.IsRegular() {
		return true, false
	}
	// Symlinks to regular files are read: a ConfigMap mounted in a pod is
	// a directory of them (name -> ..data/name).
	fi, err := os.Stat(filepath.Join(dir, name))
	return err == nil && fi.Mode().IsRegular(), true
}

// patchListing is the last listing with the names in Renamed added or
// dropped as they are now. The count of links only grows (a dropped name
// may have been one), which errs towards looking at every file.
func (c *DocCache) patchListing(dir string) []string {
	files := slices.Clone(c.paths)
	for _, p := range c.Renamed {
		c.patched++
		i, present := slices.BinarySearch(files, p)
		ok, link := false, false
		if li, err := os.Lstat(p); err == nil {
			ok, link = listable(dir, filepath.Base(p), li.Mode().Type())
		}
		switch {
		case ok && !present:
			files = slices.Insert(files, i, p)
		case !ok && present:
			files = slices.Delete(files, i, i+1)
		}
		if ok && link {
			c.symlinks++
		}
	}
	c.paths = files
	return files
}

// manifestExtensions are the file name endings read from a directory, as kubectl does.
var manifestExtensions = []string{".yaml", ".yml", ".json"}

// manifestName reports whether a directory entry's name is one a load
// reads (a manifest file's ending, not hidden).
func manifestName(name string) bool {
	return !strings.HasPrefix(name, ".") && slices.Contains(manifestExtensions, strings.ToLower(filepath.Ext(name)))
}

// LoadManifests reads a file, or every .yaml/.yml/.json file of a directory
// (not recursive, sorted by name), and returns the objects or every problem
// found, joined. Validation happens in Build.
func LoadManifests(path string) (*Objects, error) {
	objs, _, err := loadManifests(path, nil, DefaultMaxManifestBytes)
	return objs, err
}

// DefaultMaxManifestBytes bounds what one load reads (--manifest-max-bytes):
// decoding costs about ten times the size in memory at its peak, so a
// runaway file (a log written into the directory, a generator gone wrong)
// must not take the node's memory with it. 64 MiB holds some 25,000
// Services with their slices as kubectl writes them.
const DefaultMaxManifestBytes = 64 << 20

// ErrManifestsTooLarge is why a load over the size limit is refused.
var ErrManifestsTooLarge = errors.New("manifests larger than --manifest-max-bytes")

// loadManifests also returns how many bytes it decoded (documents the
// cache did not hold). maxBytes (0: no limit) is checked against the
// files' sizes before any is read.
func loadManifests(path string, cache *DocCache, maxBytes int64) (*Objects, int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, 0, fmt.Errorf("manifests: %w", err)
	}
	files := []string{path}
	var lastPaths []string // the listing before this load's, when it changed
	if cache != nil && !(fi.IsDir() && cache.Touched != nil && cache.SameListing) {
		lastPaths = cache.paths
	}
	known := fi.IsDir() && cache != nil && cache.Touched != nil && cache.paths != nil
	if known && cache.SameListing {
		files = cache.paths
	} else if known && cache.Renamed != nil && len(cache.Renamed) <= maxRenamed {
		files = cache.patchListing(path)
	} else if fi.IsDir() {
		if cache != nil {
			cache.listings++
		}
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, 0, fmt.Errorf("manifests: %w", err)
		}
		files = make([]string, 0, len(ents))
		// The paths the last load made, where the names are the same (both
		// lists are sorted): made anew, they were 1.4 MB of a reload's
		// garbage at 10k files.
		var last []string
		dirPrefix := filepath.Join(path, "x")
		dirPrefix = dirPrefix[:len(dirPrefix)-1]
		if cache != nil {
			last = cache.paths
		}
		join := func(name string) string {
			for len(last) > 0 && (!strings.HasPrefix(last[0], dirPrefix) || last[0][len(dirPrefix):] < name) {
				last = last[1:]
			}
			if len(last) > 0 && last[0][len(dirPrefix):] == name {
				return last[0]
			}
			return filepath.Join(path, name)
		}
		symlinks := 0
		for _, e := range ents {
			if ok, link := listable(path, e.Name(), e.Type()); ok {
				files = append(files, join(e.Name()))
				if link {
					symlinks++
				}
			}
		}
		sort.Strings(files)
		if cache != nil {
			cache.paths, cache.symlinks = files, symlinks
		}
	}
	stats := make([]os.FileInfo, len(files))
	quiet := make([]*fileState, len(files))
	var total int64
	for i, f := range files {
		if st := cache.quiet(f); st != nil && fi.IsDir() {
			// No event since it was read: as it was, unasked.
			quiet[i] = st
			total += st.id.size
		} else {
			if cache != nil {
				cache.stats++
			}
			if fi, err := os.Stat(f); err == nil {
				stats[i] = fi
				total += fi.Size()
			}
		}
		if maxBytes > 0 && total > maxBytes {
			return nil, 0, &ManifestError{File: f, Err: fmt.Errorf("%w (%d bytes): %d bytes with this file and those before it", ErrManifestsTooLarge, maxBytes, total)}
		}
	}
	if cache != nil {
		cache.forget(files, lastPaths, fi.IsDir())
	}
	if cache == nil {
		objs, errs, read := loadFiles(files, stats, quiet, nil, maxBytes, false)
		if objs == nil { // over the size limit
			return nil, read, errs[0]
		}
		if len(errs) > 0 {
			return nil, objs.decoded, errors.Join(errs...)
		}
		return objs, objs.decoded, nil
	}
	cache.begin()
	fast := cache.last != nil
	objs, errs, read := loadFiles(files, stats, quiet, cache, maxBytes, fast)
	if objs != nil && objs.aborted {
		cache.abandon()
		objs, errs, read = loadFiles(files, stats, quiet, cache, maxBytes, false)
	}
	cache.end()
	cache.last = nil
	if objs == nil { // over the size limit
		return nil, read, errs[0]
	}
	cache.services, cache.slices = len(objs.Services), len(objs.EndpointSlices)
	if len(errs) > 0 {
		return nil, objs.decoded, errors.Join(errs...)
	}
	cache.last = &lastLoad{objs.Services, objs.EndpointSlices, objs.Endpoints}
	if !objs.fast {
		cache.baseGen = objs.gen // it claimed every object it holds
	}
	return objs, objs.decoded, nil
}

// loadFiles reads files (stats and quiet as loadManifests found them) into
// a new Objects, through cache when there is one, carrying what the last
// load found when fast (see Objects.fast). Over maxBytes, it returns no
// Objects and the one error.
func loadFiles(files []string, stats []os.FileInfo, quiet []*fileState, cache *DocCache, maxBytes int64, fast bool) (*Objects, []error, int64) {
	objs := newObjects()
	if cache != nil {
		// The cache's origins, which outlive a load: an object found where
		// it was last time takes its entry from its document's, with no
		// map look-up (a look-up and an insert per object were a fifth of
		// a reload of a 10k-Service file).
		objs.origin, objs.gen = &cache.origins, cache.gen
		objs.forNode, objs.node, objs.ignoreNodeHints = true, cache.node, cache.ignoreNodeHints
		objs.fast, objs.baseGen, objs.last = fast, cache.baseGen, cache.last
		// Sized as last time: grown by appends they were 0.6 MB more.
		objs.Services = make([]*Service, 0, cache.services)
		objs.EndpointSlices = make([]*Slice, 0, cache.slices)
	}
	var errs []error
	var read int64
	for i, f := range files {
		if objs.aborted {
			break // made again by the caller
		}
		if st := quiet[i]; st != nil {
			errs = append(errs, objs.replay(f, st, cache)...)
			continue
		}
		if cache != nil && stats[i] != nil {
			if id, ok := identify(stats[i]); ok {
				if st := cache.files[f]; st != nil && st.unchanged(id) {
					errs = append(errs, objs.replay(f, st, cache)...)
					continue
				}
			}
		}
		readAt := cache.clock()
		if cache != nil {
			cache.reads++
		}
		var buf []byte
		if cache != nil {
			buf = cache.buf
		}
		data, fi, err := readStable(f, buf)
		if cache != nil && data != nil {
			// Nothing a load keeps points into data (the cache keeps
			// hashes of the text, not the text): the next read may
			// overwrite it.
			cache.buf = data[:0]
		}
		if err != nil {
			errs = append(errs, &ManifestError{File: f, Err: err})
			if cache != nil {
				delete(cache.files, f)
				delete(cache.slots, f)
			}
			continue
		}
		read += int64(len(data))
		if maxBytes > 0 && read > maxBytes { // grew since the check above
			return nil, []error{&ManifestError{File: f, Err: fmt.Errorf("%w (%d bytes)", ErrManifestsTooLarge, maxBytes)}}, read
		}
		before, lists, skipped, nodeAt := objs.count(), objs.emptyLists, objs.skipped, objs.nodeAt
		if cache != nil {
			objs.rec = &fileState{readAt: readAt, starts: objs.lens()}
		}
		ferrs := objs.decode(f, data, cache)
		if cache != nil {
			delete(cache.files, f) // until recorded again below
		}
		if len(ferrs) == 0 && objs.count() == before && objs.emptyLists == lists && objs.skipped == skipped && objs.nodeAt == nodeAt {
			ferrs = append(ferrs, &ManifestError{File: f, Err: ErrEmptyFile})
		}
		errs = append(errs, ferrs...)
		// Remember the file when all it gave is recorded (a List's items
		// are not) and its identity is known.
		// (Not when the load stopped part-way through the file: aborted.)
		if rec := objs.rec; rec != nil && !objs.aborted && len(ferrs) == 0 && objs.count()-before == rec.objects {
			if id, ok := identify(fi); ok { // fi: the stat readStable took after reading
				rec.id, rec.emptyLists = id, objs.emptyLists-lists
				lens := objs.lens()
				for k := range lens {
					rec.counts[k] = lens[k] - rec.starts[k]
				}
				cache.files[f] = rec
			}
		}
		objs.rec = nil
	}
	if cache != nil {
		objs.slots = cache.slots
	}
	return objs, errs, read
}

// replay adds what an unchanged file gave when it was read, keeping its
// documents in the document cache.
func (o *Objects) replay(file string, st *fileState, cache *DocCache) []error {
	starts := o.lens()
	defer func() { st.starts = starts }()
	if o.fast {
		// The same documents at the same places: the last load's objects,
		// in one copy per kind.
		s, n := st.starts, st.counts
		o.Services = append(o.Services, o.last.services[s[0]:s[0]+n[0]]...)
		o.EndpointSlices = append(o.EndpointSlices, o.last.slices[s[1]:s[1]+n[1]]...)
		o.Endpoints = append(o.Endpoints, o.last.endpoints[s[2]:s[2]+n[2]]...)
		cache.carriedFiles++
		var errs []error
		for _, sk := range st.skipped {
			if sk.node != nil {
				errs = append(errs, o.ownNode(sk.node.at, sk.node.node)...)
				continue
			}
			o.skip(sk.gv, sk.where)
		}
		o.emptyLists += st.emptyLists
		return errs
	}
	var errs []error
	var node *nodeDoc
	for _, sk := range st.skipped {
		if sk.node != nil {
			node = sk.node
		}
	}
	for i, d := range st.docs {
		if node != nil && node.at.doc == i+1 {
			// In the file's order, as a load that reads it finds it (a
			// duplicate's error comes where it would).
			errs = append(errs, o.ownNode(node.at, node.node)...)
			node = nil
		}
		if d.e == nil {
			continue // a place that gave no object (an empty document)
		}
		d.e.gen = cache.gen
		errs = append(errs, o.add(place{file, i + 1}, d.e)...)
	}
	if node != nil { // a JSON file's: no document slots
		errs = append(errs, o.ownNode(node.at, node.node)...)
	}
	for _, sk := range st.skipped {
		if sk.node == nil {
			o.skip(sk.gv, sk.where)
		}
	}
	o.emptyLists += st.emptyLists
	return errs
}

// ownNode records the Node object of this load's node (what a proxy
// reads of it, never changed once made), found at at, refusing a second
// one.
func (o *Objects) ownNode(at place, n *corev1.Node) []error {
	where := at.String()
	if o.nodeAt != "" {
		return []error{&ManifestError{File: where, Object: "Node " + o.node, Field: "metadata.name", Err: fmt.Errorf("duplicate object, first defined in %s", o.nodeAt)}}
	}
	o.nodeAt, o.nodeObj = where, n
	if o.rec != nil {
		if at.doc == 0 {
			// A List's item: the file is read again each load rather than
			// replay an item at a document's place.
			o.rec = nil
		} else {
			o.rec.skipped = append(o.rec.skipped, skippedDoc{node: &nodeDoc{at, n}})
		}
	}
	return nil
}

// proxyNode is what a proxy reads of a Node: its name, its zone label,
// its pod CIDRs, its addresses, and whether it is being deleted or is
// tainted to be (NodeEligible).
func proxyNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{}
	out.Name, out.DeletionTimestamp = n.Name, n.DeletionTimestamp
	for _, t := range n.Spec.Taints {
		if t.Key == TaintToBeDeleted {
			out.Spec.Taints = append(out.Spec.Taints, t)
		}
	}
	if z, ok := n.Labels[corev1.LabelTopologyZone]; ok {
		out.Labels = map[string]string{corev1.LabelTopologyZone: strings.Clone(z)}
	}
	out.Spec.PodCIDR, out.Spec.PodCIDRs = n.Spec.PodCIDR, n.Spec.PodCIDRs
	out.Status.Addresses = n.Status.Addresses
	return out
}

// NodeZone is the topology.kubernetes.io/zone label of this node's Node
// object (the one named as the source's node) and where the manifests hold
// it; found is false when they hold none.
func (o *Objects) NodeZone() (zone, at string, found bool) {
	return o.zone(), o.nodeAt, o.nodeAt != ""
}

// zone is the zone label of this node's Node ("": none, or no Node).
func (o *Objects) zone() string {
	if o.nodeObj == nil {
		return ""
	}
	return o.nodeObj.Labels[corev1.LabelTopologyZone]
}

// Node is this node's Node object as the manifests hold it (what
// proxyNode keeps), or nil when they hold none. It is shared: not to be
// changed.
func (o *Objects) Node() *corev1.Node { return o.nodeObj }

// MaxReportedErrors is how many of a load's errors are reported (logged,
// returned, counted by object); the rest are counted in one line. A broken
// generator can produce tens of thousands, which once made one 6.9 MB log
// line and as many metric series.
const MaxReportedErrors = 20

// BoundErrors keeps the first max leaf errors of err (errors.Join trees
// are flattened) and sums up the rest.
func BoundErrors(err error, max int) error {
	all := leaves(err)
	if len(all) <= max {
		return err
	}
	kept := append(all[:max:max], fmt.Errorf("... and %d more errors", len(all)-max))
	return errors.Join(kept...)
}

// readStable reads a file whose size and modification time are the same
// before and after the read, so a read never mixes two versions of an
// edit made in place; it tries three times.
func readStable(f string, buf []byte) ([]byte, os.FileInfo, error) {
	for try := 0; try < 3; try++ {
		before, err := os.Stat(f)
		if err != nil {
			return nil, nil, err
		}
		data, err := readInto(f, buf[:0], before.Size())
		if err != nil {
			return nil, nil, err
		}
		after, err := os.Stat(f)
		if err != nil {
			return nil, nil, err
		}
		if after.Size() == before.Size() && after.ModTime().Equal(before.ModTime()) && int64(len(data)) == after.Size() {
			return data, after, nil
		}
	}
	return nil, nil, ErrChangedWhileRead
}

// readInto reads the file into buf (reused between reads: a 10k-Service
// file is 8 MB, and a new buffer per reload was most of what a reload
// allocated), growing it as needed; size is what stat said.
func readInto(path string, buf []byte, size int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	if int64(cap(buf)) < size+1 {
		buf = make([]byte, 0, size+512) // room to see it end (or grow) past what stat said
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := fh.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (o *Objects) count() int { return len(o.Services) + len(o.EndpointSlices) + len(o.Endpoints) }

// ParseManifest decodes one file's content; name is used in errors only.
func ParseManifest(name string, data []byte) (*Objects, error) {
	objs := newObjects()
	if errs := objs.decode(name, data, nil); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return objs, nil
}

type typeMeta struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Items      []json.RawMessage `json:"items"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// DocCache remembers decoded documents by content, so that a reload
// re-decodes only the documents that changed: decoding YAML is what makes
// a reload of thousands of services slow. Only documents that decoded
// cleanly into one object are kept; it holds what the last load saw.
type DocCache struct {
	// Documents are keyed by two fast hashes of their text (maphash,
	// ~10x SHA-256's speed) under two secret seeds made at the first
	// load: 128 bits no one outside the process can aim at, so a hit is
	// taken without comparing the text, and the text is not kept. (The
	// compare read a second, scattered copy of every document: a quarter
	// of a reload of a 10k-Service file, and 8 MB of resident memory.)
	seeds  [2]maphash.Seed
	seeded bool
	// docs outlive a load, each stamped with the last load that found it
	// (gen), and those no load found since are dropped when they are as
	// many as the live ones: rebuilt per load, it was 20k inserts per
	// reload at 10k Services. gen counts the loads.
	docs map[docKey]*docEntry
	gen  uint64
	// sweepSlack is how many more dropped documents than live ones are
	// kept before a sweep (0: 256); sweeps counts the sweeps, for tests.
	sweepSlack, sweeps int
	// origins are where each object was found, kept as docs are.
	origins origins
	// files remembers, per file read whole and cleanly, its identity and
	// what its documents gave, so that a file whose identity has not
	// changed is not read again (a directory of 10k files was 60k
	// syscalls per reload). It and slots are updated in place: a load
	// changes the entries of the files it reads, and forget drops those
	// of files gone from the listing (made anew each load, they were 20k
	// map inserts per reload at 10k files). paths are the last load's file
	// paths, sorted.
	files map[string]*fileState
	paths []string
	// now is the clock of the reads (time.Now when nil).
	now func() time.Time
	// node is the node the cached slices mark endpoints Local for
	// (forNode); see forNode.
	node string
	// ignoreNodeHints: the cached slices were decoded without their node
	// hints; see forNode.
	ignoreNodeHints bool
	// reads, stats, listings and patched count the files read and
	// stat'ed, the directory listings and the names patched into the last
	// one, for tests.
	reads, stats, listings, patched int
	services, slices                int // of the last load, to size the next one's lists
	// pending is decode's list of cached documents to add, kept for the
	// next file's.
	pending []pendingAdd
	// slots keeps each file's documents by place.
	slots map[string][]docSlot
	buf   []byte // the read buffer, reused
	// Touched, when set, reports whether the watch saw an event for a
	// file of a directory since the file was last read; nil (no watch,
	// or one that may have missed events) means every file is stat'ed.
	// inotify reports every write, rename and attribute change made in a
	// watched directory after it has been made, so a file whose last
	// event came before the read that recorded it is as it was read.
	Touched func(file string) bool
	// SameListing, with Touched, says that the watch saw no file made,
	// removed or renamed in the directory since the last load listed it,
	// so that listing (paths) is taken again instead of reading the
	// directory.
	SameListing bool
	// Renamed, with Touched, are the paths the watch saw made, removed or
	// renamed since the last load listed the directory, when nothing else
	// may have changed the listing: the last listing is patched with them
	// (a listing of 10k entries was most of an editor's save by rename).
	Renamed []string
	// symlinks counts the manifest files of the last listing that are
	// not regular files (symbolic links to them).
	symlinks int
	// last is what the last load found when it was clean (nil when it
	// was not), for the next one to carry (see Objects.fast); baseGen
	// is the oldest load whose origin entries still mark where a live
	// object is: every object found since was claimed by it or a later
	// load, or carried.
	last    *lastLoad
	baseGen uint64
	// carried counts the documents loads carried at their places, moved
	// those carried to new places, carriedFiles the files carried whole,
	// and aborts the carrying loads made again, for tests.
	carried, carriedFiles, aborts, moved int
}

// abandon makes a new load of an aborted carrying one, to be made again.
// What it recorded of the files it read is true of them (their identity,
// the decodings and keys of their documents): the load made again reads
// them again, or replays them, claiming every object.
func (c *DocCache) abandon() {
	c.gen++
	c.origins.gen = c.gen
	c.aborts++
}

// docSlot is the doc-th document of a file as the last load saw it:
// when it decoded into one object, its decoding, which a document with
// the same text at the same place takes without a map look-up.
type docSlot struct {
	key docKey
	e   *docEntry // nil when the place held no cacheable document
	// docLen and sepLen are the lengths of the document's text and of
	// the separator line that ended it (0: none, the file's end), for a
	// load to find the same text at the same place without splitting the
	// file again (carries); docLen is 0 when they did not fit.
	docLen uint32
	sepLen uint16
	kind   uint8 // e's object's kind
}

// shadowSlot is a slot of the last load's, at, kept while its place is
// written over (decode).
type shadowSlot struct {
	at   int
	slot docSlot
}

// carryWindow is how many slots past the cursor a carrying load looks
// for the next document: a cut of up to that many documents is carried
// past.
const carryWindow = 8

// findCarried returns the first slot of the last load's, from oi and at
// most carryWindow past it, whose document data at pos is, and where the
// next document starts.
func (c *DocCache) findCarried(data []byte, pos int, at func(int) *docSlot, oi, n int) (j, next int, ok bool) {
	for j = oi; j < n && j <= oi+carryWindow; j++ {
		if next, ok = c.carries(data, pos, at(j)); ok {
			return j, next, true
		}
	}
	return 0, 0, false
}

// carries reports whether data at pos is the document sl holds, ended as
// it was, and where the next document starts. Text equal to a document's
// splits as it did (the split looks at nothing before a document's
// start), so it is taken as that document without a look for the next
// separator.
func (c *DocCache) carries(data []byte, pos int, sl *docSlot) (next int, ok bool) {
	if sl.e == nil || sl.docLen == 0 {
		return 0, false
	}
	end := pos + int(sl.docLen)
	next = end + int(sl.sepLen)
	if next > len(data) {
		return 0, false
	}
	if sl.sepLen == 0 {
		if end != len(data) {
			return 0, false // more text after what was the last document
		}
	} else if !separatorLine(data[end:next], next == len(data)) {
		return 0, false
	}
	// One of the key's two hashes, for text of the same length at the
	// same place: odds of a false match of 2^-64 a document, under a seed
	// no one outside the process knows to aim at, for half the hashing
	// (the hashing was half of a reload of a 10k-Service file).
	if maphash.Bytes(c.seeds[0], data[pos:end]) != sl.key[0] {
		return 0, false
	}
	return next, true
}

// separatorLine reports whether line is one whole line that ends a
// document as yamlDocuments reads it ("---", then blanks or a comment),
// the file's last line when atEnd.
func separatorLine(line []byte, atEnd bool) bool {
	if len(line) == 4 && line[0] == '-' && line[1] == '-' && line[2] == '-' && line[3] == '\n' {
		return true // the usual one, without a call per document
	}
	if !bytes.HasPrefix(line, []byte("---")) {
		return false
	}
	if i := bytes.IndexByte(line, '\n'); i != len(line)-1 && (i >= 0 || !atEnd) {
		return false
	}
	rest := bytes.TrimSpace(line[3:])
	return len(rest) == 0 || rest[0] == '#'
}

// place is where a load found a document: its file and its number there
// ("file#N"), or, with doc 0, a place given whole in file (a List's
// item). It is made a string only when one is asked for (an error,
// Origin): a string kept per document was about 100 B of each Service
// held at 10k.
type place struct {
	file string
	doc  int
}

func (p place) String() string {
	if p.doc == 0 {
		return p.file
	}
	return p.file + "#" + strconv.Itoa(p.doc)
}

// pendingAdd is a cached document found at the doc-th place of a file,
// to be added (see decode).
type pendingAdd struct {
	doc int
	e   *docEntry
	// from, when not 0, is the place the document was carried from
	// (carryMoved), and kind and i its object's in the last load's lists.
	from int
	kind uint8
	i    int32
}

// docEntry is a document's decoding as the cache keeps it.
type docEntry struct {
	cachedDoc
	gen uint64 // the last load that found it
}

// docKey is a document's text hashed under the cache's two seeds.
type docKey [2]uint64

// forNode makes the cache's slices those of the node named nodeName, with
// or without their node hints: a cache of another node's, or decoded the
// other way, is emptied first (neither changes for a source; this keeps a
// cache from ever handing a slice to the wrong one).
func (c *DocCache) forNode(nodeName string, ignoreNodeHints bool) {
	if c.node != nodeName || c.ignoreNodeHints != ignoreNodeHints {
		*c = DocCache{node: nodeName, ignoreNodeHints: ignoreNodeHints}
	}
}

// slotsOf returns file's document slots as the last load left them, to
// be this load's (decode stores them again).
func (c *DocCache) slotsOf(file string) []docSlot { return c.slots[file] }

// forget drops the records and slots of the files a load does not list:
// those of lastPaths (the last listing, when this one is new) not in
// files (both sorted), or, for a path that is a file, every other one.
func (c *DocCache) forget(files, lastPaths []string, isDir bool) {
	if !isDir {
		for f := range c.slots {
			if f != files[0] {
				delete(c.slots, f)
				delete(c.files, f)
			}
		}
		return
	}
	for _, p := range lastPaths {
		for len(files) > 0 && files[0] < p {
			files = files[1:]
		}
		if len(files) == 0 || files[0] != p {
			delete(c.files, p)
			delete(c.slots, p)
		}
	}
}

// slot extends ss to the doc-th document's slot and returns it.
func slot(ss []docSlot, doc int) ([]docSlot, *docSlot) {
	for len(ss) < doc {
		ss = append(ss, docSlot{})
	}
	return ss, &ss[doc-1]
}

// quiet returns the record of a file of a directory that the watch saw no
// event for since it was read (Touched), so that it is taken as it was
// without a stat: at 10k files a stat each was most of a reload. It is
// nil when there is no such record or no watch to vouch for it.
func (c *DocCache) quiet(file string) *fileState {
	if c == nil || c.Touched == nil || c.Touched(file) {
		return nil
	}
	return c.files[file]
}

// fileState is what a file held when last read: its identity, when it was
// read, and the objects and skipped kinds its documents gave.
type fileState struct {
	id     fileID
	readAt time.Time
	// docs are the file's document slots as this read left them (the
	// cache's own, not a copy: a 20k-document file's copy was 1.7 MB of
	// each reload's garbage); those with no object (e nil) gave
	// none. They change only when the file is read again, and then this
	// record is replaced.
	docs    []docSlot
	objects int // the objects the documents gave
	// starts are where the objects of each kind the documents gave start
	// in the lists of the last load that found them, and counts how many
	// there are.
	starts, counts [3]int32
	skipped        []skippedDoc
	emptyLists     int
}

// nodeDoc is where a file's document gave this node's Node object, and
// what a proxy reads of it.
type nodeDoc struct {
	at   place
	node *corev1.Node
}

// skippedDoc is a document that gave no object to build: one of a kind
// sluice skips (gv), or, when node is set, this node's Node object. (The
// Node is kept here rather than in fileState, which every file has: a
// pointer field more there, 176 to 184 bytes and the 192-byte size class,
// made an edit's reload of a directory of 10k files take about twice as
// long, measured: bench/latest-manifest-churn/node-record-size.txt.)
type skippedDoc struct {
	gv, where string
	node      *nodeDoc
}

// unchanged reports whether the file, as stat says it is now, is what
// was read: the same identity, and last changed well before it was read
// (a change within the clock's granularity of the read might not show in
// its times: git's "racy" case).
func (f *fileState) unchanged(id fileID) bool {
	return id == f.id && id.changed.Before(f.readAt.Add(-racyWindow))
}

// racyWindow is how long before a read a file must have last changed for
// its times to be trusted.
const racyWindow = time.Second

type cachedDoc struct {
	id     string
	obj    any          // *Service, *corev1.Endpoints or *Slice; never mutated
	origin *originEntry // id's entry in the origins it was decoded with
}

// origins map each object's id to where a load found it. Entries are
// stamped with the load (gen) and outlive it, so that a document's
// decoding can keep its object's entry and claim it with no look-up.
type origins struct {
	m   map[string]*originEntry
	gen uint64 // the load whose entries count; stale ones are swept
	// names are the namespaces and port names the objects share, each a
	// copy of its own (see name); at most maxSharedNames.
	names map[string]string
}

// maxSharedNames bounds origins.names: names past it are copied each.
const maxSharedNames = 1 << 14

// name is s as the loads keep it: one copy shared by every object that
// names it, never the decoded object's own string, whose span would keep
// the room of all the garbage decoded beside it (a document's decoding is
// garbage once its object is built).
func (o *origins) name(s string) string {
	if s == "" {
		return ""
	}
	if v, ok := o.names[s]; ok {
		return v
	}
	v := strings.Clone(s)
	if len(o.names) < maxSharedNames {
		if o.names == nil {
			o.names = map[string]string{}
		}
		o.names[v] = v
	}
	return v
}

type originEntry struct {
	at  place
	gen uint64
}

// newObjects is an empty load with origins of its own.
func newObjects() *Objects {
	return &Objects{origin: &origins{m: map[string]*originEntry{}, gen: 1}, gen: 1}
}

// entry returns id's entry, made if there is none.
func (o *origins) entry(id string) *originEntry {
	e := o.m[id]
	if e == nil {
		e = &originEntry{}
		o.m[id] = e
	}
	return e
}

// claim records that load gen found the entry's object at at; when
// this load has already found it, it returns the place it found it first.
func (e *originEntry) claim(at place, gen uint64) (first place, dup bool) {
	if e.gen == gen {
		return e.at, true
	}
	e.at, e.gen = at, gen
	return place{}, false
}

// sweep drops the entries no load found since gen.
func (o *origins) sweep(gen uint64) {
	for id, e := range o.m {
		if e.gen != gen {
			delete(o.m, id)
		}
	}
}

func (c *DocCache) begin() {
	if c != nil {
		if !c.seeded {
			c.seeds, c.seeded = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, true
		}
		if c.docs == nil {
			c.docs = map[docKey]*docEntry{}
			c.origins.m = map[string]*originEntry{}
		}
		c.gen++
		c.origins.gen = c.gen
		if c.files == nil {
			c.files = map[string]*fileState{}
			c.slots = map[string][]docSlot{}
		}
	}
}

// end finishes a load: what it kept (files, slots) refers only to
// documents and origins it found, so those it did not find may go.
func (c *DocCache) end() {
	if c != nil {
		live := 0
		for _, ss := range c.slots {
			for _, d := range ss {
				if d.e != nil {
					live++
				}
			}
		}
		slack := c.sweepSlack
		if slack == 0 {
			slack = 256
		}
		if len(c.docs) > 2*live+slack || len(c.origins.m) > 2*live+slack {
			c.sweeps++
			// What a carrying load carried is live but unstamped.
			for _, ss := range c.slots {
				for _, d := range ss {
					if d.e != nil {
						d.e.gen, d.e.origin.gen = c.gen, c.gen
					}
				}
			}
			for k, e := range c.docs {
				if e.gen != c.gen {
					delete(c.docs, k)
				}
			}
			c.origins.sweep(c.gen)
		}
	}
}

func (c *DocCache) clock() time.Time {
	if c == nil || c.now == nil {
		return time.Now()
	}
	return c.now()
}

// key hashes a document's text.
func (c *DocCache) key(raw []byte) docKey {
	return docKey{maphash.Bytes(c.seeds[0], raw), maphash.Bytes(c.seeds[1], raw)}
}

// lookup returns the cached decoding of the text whose key it is, if
// any, stamped as found by this load.
func (c *DocCache) lookup(key docKey) *docEntry {
	e := c.docs[key]
	if e != nil {
		e.gen = c.gen
	}
	return e
}

func (o *Objects) decode(file string, data []byte, cache *DocCache) []error {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if cache == nil || len(trimmed) == 0 || trimmed[0] == '{' || trimmed[0] == '[' {
		return o.decodeStream(file, data)
	}
	// YAML: split into documents, and decode only the ones not seen before.
	// The slots are this load's up to the last document read, no further:
	// a slot past the end would keep a decoding no load finds any more.
	var errs []error
	ss := cache.slotsOf(file)
	split := yamlDocuments{data: data}
	// The cached documents found are added in a pass of their own, run
	// before anything else a document gives and at the end: adding one
	// reads its decoding and its origin, two places in memory that an
	// edit's read of the file has pushed out of the caches. Done in a
	// short loop, many such reads are under way at once; done between
	// the splitting and hashing of the next documents, one at a time
	// (at 10k Services in one file, the adds were half of an edit's
	// reload in a running sluice).
	pending := cache.pending[:0]
	addPending := func() {
		for _, p := range pending {
			if p.from != 0 {
				errs = append(errs, o.carryMoved(place{file, p.doc}, place{file, p.from}, p.e, p.kind, p.i)...)
				continue
			}
			p.e.gen = cache.gen
			errs = append(errs, o.add(place{file, p.doc}, p.e)...)
		}
		if o.rec != nil {
			o.rec.objects += len(pending)
		}
		clear(pending) // the list is kept for the next file's: it must keep no decoding alive
		pending = pending[:0]
	}
	// Carrying (see Objects.fast), the last load's slots of the file are
	// read in order (last, from the cursor oi), and old are where the
	// object of each kind of the slot at oi is in the last load's lists: a
	// document found again as it was is that object. At a document not
	// found, the cursor stays (it may have been inserted); the next found
	// may be a few slots on (those between were replaced or cut), so the
	// documents after an insert or a cut are found too, at new places.
	var old [3]int32
	st := cache.files[file]
	carry := o.fast && st != nil
	if carry {
		old = st.starts
	}
	last, oi := ss, 0
	// shadow keeps, in order of place, last's slots written over (last
	// shares ss's array) before the cursor passed them: those of the
	// documents after an insert, a few at a time.
	var shadow []shadowSlot
	lastAt := func(j int) *docSlot {
		if len(shadow) > 0 && j >= shadow[0].at {
			if k, ok := slices.BinarySearchFunc(shadow, j, func(s shadowSlot, j int) int { return s.at - j }); ok {
				return &shadow[k].slot
			}
		}
		return &last[j]
	}
	// writing is told before slot doc is written.
	writing := func(doc int) {
		if carry && doc-1 >= oi && doc-1 < len(last) {
			shadow = append(shadow, shadowSlot{doc - 1, last[doc-1]})
		}
	}
	doc := 1
	for ; ; doc++ {
		if carry && oi < len(last) {
			var j, next int
			var ok bool
			if len(shadow) == 0 { // the usual: the next slot, nothing written over
				j = oi
				next, ok = cache.carries(data, split.pos, &last[oi])
			}
			if !ok {
				j, next, ok = cache.findCarried(data, split.pos, lastAt, oi, len(last))
			}
			if ok {
				for ; oi < j; oi++ {
					if s := lastAt(oi); s.e != nil {
						old[s.kind-1]++ // replaced or cut: not this load's
					}
				}
				var s docSlot
				if len(shadow) == 0 {
					s = last[oi] // no call per document in the usual case
				} else {
					s = *lastAt(oi)
				}
				oi++
				for len(shadow) > 0 && shadow[0].at < oi {
					shadow = shadow[1:]
				}
				if doc == oi { // at its place
					addPending() // first, in the order of the file
					o.carryOne(s.kind, old[s.kind-1])
					cache.carried++
					if o.rec != nil {
						o.rec.objects++
					}
				} else {
					// Claimed at its new place with the pending adds, many
					// entries read at once (one at a time, a cache miss
					// each, they were half of a reload that moved every
					// document).
					writing(doc)
					var sl *docSlot
					ss, sl = slot(ss, doc)
					*sl = s
					pending = append(pending, pendingAdd{doc: doc, e: s.e, from: oi, kind: s.kind, i: old[s.kind-1]})
					cache.moved++
				}
				old[s.kind-1]++
				split.pos = next
				if o.aborted {
					break
				}
				continue
			}
		}
		raw, err := split.next()
		if err == io.EOF {
			break
		}
		var sl *docSlot
		writing(doc)
		ss, sl = slot(ss, doc)
		at := place{file, doc}
		// Where the text was, for the next load to find it again (a text
		// whose line ends were rewritten hashes unlike the file's bytes, so
		// it is never carried).
		sl.docLen, sl.sepLen = 0, 0
		if n := split.end - split.last; n < 1<<32 && split.pos-split.end <= 0xffff {
			sl.docLen, sl.sepLen = uint32(n), uint16(split.pos-split.end)
		}
		if err != nil {
			sl.e = nil
			addPending()
			errs = append(errs, &ManifestError{File: at.String(), Err: fmt.Errorf("malformed YAML: %w", err)})
			doc++
			break
		}
		key := cache.key(raw)
		var e *docEntry
		if sl.e != nil && sl.key == key {
			// The same text at the same place: no map look-up (most of a
			// 10k-Service file's reload was look-ups).
			e = sl.e
		} else {
			e = cache.lookup(key)
		}
		if e != nil {
			sl.key, sl.e, sl.kind = key, e, kindOf(e.obj)
			if o.unsure(e.origin, at) {
				o.aborted = true // found early: the load is made again (a document moved)
				break
			}
			pending = append(pending, pendingAdd{doc: doc, e: e})
			continue
		}
		sl.e = nil
		addPending()
		o.decoded += int64(len(raw))
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			// Lines counted in the file, not the document (an editor's
			// line 55, not the third document's line 15).
			err = fileLines(err, bytes.Count(data[:split.last], []byte("\n")))
			errs = append(errs, &ManifestError{File: at.String(), Err: fmt.Errorf("malformed YAML/JSON: %w", err)})
			continue // the reader split the documents, so the next one is still readable
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
			continue
		}
		derrs, dc := o.decodeObject(at, js)
		if dc != nil {
			// Nothing cached points into the file's buffer, which the
			// next read overwrites.
			e := &docEntry{cachedDoc: *dc, gen: cache.gen}
			cache.docs[key] = e
			sl.key, sl.e, sl.kind = key, e, kindOf(e.obj)
			if o.rec != nil {
				o.rec.objects++
			}
		}
		errs = append(errs, derrs...)
	}
	addPending()
	cache.pending = pending[:0]
	ss = ss[:min(len(ss), doc-1)]
	cache.slots[file] = ss
	if o.rec != nil {
		o.rec.docs = ss
	}
	return errs
}

// yamlDocuments splits a YAML stream into its documents where
// k8s.io/apimachinery's YAMLReader would, documents and errors alike (a
// line that starts with "---" ends a non-empty document, and may be
// followed only by blanks or a comment), but hands out sub-slices of the
// data instead of copying it line by line: a reload of thousands of
// services spent most of its splitting time copying.
type yamlDocuments struct {
	data []byte
	pos  int
	last int // where the document next returned starts
	end  int // and where its text ends (its separator line, if any, starts)
}

// yamlLine is the "line N" a YAML error names, relative to its document.
var yamlLine = regexp.MustCompile(`\bline (\d+)\b`)

// fileLines turns a document's line numbers in err into the file's: the
// document starts after offset lines of the file.
func fileLines(err error, offset int) error {
	if offset == 0 {
		return err
	}
	msg := yamlLine.ReplaceAllStringFunc(err.Error(), func(m string) string {
		n, _ := strconv.Atoi(m[len("line "):])
		return fmt.Sprintf("line %d", n+offset)
	})
	return errors.New(msg)
}

func (y *yamlDocuments) next() ([]byte, error) {
	start := y.pos
	for y.pos < len(y.data) {
		// Only a line that starts with "---" can end a document, so the
		// scan jumps from one "---" to the next and skips those inside a
		// line (y.pos is always at a line's start), rather than walking
		// every line: at 10k Services in one file (9 MB) that walk was a
		// third of an edit's reload.
		lineStart := y.pos
		if !bytes.HasPrefix(y.data[lineStart:], []byte("---")) {
			i := bytes.Index(y.data[lineStart+1:], []byte("---"))
			for i >= 0 && y.data[lineStart+i] != '\n' {
				lineStart += i + 1
				i = bytes.Index(y.data[lineStart+1:], []byte("---"))
			}
			if i < 0 {
				y.pos = len(y.data)
				break
			}
			lineStart += i + 1
		}
		end := bytes.IndexByte(y.data[lineStart:], '\n')
		if end < 0 {
			y.pos = len(y.data)
		} else {
			y.pos = lineStart + end + 1
		}
		line := y.data[lineStart:y.pos]
		if rest := bytes.TrimSpace(line[3:]); len(rest) > 0 && rest[0] != '#' {
			return nil, fmt.Errorf("invalid Yaml document separator: %s", rest)
		}
		if lineStart > start {
			y.last, y.end = start, lineStart
			return lineEnds(y.data[start:lineStart]), nil
		}
		// A separator that would end an empty document opens the next one
		// instead (YAMLReader keeps it in that document's text).
	}
	if y.pos > start {
		y.last, y.end = start, y.pos
		doc := lineEnds(y.data[start:y.pos:y.pos])
		if doc[len(doc)-1] != '\n' {
			// YAMLReader ends the last line with a newline, which a block
			// scalar keeps; copy rather than write into the caller's data.
			doc = append(doc, '\n')
		}
		return doc, nil
	}
	return nil, io.EOF
}

// lineEnds ends every line with "\n" alone, as YAMLReader's line reader
// does (bufio's ReadLine drops one "\r" before each "\n"), copying only a
// document that has "\r\n" in it. It matters where a line ends "\r\r\n":
// YAML then reads the remaining "\r" as a line break (found by
// FuzzYAMLSplitMatchesYAMLReader).
func lineEnds(doc []byte) []byte {
	if !bytes.Contains(doc, []byte("\r\n")) {
		return doc
	}
	return bytes.ReplaceAll(doc, []byte("\r\n"), []byte("\n"))
}

// decodeStream decodes YAML or a JSON stream without the cache.
func (o *Objects) decodeStream(file string, data []byte) []error {
	o.decoded += int64(len(data))
	var errs []error
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for doc := 1; ; doc++ {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if err == io.EOF {
			break
		}
		at := place{file, doc}
		if err != nil {
			errs = append(errs, &ManifestError{File: at.String(), Err: fmt.Errorf("malformed YAML/JSON: %w", err)})
			break // the decoder cannot resynchronise after a syntax error
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
			continue // an empty document, e.g. a trailing ---
		}
		derrs, _ := o.decodeObject(at, raw)
		errs = append(errs, derrs...)
	}
	return errs
}

// add records one decoded object, refusing a second object of the same
// kind, namespace and name.
func (o *Objects) add(at place, c *docEntry) []error {
	if o.unsure(c.origin, at) {
		o.aborted = true
	}
	if first, dup := c.origin.claim(at, o.gen); dup {
		return []error{&ManifestError{File: at.String(), Object: c.id, Field: "metadata.name", Err: fmt.Errorf("duplicate object, first defined in %s", first)}}
	}
	switch obj := c.obj.(type) {
	case *Service:
		o.Services = append(o.Services, obj)
	case *Slice:
		o.EndpointSlices = append(o.EndpointSlices, obj)
	default:
		//lint:ignore SA1019 v1 Endpoints are read on purpose, for older manifests
		o.Endpoints = append(o.Endpoints, obj.(*corev1.Endpoints))
	}
	return nil
}

// carryMoved adds the document c of the last load's place from found at
// at, the i-th object of its kind in the last load's lists, and claims
// it at its new place. Its origin names from (ids were unique at the last
// clean load), so no carried document holds it, and one claimed in this
// load has stamped it: then it is added as any document is, a duplicate.
// (The check of from itself only guards that invariant: when it fails,
// the add makes the load again.)
func (o *Objects) carryMoved(at, from place, c *docEntry, kind uint8, i int32) []error {
	if e := c.origin; e.gen != o.gen && e.at == from {
		e.at, e.gen = at, o.gen
		o.carryOne(kind, i)
		return nil
	}
	return o.add(at, c)
}

// unsure reports whether a carrying load cannot claim e at at: its object
// was found elsewhere since the load that last claimed every object, and
// that document may have been carried (then this is a duplicate) or may
// be gone (a move). Only a load that claims every object can tell, so the
// load is made again as one.
func (o *Objects) unsure(e *originEntry, at place) bool {
	return o.fast && e.gen != o.gen && e.gen >= o.baseGen && e.at != at
}

// decodeObject decodes one document. It returns the object as a cacheable
// entry when the document held exactly one valid object.
func (o *Objects) decodeObject(at place, raw json.RawMessage) ([]error, *cachedDoc) {
	var tm typeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return []error{&ManifestError{File: at.String(), Err: fmt.Errorf("not a Kubernetes object: %w", err)}}, nil
	}
	ns := tm.Metadata.Namespace
	if ns == "" {
		ns = corev1.NamespaceDefault
	}
	id := fmt.Sprintf("%s %s/%s", tm.Kind, ns, tm.Metadata.Name)
	fail := func(field string, err error) ([]error, *cachedDoc) {
		return []error{&ManifestError{File: at.String(), Object: id, Field: field, Err: err}}, nil
	}
	// As the API server decodes (case-sensitive, strict): an unknown or
	// repeated field is named by its path in the object.
	strict := func(into any) []error {
		serrs, err := kjson.UnmarshalStrict(raw, into, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err != nil {
			return []error{&ManifestError{File: at.String(), Object: id, Err: fmt.Errorf("invalid %s: %w", tm.Kind, err)}}
		}
		var errs []error
		for _, se := range serrs {
			field, what := strictField(se.Error())
			errs = append(errs, &ManifestError{File: at.String(), Object: id, Field: field, Err: errors.New(what)})
		}
		return errs
	}
	gv := tm.APIVersion + "/" + tm.Kind
	switch gv {
	case "v1/List":
		if len(tm.Items) == 0 {
			o.emptyLists++
		}
		var errs []error
		for i, item := range tm.Items {
			ierrs, _ := o.decodeObject(place{file: fmt.Sprintf("%s items[%d]", at, i)}, item)
			errs = append(errs, ierrs...)
		}
		return errs, nil
	case "v1/Service", "v1/Endpoints", "discovery.k8s.io/v1/EndpointSlice":
	case "v1/Node":
		if o.node == "" || tm.Metadata.Name != o.node { // o.node is "" unless forNode
			if o.node != "" {
				gv += " (of another node than " + o.node + ")"
			}
			o.skipDoc(gv, at)
			return nil, nil
		}
		id = "Node " + o.node // cluster-scoped
		node := &corev1.Node{}
		if errs := strict(node); errs != nil {
			return errs, nil
		}
		return o.ownNode(at, proxyNode(node)), nil
	default:
		if leftAlone(tm.APIVersion, tm.Kind) {
			o.skipDoc(gv, at)
			return nil, nil
		}
		if tm.Kind == "" {
			return fail("kind", errors.New("missing kind"))
		}
		if tm.APIVersion == "" {
			return fail("apiVersion", errors.New("missing apiVersion"))
		}
		return fail("", fmt.Errorf("unknown kind %q in apiVersion %q: want v1 Service, v1 Endpoints or discovery.k8s.io/v1 EndpointSlice", tm.Kind, tm.APIVersion))
	}
	if tm.Metadata.Name == "" {
		return fail("metadata.name", errors.New("required"))
	}
	origin := o.origin.entry(id)
	if origin.gen == o.gen {
		return fail("metadata.name", fmt.Errorf("duplicate object, first defined in %s", origin.at))
	}
	if o.unsure(origin, at) {
		// A carried document elsewhere may hold this id, unclaimed: a
		// duplicate the check above cannot see, whose error a cold load
		// gives before this document's own (found by
		// FuzzCarriedLoadsMatchColdLoads). The load is made again.
		o.aborted = true
		return nil, nil
	}
	var obj any
	switch gv {
	case "v1/Service":
		svc := &corev1.Service{}
		if errs := strict(svc); errs != nil {
			return errs, nil
		}
		svc.Namespace = o.origin.name(ns)
		for i := range svc.Spec.Ports {
			svc.Spec.Ports[i].Name = o.origin.name(svc.Spec.Ports[i].Name)
		}
		obj = NewService(svc) // what the build reads; the decoded Service is garbage now
	case "v1/Endpoints":
		//lint:ignore SA1019 v1 Endpoints are read on purpose, for older manifests
		ep := &corev1.Endpoints{}
		if errs := strict(ep); errs != nil {
			return errs, nil
		}
		ep.Namespace = ns
		obj = ep
	default:
		sl := &discoveryv1.EndpointSlice{}
		if errs := strict(sl); errs != nil {
			return errs, nil
		}
		sl.Namespace = o.origin.name(ns)
		for i, p := range sl.Ports {
			if p.Name != nil {
				name := o.origin.name(*p.Name)
				sl.Ports[i].Name = &name
			}
		}
		if o.ignoreNodeHints {
			DropNodeHints(sl)
		}
		if o.forNode {
			obj = NewSliceFor(sl, o.node) // what the build reads; the decoded slice is garbage now
		} else {
			obj = NewSlice(sl) // keeps sl, to be parsed again for any node
		}
	}
	c := docEntry{cachedDoc: cachedDoc{id: id, obj: obj, origin: origin}}
	return o.add(at, &c), &c.cachedDoc
}

// Origin returns where this load found an object ("Kind ns/name"), or "".
func (o *Objects) Origin(id string) string {
	e := o.origin.m[id]
	if e == nil || e.gen != o.gen && !(o.fast && e.gen >= o.baseGen && o.holds(e)) {
		return ""
	}
	return e.at.String()
}

// holds reports whether the document at e's place in this load is e's
// object's: an entry a carrying load did not claim is live only where
// its document was carried.
func (o *Objects) holds(e *originEntry) bool {
	ss := o.slots[e.at.file]
	d := e.at.doc
	return d >= 1 && d <= len(ss) && ss[d-1].e != nil && ss[d-1].e.origin == e
}

// strictField splits a strict decoding error (`unknown field "spec.portz"`,
// `duplicate field "metadata.name"`) into the field's path and what is
// wrong with it; another error is returned whole.
func strictField(msg string) (field, what string) {
	for _, kind := range []string{"unknown field", "duplicate field"} {
		if rest, ok := strings.CutPrefix(msg, kind+" "); ok {
			if path, err := strconv.Unquote(rest); err == nil {
				return path, kind + " (kubectl apply refuses it too)"
			}
		}
	}
	return "", msg
}
